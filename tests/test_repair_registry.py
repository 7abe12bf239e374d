"""``repair`` needs only a registry of worktrees (records and ``open_path``), not an engine.

A registry of a few lines, over the real records file, is enough for repair
to find a moved linked worktree and a renamed plain folder, mend git's links
and re-open each at its new place.
"""

from __future__ import annotations

import os
from pathlib import Path

from repo_helpers import git, init_repo, write

from snapshotd.engine.repair import Move, RepairResult, repair
from snapshotd.store.identity import Records, WorktreeInfo, identify, locate


class OpenedPaths:
    """A registry that identifies each worktree it is asked to open and remembers where."""

    def __init__(self, home: Path) -> None:
        self.records = Records(home)
        self.opened: list[str] = []

    def open_path(self, path: str) -> WorktreeInfo:
        info = identify(locate(path), self.records)
        self.opened.append(info.path)
        return info


async def test_repair_of_a_moved_linked_worktree_through_a_registry(tmp_path: Path) -> None:
    main = init_repo(tmp_path / "main", ("a.txt", "a\n"))
    linked = tmp_path / "linked"
    git(main, "worktree", "add", "-q", str(linked))
    registry = OpenedPaths(tmp_path / "home")
    old = registry.open_path(str(linked))
    moved = tmp_path / "moved"
    os.rename(linked, moved)
    assert f"worktree {linked}\n" in git(main, "worktree", "list", "--porcelain")  # git's back link is stale

    result = await repair(registry, str(moved))
    assert result == RepairResult([Move(old.id, str(linked), str(moved))], [(old.id, str(moved))])
    assert result.to_wire() == {
        "moved": [{"worktree": old.id, "from": str(linked), "to": str(moved)}],
        "mended": [{"worktree": old.id, "path": str(moved)}],
    }
    assert registry.opened[-1] == str(moved)
    assert registry.records.load()[old.id]["path"] == str(moved)
    listing = git(main, "worktree", "list", "--porcelain")
    assert f"worktree {moved}\n" in listing and "prunable" not in listing


async def test_repair_of_a_renamed_plain_folder_through_a_registry(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    write(folder / "notes.txt", "n\n")
    registry = OpenedPaths(tmp_path / "home")
    old = registry.open_path(str(folder))
    renamed = tmp_path / "renamed"
    os.rename(folder, renamed)

    assert (await repair(registry, str(renamed))).moved == [Move(old.id, str(folder), str(renamed))]
    assert (await repair(registry, str(renamed))).to_wire() == {"moved": [], "mended": []}  # nothing moved since
