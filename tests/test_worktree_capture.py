"""WorktreeCapture directly: the warm-or-cold decision, failed captures and forgetting objects, against git."""

from __future__ import annotations

import mmap
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from oracle import oracle_tree
from repo_helpers import init_repo, write

from snapshotd.capture import firstwalk, worktree as worktree_mod
from snapshotd.capture.worktree import WorktreeCapture
from snapshotd.settings import size_cap
from snapshotd.store.identity import Records, identify, locate


@asynccontextmanager
async def full_scans_held() -> AsyncIterator[None]:
    """Every turn of the full scans taken, as by other worktrees' scans, until the block ends."""
    others = [object() for _ in range(int(worktree_mod.full_scans.total_tokens))]
    for other in others:
        await worktree_mod.full_scans.acquire_on_behalf_of(other)
    try:
        yield
    finally:
        for other in others:
            worktree_mod.full_scans.release_on_behalf_of(other)


def make_repo(root: Path) -> Path:
    repo = init_repo(root, ("README", "readme\n"), ("src/a.py", "print('a')\n"), (".gitignore", "*.log\n"))
    write(repo / "notes.txt", "untracked\n")
    return repo


def capture_of(repo: Path, home: Path, counters: Counter[str]) -> WorktreeCapture:
    """A capture object for ``repo``, as the engine makes one when it opens the worktree."""
    info = identify(locate(str(repo)), Records(home))
    return WorktreeCapture(info, lock=trio.Lock(), counters=counters, size_cap=size_cap(None))


async def watched(repo: Path, home: Path, nursery: trio.Nursery) -> tuple[WorktreeCapture, Counter[str], list[set[str]]]:
    """A watched capture that took its first (cold) tree, with its counters and the change batches it heard."""
    counters: Counter[str] = Counter()
    heard: list[set[str]] = []
    capture = capture_of(repo, home, counters)
    await capture.ensure_watch(nursery, lambda paths, overflow: heard.append(set(paths)))
    assert capture.watching
    first = await capture.take()
    assert first.stats.scan == "full"
    assert first.tree == oracle_tree(repo)
    return capture, counters, heard


@pytest.mark.needs("inotify")
async def test_a_change_after_a_cold_capture_is_taken_warm(tmp_path, nursery):
    repo = make_repo(tmp_path / "r")
    capture, counters, heard = await watched(repo, tmp_path / "home", nursery)
    write(repo / "src" / "a.py", "print('b')\n")
    write(repo / "src" / "new.py", "print('new')\n")
    result = await capture.take()
    assert result.stats.scan == "watch"
    assert result.tree == oracle_tree(repo)
    assert counters["captures.full"] == 1 and counters["captures.watch"] == 1
    assert any("src/a.py" in batch for batch in heard)
    assert capture.needs_reconcile
    capture.close()


@pytest.mark.needs("inotify")
async def test_a_rule_change_makes_the_next_capture_cold(tmp_path, nursery):
    repo = make_repo(tmp_path / "r")
    capture, counters, _ = await watched(repo, tmp_path / "home", nursery)
    assert (await capture.take()).stats.scan == "watch"
    before = sum(count for name, count in counters.items() if name.startswith("cold_reasons."))
    with open(repo / ".gitignore", "a") as handle:
        handle.write("notes.txt\n")
    result = await capture.take()
    assert result.stats.scan == "full"
    assert result.tree == oracle_tree(repo)
    assert sum(count for name, count in counters.items() if name.startswith("cold_reasons.")) == before + 1
    assert (await capture.take()).stats.scan == "watch"  # warm again after the full scan
    capture.close()


@pytest.mark.needs("inotify")
async def test_a_failed_capture_hands_its_dirty_paths_back(tmp_path, nursery, monkeypatch):
    repo = make_repo(tmp_path / "r")
    capture, counters, _ = await watched(repo, tmp_path / "home", nursery)
    write(repo / "README", "edited\n")
    cold_before = counters["cold_reasons.watcher not warm"]

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    real_capture_warm = worktree_mod.capture_warm
    monkeypatch.setattr(worktree_mod, "capture_warm", disk_full)
    with pytest.raises(OSError, match="No space left"):
        await capture.take()
    monkeypatch.setattr(worktree_mod, "capture_warm", real_capture_warm)
    assert capture.warm is None and counters["captures.failed"] == 1
    assert capture.watcher is not None
    dirty, reasons = capture.watcher.take()
    assert "README" in dirty and reasons == {"a capture failed"}
    capture.watcher.put_back(dirty, reasons)
    result = await capture.take()
    assert result.stats.scan == "full"
    assert result.tree == oracle_tree(repo)
    assert counters["cold_reasons.watcher not warm"] == cold_before + 1
    capture.close()


async def test_forget_objects_makes_the_next_capture_hash_afresh(tmp_path):
    repo = make_repo(tmp_path / "r")
    counters: Counter[str] = Counter()
    capture = capture_of(repo, tmp_path / "home", counters)
    old = time.time() - 60
    os.utime(repo / "notes.txt", (old, old))
    time.sleep(0.05)  # the file's ctime is then strictly older than the capture's fence
    assert (await capture.take()).stats.hashed == 1
    again = await capture.take(exact=True)
    assert again.stats.hashed == 0  # the stat cache answered
    capture.forget_objects()
    assert capture.warm is None and capture.cache.entries == {}
    fresh = await capture.take(exact=True)
    assert fresh.stats.hashed == 1
    assert fresh.tree == again.tree == oracle_tree(repo)


@pytest.mark.needs("inotify")
async def test_verify_names_a_write_the_watcher_missed(tmp_path, nursery):
    repo = make_repo(tmp_path / "r")
    capture, counters, _ = await watched(repo, tmp_path / "home", nursery)
    assert (await capture.verify()).to_wire()["differences"] == []
    with open(repo / "README", "r+b") as handle, mmap.mmap(handle.fileno(), 0) as mapped:
        mapped[:4] = b"READ"  # through a shared mapping: inotify reports nothing
        mapped.flush()
        found = await capture.verify()
    (miss,) = found.differences
    assert miss.path == "README"
    assert miss.cause == "changed on disk: the watcher missed a write"
    assert miss.disk is not None and miss.warm is not None and miss.disk["oid"] != miss.warm["oid"]
    assert counters["watch_miss"] == 1
    assert (await capture.take()).tree == oracle_tree(repo)
    capture.close()


@pytest.mark.needs("inotify")
async def test_a_moved_worktree_gets_a_new_watcher(tmp_path, nursery):
    repo = make_repo(tmp_path / "r")
    capture, _, _ = await watched(repo, tmp_path / "home", nursery)
    first_watcher = capture.watcher
    moved = tmp_path / "moved"
    os.rename(repo, moved)
    capture.info = identify(locate(str(moved)), Records(tmp_path / "home"))
    await capture.ensure_watch(nursery, lambda paths, overflow: None)
    assert capture.watcher is not first_watcher and capture.watched == capture.info
    write(moved / "README", "after the move\n")
    result = await capture.take()
    assert result.stats.scan == "full"  # the warm state of the old place was dropped
    assert result.tree == oracle_tree(moved)
    capture.close()


async def test_full_scans_take_turns_and_leave_a_thread_for_warm_captures(tmp_path, nursery, monkeypatch):
    """Cold captures of four unwatched worktrees at once: never more than ``full_scans`` run together
    (one fewer than the worker threads), each still equals git's tree, and a warm capture runs meanwhile."""
    running, most = 0, 0
    real_capture_cold = worktree_mod.capture_cold

    async def counted(*args, **kwargs):
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await trio.sleep(0.2)  # long enough for the others to come in, if the limiter let them
            return await real_capture_cold(*args, **kwargs)
        finally:
            running -= 1

    warm_repo = make_repo(tmp_path / "warm")
    warm_capture, _, _ = await watched(warm_repo, tmp_path / "home", nursery)
    monkeypatch.setattr(worktree_mod, "capture_cold", counted)
    monkeypatch.setattr(firstwalk, "DEAR_INDEX_BYTES", 0)  # as big worktrees' (small ones' scans take no turn)
    repos = [make_repo(tmp_path / f"r{index}") for index in range(4)]
    captures = [capture_of(repo, tmp_path / "home", Counter()) for repo in repos]  # no watch: every capture is full
    trees: dict[int, str] = {}
    warm_done: list[str] = []

    async def take(index: int) -> None:
        trees[index] = (await captures[index].take()).tree

    async def take_warm() -> None:
        await trio.sleep(0.02)
        write(warm_repo / "README", "edited while the scans queue\n")
        result = await warm_capture.take()
        assert result.stats.scan == "watch"
        warm_done.append(result.tree)
        assert running > 0  # the warm capture ended while full scans still ran or waited

    async with trio.open_nursery() as scans:
        for index in range(4):
            scans.start_soon(take, index)
        scans.start_soon(take_warm)
    assert most == min(4, worktree_mod.full_scans.total_tokens)
    assert all(trees[index] == oracle_tree(repo) for index, repo in enumerate(repos))
    assert warm_done == [oracle_tree(warm_repo)]
    warm_capture.close()


@pytest.mark.needs("inotify")
async def test_an_idle_reconciliation_waits_for_its_turn_without_holding_the_worktree(tmp_path, nursery, monkeypatch):
    """Other worktrees' full scans hold every turn; the reconciliation due here waits for one outside the
    worktree's lock, so a checkpoint here is not held behind them; given a turn, it reconciles."""
    monkeypatch.setattr(worktree_mod, "RECONCILE_IDLE_S", 0.1)
    monkeypatch.setattr(worktree_mod, "PRESENCE_CHECK_S", 0.05)
    repo = make_repo(tmp_path / "r")
    capture, counters, _ = await watched(repo, tmp_path / "home", nursery)
    write(repo / "README", "edited\n")
    assert (await capture.take()).stats.scan == "watch"  # a warm capture: a reconciliation is due once quiet
    async with full_scans_held():
        await trio.sleep(0.5)  # quiet, and past several rounds of the reconciliation's check
        write(repo / "README", "edited again\n")
        with trio.fail_after(5):
            async with capture.lock:
                result = await capture.take()
        assert result.stats.scan == "watch" and result.tree == oracle_tree(repo)
        assert counters["reconciliations"] == 0
    with trio.fail_after(10):
        while counters["reconciliations"] == 0:
            await trio.sleep(0.05)
    assert counters["watch_miss"] == 0
    capture.close()


@pytest.mark.needs("inotify")
async def test_an_idle_reconciliation_whose_capture_must_scan_in_full_runs_in_the_turn_it_took(tmp_path, nursery, monkeypatch):
    """The ignore rules changed after a warm capture: the reconciliation's own capture of the worktree is
    then a full scan, made in the turn the reconciliation took before the lock, and the watch goes on."""
    monkeypatch.setattr(worktree_mod, "RECONCILE_IDLE_S", 0.1)
    monkeypatch.setattr(worktree_mod, "PRESENCE_CHECK_S", 0.05)
    repo = make_repo(tmp_path / "r")
    capture, counters, _ = await watched(repo, tmp_path / "home", nursery)
    write(repo / "README", "edited\n")
    assert (await capture.take()).stats.scan == "watch"  # a reconciliation is due once quiet
    write(repo / ".gitignore", "*.log\nnotes.txt\n")  # the next capture, the reconciliation's, is a full scan
    with trio.fail_after(10):
        while capture.needs_reconcile:
            await trio.sleep(0.05)
    await trio.sleep(0.2)
    assert counters["worktree_task_failures"] == 0, capture.watch_error
    assert capture.watching and capture.watch_error is None
    write(repo / "README", "edited again\n")
    async with capture.lock:
        result = await capture.take()
    assert result.stats.scan == "watch" and result.tree == oracle_tree(repo)
    capture.close()
