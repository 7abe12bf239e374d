"""A fleet's start: worktrees opened together, their first walks taking turns (capture/watchsupply.py).

At a daemon's start under 250 sessions on 25 worktrees of 100,000 files, the
first walks take half a second each, one at a time. A first request that gave
up waiting after 5 s scanned the worktree unwatched, and its next capture
scanned it again: two full scans instead of one, and the last worktree's first
answer came after half a minute. Now a request whose scan is dear waits for its
walk's turn (the 5 s count the walk's own time), and a full scan that waited for
its turn while the walk ended becomes the warm state. Each test checks the trees
against git's.
"""

from __future__ import annotations

from collections import Counter

import trio
from oracle import oracle_tree
from repo_helpers import init_repo, write
from test_watch_limits import capture_of
from test_worktree_capture import full_scans_held

from snapshotd.capture import firstwalk
from snapshotd.capture.state import CaptureResult
from snapshotd.capture.watchsupply import supply
from snapshotd.capture.worktree import WorktreeCapture


async def first_request(capture: WorktreeCapture, nursery: trio.Nursery, results: list[CaptureResult]) -> None:
    """What the engine does for a worktree's first checkpoint: watch it, then capture under its lock."""
    await capture.ensure_watch(nursery, lambda paths, overflow: None)
    await capture.wait_for_watch()
    async with capture.lock:
        results.append(await capture.take())


async def next_capture_is_warm(capture: WorktreeCapture, repo, counters: Counter[str]) -> None:
    write(repo / "src" / "a.py", "a changed\n")
    async with capture.lock:
        second = await capture.take()
    assert second.stats.scan == "watch", counters
    assert second.tree == oracle_tree(repo)
    assert counters["captures.full"] == 1, counters


def new_worktree(tmp_path, monkeypatch, *, dear: bool, start_s: float, queue_s: float | None = None):
    """A small repository not opened yet, its full scan taken as ``dear`` or not; the waits shortened."""
    monkeypatch.setattr(firstwalk, "WATCH_START_TIMEOUT_S", start_s)
    if queue_s is not None:
        monkeypatch.setattr(firstwalk, "WATCH_QUEUE_WAIT_S", queue_s)
    if dear:
        monkeypatch.setattr(firstwalk, "DEAR_INDEX_BYTES", 0)  # as a big worktree's
    repo = init_repo(tmp_path / "r", ("src/a.py", "a\n"), ("docs/b.md", "b\n"))
    counters: Counter[str] = Counter()
    return repo, capture_of(repo, tmp_path / "home", counters), counters


async def test_first_requests_wait_for_their_walks_turn_and_share_one_full_scan(tmp_path, nursery, monkeypatch):
    """The worktree's other sessions wait for the walk too, instead of scanning it unwatched meanwhile."""
    repo, capture, counters = new_worktree(tmp_path, monkeypatch, dear=True, start_s=0.2)
    results: list[CaptureResult] = []
    # supply.walks: the walks of the worktrees ahead, held for longer than the start timeout
    async with trio.open_nursery() as requests, supply.walks:
        requests.start_soon(first_request, capture, nursery, results)
        await trio.sleep(0.1)
        requests.start_soon(first_request, capture, nursery, results)  # another session's first checkpoint
        await trio.sleep(1.0)
        assert not results  # both still wait for the walk's turn, neither scans unwatched
    assert [each.stats.scan for each in results] == ["full", "watch"]
    assert all(each.tree == oracle_tree(repo) for each in results)
    await next_capture_is_warm(capture, repo, counters)


async def test_a_full_scan_that_waited_while_the_walk_ended_becomes_the_warm_state(tmp_path, nursery, monkeypatch):
    repo, capture, counters = new_worktree(tmp_path, monkeypatch, dear=True, start_s=0.1, queue_s=0.1)
    monkeypatch.setattr(firstwalk, "WATCH_TURN_GRACE_S", 0.1)  # every wait for the walk over well before it runs
    results: list[CaptureResult] = []
    async with trio.open_nursery() as requests, full_scans_held():  # the full scans of the worktrees ahead
        async with supply.walks:
            requests.start_soon(first_request, capture, nursery, results)
            await trio.sleep(1.0)  # the request gave up on the walk and waits for its scan's turn
            assert not capture.watching and not results
        with trio.fail_after(10):
            while not capture.watching:  # the walk ran and ended while the scan still waited
                await trio.sleep(0.01)
    (first,) = results
    assert first.stats.scan == "full" and first.tree == oracle_tree(repo)
    await next_capture_is_warm(capture, repo, counters)


async def test_a_small_worktree_does_not_wait_for_the_walks_or_the_full_scans_ahead(tmp_path, nursery, monkeypatch):
    """A scan of a few files is cheaper than waiting for 25 big walks: the request scans unwatched after the
    start timeout, as before, without waiting for the big worktrees' full scans either, and the worktree is
    watched once its walk's turn comes."""
    repo, capture, _ = new_worktree(tmp_path, monkeypatch, dear=False, start_s=60)  # a wait for it would show
    results: list[CaptureResult] = []
    async with trio.open_nursery() as requests, supply.walks:
        async with full_scans_held():  # the big worktrees' full scans
            requests.start_soon(first_request, capture, nursery, results)
            with trio.fail_after(10):
                while not results:  # answered while the walks and the scans ahead still hold their turns
                    await trio.sleep(0.01)
        assert not capture.watching
    (first,) = results
    assert first.stats.scan == "full" and first.tree == oracle_tree(repo)
    with trio.fail_after(10):
        while not capture.watching:
            await trio.sleep(0.01)


async def test_a_read_at_a_fleets_start_does_not_wait_for_the_walks_ahead(tmp_path, nursery, monkeypatch):
    """``list`` or ``show`` needs no watch: opening the worktree waits for the start timeout at most, however dear
    its scan, and the watch starts when its turn comes."""
    _, capture, _ = new_worktree(tmp_path, monkeypatch, dear=True, start_s=60)
    async with supply.walks:
        with trio.fail_after(5):
            await capture.ensure_watch(nursery, lambda paths, overflow: None)
        assert not capture.watching
    with trio.fail_after(10):
        while not capture.watching:
            await trio.sleep(0.01)
