"""Revert through the engine: two agents on one worktree undo only their own turns.

Sessions "a" and "b" take checkpoints before and after each of their turns,
interleaved as two agents sharing a worktree would. Reverting one turn must
leave every other path alone; a path both touched is reported and kept unless
``force``. (T3 #5512: a revert in one thread deleted another thread's work.)
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from oracle import oracle_tree
from repo_helpers import commit_all, git, worktree_listing

from snapshotd.engine.core import Engine
from snapshotd.errors import InvalidParams, NotFound, WorktreeMismatch


def tree_state(root: Path) -> dict[str, tuple[Any, ...]]:
    """Files ``("file", bytes, executable)``, links and empty folders, never following links."""
    found: dict[str, tuple[Any, ...]] = {}
    for folder, dirs, files in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        if rel_folder == ".":
            dirs[:] = [d for d in dirs if d != ".git"]
        elif not dirs and not files:
            found[rel_folder] = ("dir",)
        for name in dirs + files:
            full = os.path.join(folder, name)
            rel = os.path.normpath(os.path.join(rel_folder, name))
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as handle:
                    found[rel] = ("file", handle.read(), bool(st.st_mode & 0o100))
    return found


async def cp(engine: Engine, wt: Path, session: str, label: str) -> dict[str, Any]:
    params = {"path": str(wt), "session": session, "label": label}
    return (await engine.call("checkpoint", params))["checkpoint"]


async def revert(engine: Engine, wt: Path, source: str, target: str | None = None, **params: Any) -> dict:
    call: dict[str, Any] = {"from": source, "path": str(wt), **params}
    if target is not None:
        call["to"] = target
    return await engine.call("revert", call)


class Turns:
    """A worktree where agents a and b took turns; every checkpoint and state is kept."""

    def __init__(self, wt: Path) -> None:
        self.wt = wt
        self.cps: dict[str, dict[str, Any]] = {}
        self.states: dict[str, dict[str, tuple[Any, ...]]] = {}

    async def mark(self, engine: Engine, session: str, label: str) -> None:
        self.cps[label] = await cp(engine, self.wt, session, label)
        self.states[label] = tree_state(self.wt)


async def two_agents(engine: Engine, wt: Path) -> Turns:
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / ".gitignore").write_text("*.log\n")
    for name in ("a1.txt", "a2.txt", "b1.txt", "shared.txt", "a-del.txt", "common.txt"):
        (wt / name).write_text(f"{name} at start\n")
    commit_all(wt, "start")
    (wt / "untracked-start.txt").write_text("untracked, from before any turn\n")
    turns = Turns(wt)

    await turns.mark(engine, "a", "a before 1")
    (wt / "a1.txt").write_text("a1 edited by a\n")
    (wt / "a-new.txt").write_text("created by a\n")
    (wt / "a-del.txt").unlink()
    (wt / "a-dir" / "deep").mkdir(parents=True)
    (wt / "a-dir" / "deep" / "x.txt").write_text("new folder by a\n")
    (wt / "a2.txt").chmod(0o755)
    (wt / "shared.txt").write_text("shared, a's edit\n")
    (wt / "a.log").write_text("a's ignored log\n")
    await turns.mark(engine, "a", "a after 1")

    await turns.mark(engine, "b", "b before 1")
    (wt / "b1.txt").write_text("b1 edited by b\n")
    (wt / "b-new.txt").write_text("created by b\n")
    (wt / "shared.txt").write_text("shared, b's edit on top of a's\n")
    (wt / "a-dir" / "b-was-here.txt").write_text("b's file in a's new folder\n")
    await turns.mark(engine, "b", "b after 1")

    await turns.mark(engine, "a", "a before 2")
    (wt / "a2.txt").write_text("a2, a's second turn\n")
    (wt / "a-new.txt").write_text("created by a, edited in turn 2\n")
    await turns.mark(engine, "a", "a after 2")

    (wt / "b1.txt").write_text("b1, b's uncommitted work after its turn\n")
    (wt / "b.log").write_text("b's ignored log\n")
    return turns


async def test_reverting_one_turn_keeps_the_other_agents_work(engine, tmp_path):
    turns = await two_agents(engine, tmp_path / "wt")
    wt = turns.wt
    before = tree_state(wt)

    result = await revert(engine, wt, turns.cps["a before 1"]["id"], turns.cps["a after 1"]["id"])
    start = turns.states["a before 1"]
    # a's own turn-1 changes that nobody touched since are undone...
    assert sorted(result["written"]) == ["a-del.txt", "a1.txt"]
    assert sorted(result["deleted"]) == ["a-dir/deep/x.txt"]
    # ...the paths someone changed since are reported and left alone.
    assert result["conflicts"] == [
        {"path": "a-new.txt", "reason": "changed since the checkpoint"},
        {"path": "a2.txt", "reason": "changed since the checkpoint"},
        {"path": "shared.txt", "reason": "changed since the checkpoint"},
    ]
    now = tree_state(wt)
    expected = dict(before)
    for path in ("a1.txt", "a-del.txt"):
        expected[path] = start[path]
    del expected["a-dir/deep/x.txt"]
    assert now == expected
    # b's work, the untracked file from before and the ignored logs are untouched.
    assert now["b1.txt"] == ("file", b"b1, b's uncommitted work after its turn\n", False)
    assert now["b-new.txt"] == before["b-new.txt"]
    assert now["a-dir/b-was-here.txt"] == before["a-dir/b-was-here.txt"]
    assert now["a.log"] == before["a.log"] and now["b.log"] == before["b.log"]
    assert now["untracked-start.txt"] == before["untracked-start.txt"]
    assert oracle_tree(wt) == (await engine.call("checkpoint", {"path": str(wt)}))["checkpoint"]["tree"]

    # The safety checkpoint takes the revert back.
    safety = result["safety_checkpoint"]
    assert safety["label"].startswith("before revert ")
    await engine.call("restore", {"checkpoint": safety["id"], "path": str(wt)})
    assert tree_state(wt) == before


async def test_force_takes_back_a_path_both_agents_touched(engine, tmp_path):
    turns = await two_agents(engine, tmp_path / "wt")
    wt = turns.wt
    before = tree_state(wt)
    a0, a1 = turns.cps["a before 1"]["id"], turns.cps["a after 1"]["id"]

    dry = await revert(engine, wt, a0, a1, paths=["shared.txt"], dry_run=True)
    assert dry == {
        "safety_checkpoint": None,
        "written": [],
        "deleted": [],
        "conflicts": [{"path": "shared.txt", "reason": "changed since the checkpoint"}],
    }
    forced_dry = await revert(engine, wt, a0, a1, paths=["shared.txt"], dry_run=True, force=True)
    assert forced_dry["written"] == ["shared.txt"] and forced_dry["conflicts"] == []
    assert tree_state(wt) == before

    forced = await revert(engine, wt, a0, a1, paths=["shared.txt"], force=True)
    assert forced["written"] == ["shared.txt"] and forced["conflicts"] == []
    assert (wt / "shared.txt").read_text() == "shared.txt at start\n"
    assert {p: v for p, v in tree_state(wt).items() if p != "shared.txt"} == {
        p: v for p, v in before.items() if p != "shared.txt"
    }

    # Forcing the whole turn: a-dir keeps b's file, so only a's file goes.
    everything = await revert(engine, wt, a0, a1, force=True)
    assert sorted(everything["written"]) == ["a-del.txt", "a1.txt", "a2.txt"]
    assert sorted(everything["deleted"]) == ["a-dir/deep/x.txt", "a-new.txt"]
    assert everything["conflicts"] == []
    now = tree_state(wt)
    start = turns.states["a before 1"]
    for path in ("a1.txt", "a2.txt", "a-del.txt", "shared.txt"):
        assert now[path] == start[path], path
    assert "a-new.txt" not in now and "a-dir/deep/x.txt" not in now
    assert now["a-dir/b-was-here.txt"] == before["a-dir/b-was-here.txt"]
    assert now["b1.txt"] == before["b1.txt"] and now["b-new.txt"] == before["b-new.txt"]


async def test_revert_without_to_uses_the_newest_checkpoint_of_the_session(engine, tmp_path):
    turns = await two_agents(engine, tmp_path / "wt")
    wt = turns.wt
    before = tree_state(wt)
    result = await revert(engine, wt, turns.cps["a before 2"]["id"])
    assert sorted(result["written"]) == ["a-new.txt", "a2.txt"]
    assert result["deleted"] == [] and result["conflicts"] == []
    start = turns.states["a before 2"]
    assert tree_state(wt) == {**before, "a2.txt": start["a2.txt"], "a-new.txt": start["a-new.txt"]}
    assert (wt / "a2.txt").stat().st_mode & 0o111  # turn 1's chmod +x stays

    # Reverting b's turn: only b's paths; shared.txt goes back to a's edit.
    b_turn = await revert(engine, wt, turns.cps["b before 1"]["id"], turns.cps["b after 1"]["id"])
    assert b_turn["conflicts"] == [{"path": "b1.txt", "reason": "changed since the checkpoint"}]
    assert sorted(b_turn["written"]) == ["shared.txt"]
    assert sorted(b_turn["deleted"]) == ["a-dir/b-was-here.txt", "b-new.txt"]
    assert (wt / "shared.txt").read_text() == "shared, a's edit\n"
    assert (wt / "a-dir" / "deep" / "x.txt").read_text() == "new folder by a\n"
    assert (wt / "b1.txt").read_text() == "b1, b's uncommitted work after its turn\n"


async def test_revert_is_idempotent_and_skips_what_already_matches(engine, tmp_path):
    turns = await two_agents(engine, tmp_path / "wt")
    wt = turns.wt
    a0, a1 = turns.cps["a before 1"]["id"], turns.cps["a after 1"]["id"]
    await revert(engine, wt, a0, a1)
    mtimes = {p: os.lstat(wt / p).st_mtime_ns for p in ("a1.txt", "a-del.txt", "b1.txt")}
    again = await revert(engine, wt, a0, a1)
    assert again["written"] == again["deleted"] == []
    assert again["safety_checkpoint"] is None
    assert [c["path"] for c in again["conflicts"]] == ["a-new.txt", "a2.txt", "shared.txt"]
    assert {p: os.lstat(wt / p).st_mtime_ns for p in mtimes} == mtimes


async def test_revert_refusals_change_nothing(engine, tmp_path):
    turns = await two_agents(engine, tmp_path / "wt")
    wt = turns.wt
    before = worktree_listing(wt)
    a0 = turns.cps["a before 1"]["id"]
    with pytest.raises(InvalidParams):
        await engine.call("revert", {"path": str(wt)})
    with pytest.raises(NotFound):
        await revert(engine, wt, "0" * 40)
    with pytest.raises(InvalidParams, match="too short"):
        await revert(engine, wt, a0[:6])
    with pytest.raises(NotFound):
        await revert(engine, wt, a0, "1234567")

    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    (other / "o.txt").write_text("other\n")
    foreign = await cp(engine, other, "a", "foreign")
    with pytest.raises(WorktreeMismatch):
        await revert(engine, wt, a0, foreign["id"])
    with pytest.raises(WorktreeMismatch):
        await revert(engine, other, a0, turns.cps["a after 1"]["id"])
    assert worktree_listing(wt) == before
    assert (other / "o.txt").read_text() == "other\n"
