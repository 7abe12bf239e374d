"""The watch's walk on its own: every folder once, under its true path, and every descriptor it opened closed.

The walk holds the folders above it open down to ``FOLDERS_HELD`` and climbs
back through ``..`` below that; both kinds of climb are taken here, whole and
stopped part-way by the ceiling.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from snapshotd.capture.watchpaths import descend
from snapshotd.capture.watchwalk import FOLDERS_HELD, Budget, watch_tree
from snapshotd.errors import WatchGivenUp


class Table:
    """What the walk asks of a watcher, keeping the paths it was handed (no kernel watch)."""

    suspect: str | None = None

    def __init__(self) -> None:
        self.paths: list[str] = []

    def watch_folder(self, folder_fd: int, path: str) -> bool:
        assert os.path.samestat(os.fstat(folder_fd), os.stat(path, follow_symlinks=False))
        self.paths.append(path)
        return True

    def to_watch(self, folder_fd: int | None, rel: str, names: list[str], rules: bool = False) -> list[str]:
        return [name for name in names if descend(rel, name)]

    def held(self) -> int:
        return len(self.paths)


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def deep_tree(tmp_path: Path) -> tuple[Path, set[str]]:
    """A chain deeper than the folders held, with side folders along it and a link to a folder."""
    root = tmp_path / "wt"
    chain = root.joinpath(*[f"c{level}" for level in range(FOLDERS_HELD + 40)])
    chain.mkdir(parents=True)
    for level in range(0, FOLDERS_HELD + 40, 7):
        side = root.joinpath(*[f"c{index}" for index in range(level)], f"side{level}", "inner")
        side.mkdir(parents=True)
    (root / "link").symlink_to(chain)
    folders = {str(root)} | {path for path, _, _ in os.walk(root) if path != str(root)}
    return root, folders


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
def test_a_whole_walk_watches_each_folder_once_by_its_path_and_closes_what_it_opened(deep_tree):
    root, folders = deep_tree
    before = open_descriptors()
    table = Table()
    assert watch_tree(table, str(root), "", Budget(10**6)) == len(folders)
    assert sorted(table.paths) == sorted(folders)  # the link is not a folder to the walk
    assert table.suspect is None
    assert open_descriptors() == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
@pytest.mark.parametrize("ceiling", [30, FOLDERS_HELD + 20])
def test_a_walk_stopped_by_the_ceiling_closes_what_it_opened(deep_tree, ceiling):
    root, _ = deep_tree
    before = open_descriptors()
    table = Table()
    with pytest.raises(WatchGivenUp):
        watch_tree(table, str(root), "", Budget(ceiling))
    assert open_descriptors() == before
