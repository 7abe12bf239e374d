"""The idle reconciliation is spaced out while it finds nothing, comes back at once after a miss, and all
worktrees' together take a share of the time (capture/pace.py)."""

from __future__ import annotations

import mmap
from collections import Counter
from pathlib import Path

import pytest
import trio
from oracle import oracle_tree
from repo_helpers import write
from test_worktree_capture import make_repo, watched

from snapshotd.capture import pace, worktree as worktree_mod

pytestmark = pytest.mark.needs("inotify")


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worktree_mod, "RECONCILE_IDLE_S", 0.1)
    monkeypatch.setattr(worktree_mod, "PRESENCE_CHECK_S", 0.05)
    monkeypatch.setattr(pace, "FIRST_SPACING_S", 1.5)


async def a_turn(capture: worktree_mod.WorktreeCapture, repo: Path, text: str, *, missed: bool = False) -> None:
    """An edit the watcher sees, taken warm (git's tree, unless a write it ``missed`` is on disk too): a
    reconciliation is due once the worktree is quiet."""
    write(repo / "README", text)
    async with capture.lock:
        result = await capture.take()
    assert result.stats.scan == "watch" and (result.tree == oracle_tree(repo)) is not missed


async def reconciled(counters: Counter[str], count: int, within: float) -> bool:
    """Whether ``counters`` reach ``count`` reconciliations within ``within`` seconds."""
    with trio.move_on_after(within):
        while counters["reconciliations"] < count:
            await trio.sleep(0.02)
        return True
    return False


async def test_a_reconciliation_that_found_nothing_spaces_out_the_next(tmp_path, nursery, quick):
    repo = make_repo(tmp_path / "r")
    capture, counters, _ = await watched(repo, tmp_path / "home", nursery)
    await a_turn(capture, repo, "one\n")
    assert await reconciled(counters, 1, within=5)  # the first, at the first quiet moment
    await a_turn(capture, repo, "two\n")
    assert not await reconciled(counters, 2, within=0.8)  # quiet, but inside the spacing
    assert await reconciled(counters, 2, within=5)
    assert capture.pace.spacing == 3.0  # doubled after each that found nothing
    assert counters["watch_miss"] == 0
    capture.close()


async def test_a_miss_brings_the_reconciliation_back_at_once(tmp_path, nursery, quick):
    repo = make_repo(tmp_path / "r")
    capture, counters, _ = await watched(repo, tmp_path / "home", nursery)
    await a_turn(capture, repo, "one\n")
    assert await reconciled(counters, 1, within=5)
    await trio.sleep(1.6)  # past the spacing: the next finds the miss below
    with open(repo / "src" / "a.py", "r+b") as handle, mmap.mmap(handle.fileno(), 0) as mapped:
        mapped[:5] = b"PRINT"  # through a shared mapping: inotify reports nothing
        mapped.flush()
        await a_turn(capture, repo, "two\n", missed=True)
        assert await reconciled(counters, 2, within=5)
    assert counters["watch_miss"] == 1 and capture.pace.spacing == 0
    await a_turn(capture, repo, "three\n")
    assert await reconciled(counters, 3, within=2)  # at the next quiet moment
    capture.close()


async def test_worktrees_reconciliations_together_take_a_share_of_the_time(tmp_path, nursery, quick, monkeypatch):
    monkeypatch.setattr(pace, "SHARE", 0.5)  # the next may start as long after one as that one took
    first_repo, second_repo = make_repo(tmp_path / "a"), make_repo(tmp_path / "b")
    first, first_counters, _ = await watched(first_repo, tmp_path / "home", nursery)
    second, second_counters, _ = await watched(second_repo, tmp_path / "home", nursery)
    real_cold = worktree_mod.WorktreeCapture._cold

    async def slow_reconciliation(self, reason, hints=None):  # a big worktree's full scan, 1.5 s
        if reason == "idle reconciliation" and self is first:
            await trio.sleep(1.5)
        return await real_cold(self, reason, hints)

    monkeypatch.setattr(worktree_mod.WorktreeCapture, "_cold", slow_reconciliation)
    await a_turn(first, first_repo, "one\n")
    assert await reconciled(first_counters, 1, within=5)
    await a_turn(second, second_repo, "one\n")
    assert not await reconciled(second_counters, 1, within=1.0)  # held back by the first one's 1.5 s
    assert await reconciled(second_counters, 1, within=3)
    first.close()
    second.close()


async def test_a_miss_verify_finds_brings_the_reconciliation_back_too(tmp_path, nursery, quick, monkeypatch):
    monkeypatch.setattr(pace, "FIRST_SPACING_S", 60.0)
    repo = make_repo(tmp_path / "r")
    capture, counters, _ = await watched(repo, tmp_path / "home", nursery)
    await a_turn(capture, repo, "one\n")
    assert await reconciled(counters, 1, within=5)
    assert capture.pace.spacing == 60.0
    with open(repo / "src" / "a.py", "r+b") as handle, mmap.mmap(handle.fileno(), 0) as mapped:
        mapped[:5] = b"PRINT"  # through a shared mapping: inotify reports nothing
        mapped.flush()
        async with capture.lock:
            assert [miss.path for miss in (await capture.verify()).differences] == ["src/a.py"]
    await a_turn(capture, repo, "two\n")
    assert await reconciled(counters, 2, within=10)  # at the next quiet moment, not a minute later
    capture.close()
