"""Worktrees that move on disk keep their id and checkpoints; copies never share them.

After each kind of move (``git worktree move``, a plain ``mv`` of a linked
worktree, a whole repository moved with its linked worktree, a plain folder
renamed) the worktree keeps its id, ``list`` shows the old checkpoints, a
restore works at the new path, and git's own ``git worktree list`` and
``git status`` work again. A ``cp -a`` copy gets a new id.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from oracle import oracle_tree
from repo_helpers import commit_all, git, git_ok

from snapshotd.engine.core import Engine
from snapshotd.errors import NotFound, WorktreeMismatch


async def cp(engine: Engine, path: Path, **params: Any) -> dict[str, Any]:
    return (await engine.call("checkpoint", {"path": str(path), **params}))["checkpoint"]


async def wt_id(engine: Engine, path: Path) -> str:
    return (await engine.call("open", {"path": str(path)}))["worktree"]["id"]


async def listed(engine: Engine, path: Path) -> list[str]:
    """Ids of the worktree's checkpoints, newest first, without restores' safety checkpoints."""
    found = (await engine.call("list", {"path": str(path)}))["checkpoints"]
    return [c["id"] for c in found if c["session"] != "snapshotd:safety"]


def porcelain_paths(repo: Path) -> list[str]:
    """Worktree paths from ``git worktree list --porcelain``, with any prunable mark."""
    out = git(repo, "worktree", "list", "--porcelain")
    paths = []
    for block in out.split("\n\n"):
        lines = block.splitlines()
        path = next(line.split(" ", 1)[1] for line in lines if line.startswith("worktree "))
        prunable = any(line.startswith("prunable") for line in lines)
        paths.append(path + (" (prunable)" if prunable else ""))
    return paths


def git_works(path: Path) -> bool:
    return git_ok(path, "status", "--porcelain") and git_ok(path, "rev-parse", "--show-toplevel")


async def restore_works(engine: Engine, path: Path, checkpoint: dict[str, Any], rel: str) -> None:
    """Edit ``rel``, restore ``checkpoint`` by its id at ``path``, and check the result."""
    original = (path / rel).read_bytes()
    (path / rel).write_text("edited after the move\n")
    result = await engine.call("restore", {"checkpoint": checkpoint["id"], "path": str(path)})
    assert result["written"] == [rel]
    assert (path / rel).read_bytes() == original
    assert oracle_tree(path) == checkpoint["tree"]


def main_with_linked(root: Path) -> tuple[Path, Path]:
    main = root / "main"
    main.mkdir(parents=True)
    git(main, "init", "-q")
    (main / "m.txt").write_text("main file\n")
    commit_all(main, "init")
    linked = root / "linked"
    git(main, "worktree", "add", "-q", "-b", "feature", str(linked))
    (linked / "l.txt").write_text("linked work, not committed\n")
    return main, linked


# ---------------------------------------------------------------------------
# git worktrees


async def test_git_worktree_move(engine, tmp_path):
    main, linked = main_with_linked(tmp_path)
    old_id = await wt_id(engine, linked)
    checkpoint = await cp(engine, linked, session="s")
    moved = tmp_path / "moved-by-git"
    git(main, "worktree", "move", str(linked), str(moved))

    # The id is found at the new path by itself; repair reports the move.
    result = await engine.call("repair", {"path": str(moved)})
    assert result == {"moved": [{"worktree": old_id, "from": str(linked), "to": str(moved)}], "mended": [], "gone": []}
    assert await wt_id(engine, moved) == old_id
    assert await listed(engine, moved) == [checkpoint["id"]]
    assert (await engine.call("list", {"worktree": old_id}))["checkpoints"][0]["id"] == checkpoint["id"]
    await restore_works(engine, moved, checkpoint, "l.txt")
    assert porcelain_paths(main) == [str(main), str(moved)]
    assert git_works(moved)


async def test_git_worktree_move_found_without_a_path(engine, tmp_path):
    main, linked = main_with_linked(tmp_path)
    old_id = await wt_id(engine, linked)
    checkpoint = await cp(engine, linked)
    moved = tmp_path / "elsewhere" / "linked"
    moved.parent.mkdir()
    git(main, "worktree", "move", str(linked), str(moved))
    result = await engine.call("repair", {})
    assert result == {"moved": [{"worktree": old_id, "from": str(linked), "to": str(moved)}], "mended": [], "gone": []}
    # Addressed by id alone, it is found at its new place.
    listed_by_id = (await engine.call("list", {"worktree": old_id}))["checkpoints"]
    assert [c["id"] for c in listed_by_id] == [checkpoint["id"]]
    await restore_works(engine, moved, checkpoint, "l.txt")
    assert porcelain_paths(main) == [str(main), str(moved)]


async def test_plain_mv_of_a_linked_worktree_then_repair(engine, tmp_path):
    main, linked = main_with_linked(tmp_path)
    old_id = await wt_id(engine, linked)
    checkpoint = await cp(engine, linked)
    moved = tmp_path / "moved-by-mv"
    os.rename(linked, moved)
    assert porcelain_paths(main)[1].endswith("(prunable)")  # git lost it

    result = await engine.call("repair", {"path": str(moved)})
    assert result == {
        "moved": [{"worktree": old_id, "from": str(linked), "to": str(moved)}],
        "mended": [{"worktree": old_id, "path": str(moved)}],
        "gone": [],
    }
    assert porcelain_paths(main) == [str(main), str(moved)]
    assert git_works(moved) and git_works(main)
    # git's own prune no longer sees a stale worktree to remove.
    git(main, "worktree", "prune")
    assert porcelain_paths(main) == [str(main), str(moved)]
    assert await wt_id(engine, moved) == old_id
    assert await listed(engine, moved) == [checkpoint["id"]]
    await restore_works(engine, moved, checkpoint, "l.txt")


@pytest.mark.parametrize("repair_from", ["main", "linked"])
async def test_whole_repository_moved_then_repair(engine, tmp_path, repair_from):
    main, linked = main_with_linked(tmp_path / "project")
    main_id = await wt_id(engine, main)
    linked_id = await wt_id(engine, linked)
    main_cp = await cp(engine, main)
    linked_cp = await cp(engine, linked)
    os.rename(tmp_path / "project", tmp_path / "renamed")
    new_main = tmp_path / "renamed" / "main"
    new_linked = tmp_path / "renamed" / "linked"
    assert not git_works(new_linked)  # its .git file names the old place

    start = new_main if repair_from == "main" else new_linked
    result = await engine.call("repair", {"path": str(start)})
    assert sorted(result["moved"], key=lambda m: m["to"]) == [
        {"worktree": linked_id, "from": str(linked), "to": str(new_linked)},
        {"worktree": main_id, "from": str(main), "to": str(new_main)},
    ]
    assert porcelain_paths(new_main) == [str(new_main), str(new_linked)]
    assert git_works(new_main) and git_works(new_linked)
    assert await wt_id(engine, new_main) == main_id
    assert await wt_id(engine, new_linked) == linked_id
    assert await listed(engine, new_main) == [main_cp["id"]]
    assert await listed(engine, new_linked) == [linked_cp["id"]]
    await restore_works(engine, new_main, main_cp, "m.txt")
    await restore_works(engine, new_linked, linked_cp, "l.txt")


async def test_a_linked_worktree_whose_repository_is_unknown_is_not_guessed(engine, tmp_path):
    main_with_linked(tmp_path / "project")
    os.rename(tmp_path / "project", tmp_path / "renamed")
    new_linked = tmp_path / "renamed" / "linked"
    with pytest.raises(NotFound, match="repository's new path"):
        await engine.call("repair", {"path": str(new_linked)})
    assert engine.records.load() == {}  # never taken for a plain folder
    assert (new_linked / ".git").read_text().strip().endswith("project/main/.git/worktrees/linked")


async def test_moved_main_worktree_of_a_repository(engine, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("a\n")
    old_id = await wt_id(engine, repo)
    checkpoint = await cp(engine, repo)
    moved = tmp_path / "repo-moved"
    os.rename(repo, moved)
    # Addressed by id alone before the repair: a clear error that names the cure.
    with pytest.raises(NotFound, match="repair"):
        await Engine().call("list", {"worktree": old_id})
    result = await engine.call("repair", {"path": str(moved)})
    assert result == {"moved": [{"worktree": old_id, "from": str(repo), "to": str(moved)}], "mended": [], "gone": []}
    assert await listed(engine, moved) == [checkpoint["id"]]
    await restore_works(engine, moved, checkpoint, "a.txt")
    assert git_works(moved)


async def test_a_moved_worktree_known_to_the_engine_addressed_by_id(engine, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    old_id = await wt_id(engine, repo)
    await cp(engine, repo)
    os.rename(repo, tmp_path / "repo-moved")
    with pytest.raises(NotFound, match="repair"):
        await engine.call("list", {"worktree": old_id})


# ---------------------------------------------------------------------------
# plain folders


async def test_plain_folder_renamed_keeps_its_id(engine, tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "n.txt").write_text("note\n")
    old_id = await wt_id(engine, folder)
    checkpoint = await cp(engine, folder)
    renamed = tmp_path / "notes-renamed"
    os.rename(folder, renamed)

    # Opened at the new path: the same id (device and inode), the same checkpoints.
    fresh = Engine()
    assert await wt_id(fresh, renamed) == old_id
    assert await listed(fresh, renamed) == [checkpoint["id"]]
    await restore_works(fresh, renamed, checkpoint, "n.txt")

    # Moved again, found by repair this time.
    again = tmp_path / "notes-again"
    os.rename(renamed, again)
    result = await engine.call("repair", {"path": str(again)})
    assert result == {"moved": [{"worktree": old_id, "from": str(renamed), "to": str(again)}], "mended": [], "gone": []}
    assert await listed(engine, again) == [checkpoint["id"]]
    await restore_works(engine, again, checkpoint, "n.txt")


async def test_watched_worktree_moved_keeps_capturing_correctly(watched_engine, tmp_path):
    engine = watched_engine
    folder = tmp_path / "w"
    folder.mkdir()
    git(folder, "init", "-q")
    (folder / "a.txt").write_text("a\n")
    old_id = await wt_id(engine, folder)
    checkpoint = await cp(engine, folder)
    moved = tmp_path / "w-moved"
    os.rename(folder, moved)
    await engine.call("repair", {"path": str(moved)})
    await cp(engine, moved)  # the first capture at the new place
    (moved / "b.txt").write_text("new after the move\n")
    (moved / "a.txt").write_text("edited after the move\n")
    result = await engine.call("checkpoint", {"path": str(moved)})
    after = result["checkpoint"]
    assert result["stats"]["scan"] == "watch"  # the watch runs at the new place
    assert after["tree"] == oracle_tree(moved)
    status = await engine.call("status", {})
    assert [w["path"] for w in status["worktrees"] if w["watching"]] == [str(moved)]
    assert after["worktree"] == old_id
    await engine.call("restore", {"checkpoint": checkpoint["id"], "path": str(moved)})
    assert sorted(os.listdir(moved)) == [".git", "a.txt"]
    assert (await cp(engine, moved))["tree"] == checkpoint["tree"] == oracle_tree(moved)


# ---------------------------------------------------------------------------
# copies get their own id


@pytest.mark.parametrize("kind", ["git", "plain"])
async def test_a_copy_gets_a_new_id(engine, tmp_path, kind):
    original = tmp_path / "original"
    original.mkdir()
    (original / "a.txt").write_text("a\n")
    if kind == "git":
        git(original, "init", "-q")
    old_id = await wt_id(engine, original)
    checkpoint = await cp(engine, original)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(original), str(copy)], check=True)

    copy_id = await wt_id(engine, copy)
    assert copy_id != old_id
    assert await wt_id(engine, original) == old_id
    assert await listed(engine, copy) == []
    assert await listed(engine, original) == [checkpoint["id"]]
    (copy / "a.txt").write_text("copy's own edit\n")
    with pytest.raises((WorktreeMismatch, NotFound)):
        await engine.call("restore", {"checkpoint": checkpoint["id"], "path": str(copy)})
    assert (copy / "a.txt").read_text() == "copy's own edit\n"
    # repair at the copy reports no move and keeps both ids apart.
    assert (await engine.call("repair", {"path": str(copy)}))["moved"] == []
    assert await wt_id(engine, original) == old_id
    assert await wt_id(engine, copy) == copy_id
    fresh = Engine()
    assert await wt_id(fresh, copy) == copy_id
    assert await wt_id(fresh, original) == old_id


async def test_repair_at_a_copy_of_a_linked_worktree_never_takes_the_original_s_place(
    engine, tmp_path
):
    main, linked = main_with_linked(tmp_path)
    linked_id = await wt_id(engine, linked)
    await cp(engine, linked)
    copy = tmp_path / "linked-copy"
    shutil.copytree(linked, copy, symlinks=True)
    # The copy's .git file names the original's admin folder; git still lists the original.
    assert (await engine.call("repair", {"path": str(copy)}))["moved"] == []
    assert porcelain_paths(main) == [str(main), str(linked)]
    assert await wt_id(engine, linked) == linked_id
    assert git_works(linked)


async def test_a_copy_of_a_linked_worktree_gets_a_new_id(engine, tmp_path):
    _, linked = main_with_linked(tmp_path)
    linked_id = await wt_id(engine, linked)
    checkpoint = await cp(engine, linked)
    copy = tmp_path / "linked-copy"
    shutil.copytree(linked, copy, symlinks=True)
    try:
        assert await wt_id(engine, copy) != linked_id
        with pytest.raises(WorktreeMismatch):
            await engine.call("restore", {"checkpoint": checkpoint["id"], "path": str(copy)})
    finally:
        assert await wt_id(engine, linked) == linked_id


async def test_a_copy_opened_after_the_original_moved_does_not_take_its_id(tmp_path):
    main, _ = main_with_linked(tmp_path)
    first = Engine()
    original_id = await wt_id(first, main)
    checkpoint = await cp(first, main)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(main), str(copy)], check=True)
    moved = tmp_path / "main-moved"
    os.rename(main, moved)
    fresh = Engine()  # nothing cached: only the records and the folders tell
    assert await wt_id(fresh, copy) != original_id
    with pytest.raises(WorktreeMismatch):
        await fresh.call("restore", {"checkpoint": checkpoint["id"], "path": str(copy)})
    assert await wt_id(fresh, moved) == original_id
    listed = (await fresh.call("list", {"path": str(moved)}))["checkpoints"]
    assert [c["id"] for c in listed] == [checkpoint["id"]]


async def test_status_right_after_a_repair_shows_the_repaired_worktrees_here(watched_engine, tmp_path):
    """The main worktree moved: it and the linked worktree whose git folder went with it are 'here' once repaired."""
    engine = watched_engine
    main, linked = main_with_linked(tmp_path)
    await cp(engine, main)
    await cp(engine, linked)
    moved = tmp_path / "main-moved"
    os.rename(main, moved)

    async def presences() -> dict[str, tuple[str, str | None]]:
        shown = (await engine.call("status", {}))["worktrees"]
        return {w["path"]: (w["presence"], w["problem"]) for w in shown}

    with trio.fail_after(20):
        while any(presence == "here" for presence, _ in (await presences()).values()):
            await trio.sleep(0.1)
    await engine.call("repair", {"path": str(moved)})
    assert await presences() == {str(moved): ("here", None), str(linked): ("here", None)}


@pytest.mark.needs("inotify")
async def test_a_worktree_repaired_by_a_daemon_that_had_not_opened_it_is_watched(engine, watched_engine, tmp_path):
    """As after a restart: the repair opens the moved worktree at its new path, and watches it as a request would."""
    _, linked = main_with_linked(tmp_path)
    await cp(engine, linked)  # recorded by another engine of the same home: the watching one never opened it
    moved = tmp_path / "moved-while-down"
    os.rename(linked, moved)
    await watched_engine.call("repair", {"path": str(moved)})
    with trio.fail_after(20):
        while not [w for w in (await watched_engine.call("status", {}))["worktrees"] if w["watching"]]:
            await trio.sleep(0.05)
    [shown] = (await watched_engine.call("status", {}))["worktrees"]
    assert (shown["path"], shown["presence"], shown["watch_error"]) == (str(moved), "here", None)


async def test_a_linked_worktree_followed_by_a_capture_is_mended_by_a_repair_without_a_path(engine, tmp_path):
    """A capture at the new path follows the worktree, but git still lists it prunable until a repair."""
    main, linked = main_with_linked(tmp_path)
    old_id = await wt_id(engine, linked)
    moved = tmp_path / "moved-by-mv"
    os.rename(linked, moved)
    checkpoint = await cp(engine, moved)  # followed: the record names the new path now
    assert checkpoint["worktree"] == old_id
    assert porcelain_paths(main)[1] == f"{linked} (prunable)"

    result = await engine.call("repair", {})
    assert result == {"moved": [], "mended": [{"worktree": old_id, "path": str(moved)}], "gone": []}
    assert porcelain_paths(main) == [str(main), str(moved)]
    git(main, "worktree", "prune")  # what git gc runs: it keeps the worktree now
    assert porcelain_paths(main) == [str(main), str(moved)] and git_works(moved)
    assert (await engine.call("repair", {}))["mended"] == []
