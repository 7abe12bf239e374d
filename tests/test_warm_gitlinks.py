"""Warm captures follow the commit a submodule or nested repository has checked out.

A submodule's HEAD lives under the superproject's ``.git/modules/``, which the
watcher does not follow, and a nested repository's HEAD may move without a
file of its worktree changing: each warm capture reads every gitlink's HEAD
in-process (no process when nothing moved) and re-records the ones that moved.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from capture_helpers import assert_matches_git, checkpoint
from repo_helpers import load_fixture, tree_entries

from snapshotd.engine.core import Engine

make_odd = load_fixture("make_odd")
git = make_odd.git
write = make_odd.write


def inner_commit(sub: Path) -> None:
    write(sub / "mod.py", "mod = 'committed inside'\n")
    git(sub, "commit", "-qam", "inside")


def inner_checkout_back(sub: Path) -> None:
    git(sub, "checkout", "-q", "HEAD~1")  # detached


def inner_reset(sub: Path) -> None:
    git(sub, "reset", "-q", "--hard", "HEAD~1")  # the branch moves back


def inner_packed(sub: Path) -> None:
    git(sub, "pack-refs", "--all")
    git(sub, "checkout", "-q", "-b", "other", "HEAD~1")
    git(sub, "pack-refs", "--all")  # the branch HEAD names now lives in packed-refs only


MOVES: dict[str, Callable[[Path], None]] = {
    "commit": inner_commit,
    "checkout": inner_checkout_back,
    "reset": inner_reset,
    "packed": inner_packed,
}


def embedded(dest: Path) -> Path:
    """A worktree holding an untracked nested repository with its own ``.git`` folder."""
    repo = make_odd.base_repo(dest)
    inner = repo / "mod"
    make_odd.init(inner)
    write(inner / "mod.py", "mod = 1\n")
    make_odd.commit(inner, "module")
    write(inner / "mod.py", "mod = 2\n")
    make_odd.commit(inner, "module again")
    return repo


@pytest.mark.parametrize("move", sorted(MOVES))
@pytest.mark.parametrize("kind", ["submodule", "embedded"])
async def test_a_move_inside_a_gitlink_reaches_the_warm_capture(
    watched_engine: Engine, tmp_path: Path, kind: str, move: str
) -> None:
    repo = make_odd.build("submodule_new_commit", tmp_path / "r").worktree if kind == "submodule" else embedded(tmp_path / "r")
    first = await checkpoint(watched_engine, repo)
    assert_matches_git(repo, first)
    clean = await checkpoint(watched_engine, repo)
    assert clean["stats"]["scan"] == "watch"
    assert clean["stats"]["processes"] == 0  # reading the gitlinks' HEADs starts nothing
    MOVES[move](repo / "mod")
    moved = await checkpoint(watched_engine, repo)
    assert moved["stats"]["scan"] == "watch"
    assert moved["checkpoint"]["changed"] is True
    tree = assert_matches_git(repo, moved)
    assert tree_entries(repo, tree)["mod"][2] == git(repo / "mod", "rev-parse", "HEAD")
    again = await checkpoint(watched_engine, repo)
    assert again["checkpoint"]["changed"] is False
    assert again["stats"]["processes"] == 0


@pytest.mark.parametrize("moved", [False, True], ids=["at-its-commit", "moved-first"])
async def test_a_submodule_emptied_to_its_folder_keeps_the_users_gitlink(watched_engine: Engine, tmp_path: Path, moved: bool) -> None:
    """With nothing checked out in its folder, git keeps the gitlink of the user's index, whatever the last capture held."""
    repo = make_odd.build("submodule_new_commit" if moved else "submodule", tmp_path / "r").worktree
    users = git(repo, "rev-parse", "HEAD:mod")
    first = await checkpoint(watched_engine, repo)
    assert (tree_entries(repo, assert_matches_git(repo, first))["mod"][2] == users) is not moved
    for inner in (repo / "mod").iterdir():
        if inner.is_dir():
            shutil.rmtree(inner)
        else:
            inner.unlink()
    emptied = await checkpoint(watched_engine, repo)
    assert emptied["stats"]["scan"] == "watch"
    assert tree_entries(repo, assert_matches_git(repo, emptied))["mod"] == ("160000", "commit", users)
