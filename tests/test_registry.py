"""The engine's registry of open worktrees (engine/registry.py), called directly on real folders."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
from repo_helpers import git, init_repo, write

from snapshotd.contract.refs import WorktreeRef
from snapshotd.engine.registry import Registry, recorded_wire, worktree_head
from snapshotd.errors import InvalidParams, NotFound, SnapshotdError, WorktreeMismatch
from snapshotd.settings import DEFAULT_SIZE_CAP
from snapshotd.store.identity import Records


def new_registry(home: Path) -> Registry:
    """A registry over the records under ``home`` that watches nothing."""
    return Registry(
        Records(home), Counter(), DEFAULT_SIZE_CAP, nursery=None, watch=False, on_change=lambda *change: None
    )


def test_one_worktree_opened_from_anywhere_inside_is_one_state(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"), ("sub/b.txt", "b\n"))
    registry = new_registry(tmp_path / "home")
    top = registry.open_path(str(repo))
    inner = registry.open_path(str(repo / "sub"))
    assert inner is top
    assert list(registry.worktrees) == [top.info.id]
    assert registry.by_id(top.info.id) is top


def test_a_fresh_registry_finds_a_recorded_worktree_by_id(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    first = new_registry(tmp_path / "home").open_path(str(repo))
    again = new_registry(tmp_path / "home").by_id(first.info.id)
    assert again.info.id == first.info.id and again.info.path == str(repo)


def test_a_moved_worktree_by_its_old_id_says_to_run_repair(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    write(folder / "a.txt", "a\n")
    state = new_registry(tmp_path / "home").open_path(str(folder))
    os.rename(folder, tmp_path / "elsewhere")
    with pytest.raises(NotFound) as caught:
        new_registry(tmp_path / "home").by_id(state.info.id)
    assert "snapshotd repair" in caught.value.message
    with pytest.raises(NotFound):
        new_registry(tmp_path / "home").by_id("wt_0000000000000000")


async def test_resolve_takes_a_path_or_an_id_and_refuses_both_disagreeing(tmp_path: Path) -> None:
    one = init_repo(tmp_path / "one", ("a.txt", "a\n"))
    two = init_repo(tmp_path / "two", ("b.txt", "b\n"))
    registry = new_registry(tmp_path / "home")
    by_path = await registry.resolve(WorktreeRef(path=str(one)))
    assert by_path.info.path == str(one)
    assert await registry.resolve(WorktreeRef(id=by_path.info.id)) is by_path
    assert await registry.resolve_named(WorktreeRef(path=str(one / "."), id=by_path.info.id)) is by_path
    other = await registry.resolve(WorktreeRef(path=str(two)))
    assert other is not by_path
    with pytest.raises(WorktreeMismatch, match=f"belongs to worktree {by_path.info.id}, not {other.info.id}"):
        await registry.resolve(WorktreeRef(path=str(one), id=other.info.id))
    with pytest.raises(InvalidParams, match="Give either 'path'"):
        await registry.resolve(WorktreeRef())
    assert await registry.resolve_named(WorktreeRef()) is None


async def test_a_broad_folder_is_opened_only_when_the_reference_forces_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home-folder"
    write(home / "notes.txt", "n\n")
    monkeypatch.setenv("HOME", str(home))
    registry = new_registry(tmp_path / "home")
    with pytest.raises(SnapshotdError, match="is your home folder"):
        await registry.resolve(WorktreeRef(path=str(home)), checkpoint=True, first_sight=True)
    assert registry.worktrees == {}
    forced = await registry.resolve(WorktreeRef(path=str(home), force=True), checkpoint=True, first_sight=True)
    assert forced.info.path == str(home) and list(registry.worktrees) == [forced.info.id]


async def test_known_states_skip_worktrees_that_are_gone(tmp_path: Path) -> None:
    kept = init_repo(tmp_path / "kept", ("a.txt", "a\n"))
    gone = tmp_path / "gone"
    write(gone / "b.txt", "b\n")
    registry = new_registry(tmp_path / "home")
    kept_state = registry.open_path(str(kept))
    registry.open_path(str(gone))
    os.rename(gone, tmp_path / "moved-away")
    states = await new_registry(tmp_path / "home").known_states()
    assert [state.info.id for state in states] == [kept_state.info.id]


async def test_the_wire_worktree_carries_head_and_branch(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    registry = new_registry(tmp_path / "home")
    state = registry.open_path(str(repo))
    wire = await registry.wire_worktree(state)
    head = git(repo, "rev-parse", "HEAD")
    branch = git(repo, "symbolic-ref", "--short", "HEAD")
    assert (wire["id"], wire["path"], wire["head"], wire["branch"]) == (state.info.id, str(repo), head, branch)
    assert wire["watching"] is False and wire["watch_error"] is None
    assert worktree_head(state.info) == (head, branch)
    plain = registry.open_path(str(write(tmp_path / "plain" / "x.txt", "x").parent))
    assert worktree_head(plain.info) == (None, None)


def test_a_recorded_worktree_removed_with_git_is_removed_and_one_deleted_by_hand_gone(tmp_path: Path) -> None:
    main = init_repo(tmp_path / "main", ("a.txt", "a\n"))
    records = {}
    for name in ("removed", "deleted"):
        git(main, "worktree", "add", "-q", "--detach", str(tmp_path / name))
        git_dir = git(tmp_path / name, "rev-parse", "--absolute-git-dir").strip()
        records[name] = {"path": str(tmp_path / name), "kind": "git", "git_dir": git_dir, "common_dir": str(main / ".git")}
    git(main, "worktree", "remove", str(tmp_path / "removed"))
    shutil.rmtree(tmp_path / "deleted")
    removed, deleted = (recorded_wire(f"wt_{name}", records[name], {}) for name in ("removed", "deleted"))
    assert (removed["presence"], deleted["presence"]) == ("removed", "gone")
    assert "removed with git" in removed["problem"] and "repair" in deleted["problem"]
