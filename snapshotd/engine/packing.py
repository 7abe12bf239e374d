"""Background packing: a store's loose objects are packed once they pile up, so its disk stays bounded.

Each checkpoint writes a few loose objects (its commit and pin, the trees and
blobs that changed): 250 sessions write a thousand files a second, which left
alone fill the file system's inodes and slow each lookup. The daemon looks
at a store when it first records there, once the loose objects it wrote there
pass the store's limit, and every ``LOOK_EVERY`` checkpoints (libgit2 and git
write some objects too); it counts the store's loose objects as ``git gc
--auto`` does (the files in ``objects/17``, times 256, or its own exact count
if higher) and, past git's limit (the store's ``gc.auto``: 6,700 unless set; 0
turns packing off, as it does git's), runs ``git repack -d --geometric=2``: every loose object, reachable or not, is
packed, and the small packs are rolled up so that their number stays
logarithmic. Nothing is pruned (each object stays, in a pack), no ref, reflog
or index is touched, and an object written meanwhile stays loose until the
next time. The new pack is flushed before the loose copies are deleted
(``core.fsync=pack``).

One packing runs in the daemon at a time, at niceness 10, and the next starts
only after a rest three times as long as it took; a capture never waits for
it. A packing cut short (the daemon killed) leaves git's temporary pack
``objects/pack/.tmp-*``; the next packing of that store removes those older
than ``STALE_TEMPORARY_S`` (a live one is written to, so its time is recent).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass

import pygit2
import trio

from snapshotd.engine.registry import Registry
from snapshotd.engine.subscriptions import Subscriptions
from snapshotd.errors import SnapshotdError
from snapshotd.git import loose
from snapshotd.git.process import GitTarget, run_git
from snapshotd.threads import thread_limiter

log = logging.getLogger(__name__)

LOOK_EVERY = 500  # checkpoints between two looks at a store's loose objects (some written by libgit2 or git)
GIT_LIMIT = 6700  # git's gc.auto when the store does not set it
NICENESS = 10
REST_RATIO = 3.0
STALE_TEMPORARY_S = 3600.0
SAMPLE_FOLDER = "17"  # git's sample of the 256 loose-object folders
REPACK = ["repack", "-d", "-l", "-n", "-q", "--geometric=2", "--no-write-bitmap-index"]
FLUSH_PACKS = {"GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "core.fsync", "GIT_CONFIG_VALUE_0": "pack",
               "GIT_CONFIG_KEY_1": "core.fsyncMethod", "GIT_CONFIG_VALUE_1": "fsync"}


def loose_limit(store_dir: str) -> int:
    """The store's limit of loose objects: its ``gc.auto`` (0: never pack), else git's default."""
    try:
        config = pygit2.Repository(store_dir, pygit2.enums.RepositoryOpenFlag.NO_SEARCH).config
        return max(0, config.get_int("gc.auto")) if "gc.auto" in config else GIT_LIMIT
    except (pygit2.GitError, KeyError, ValueError):
        return GIT_LIMIT


def loose_estimate(store_dir: str) -> int:
    """How many loose objects the store holds, estimated as git does: those in one of the 256 folders, times 256."""
    try:
        with os.scandir(os.path.join(store_dir, "objects", SAMPLE_FOLDER)) as entries:
            return 256 * sum(1 for entry in entries if not entry.name.startswith("tmp_"))
    except OSError:
        return 0


def clear_stale_temporaries(store_dir: str, now: float) -> int:
    """Remove temporary packs an interrupted packing left in the store (old ones only); how many."""
    folder = os.path.join(store_dir, "objects", "pack")
    removed = 0
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if not entry.name.startswith((".tmp-", "tmp_pack_", "tmp_idx_")):
                continue
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMPORARY_S:
                    os.unlink(entry.path)
                    removed += 1
    return removed


@dataclass
class PackingStats:
    """What ``status`` shows of background packing."""

    runs: int = 0
    failures: int = 0
    last_error: str | None = None
    last_seconds: float | None = None

    def to_wire(self) -> dict[str, object]:
        return {
            "runs": self.runs,
            "failures": self.failures,
            "last_error": self.last_error,
            "last_seconds": None if self.last_seconds is None else round(self.last_seconds, 3),
        }


class BackgroundPacking:
    """Packs the loose objects of the stores the daemon writes into, one store at a time, in the background."""

    def __init__(self, registry: Registry, subscriptions: Subscriptions, nursery: trio.Nursery | None) -> None:
        self.registry = registry
        self.nursery = nursery
        self.waiting: set[str] = set()  # store dirs to look at
        self.limits: dict[str, int] = {}  # store dir: its limit, once looked at
        self.recorded_since: dict[str, int] = {}  # store dir: checkpoints recorded since the last look
        self.running = False
        self.stats = PackingStats()
        subscriptions.on_recorded.append(self.recorded)

    def recorded(self, worktree_id: str) -> None:
        """A checkpoint was recorded: look at its store when enough was written into it since the last look."""
        state = self.registry.worktrees.get(worktree_id)
        if self.nursery is None or state is None:
            return
        store = state.info.store_dir
        self.recorded_since[store] = self.recorded_since.get(store, 0) + 1
        limit = self.limits.get(store)  # None: not looked at since the daemon started, so look now
        if limit is not None and self.recorded_since[store] < LOOK_EVERY and loose.written_count(store) <= limit:
            return
        self.recorded_since[store] = 0
        self.waiting.add(store)
        if not self.running:
            self.running = True
            self.nursery.start_soon(self._serve)

    async def _serve(self) -> None:
        try:
            while self.waiting:
                store = self.waiting.pop()
                started = time.monotonic()
                if await self._pack_if_needed(store):
                    await trio.sleep(REST_RATIO * (time.monotonic() - started))
        finally:
            self.running = False

    async def _pack_if_needed(self, store: str) -> bool:
        """Pack the store's loose objects if they are past its limit; whether git ran."""
        limit = await trio.to_thread.run_sync(loose_limit, store, limiter=thread_limiter)
        self.limits[store] = limit
        if not limit:
            return False
        estimate = await trio.to_thread.run_sync(loose_estimate, store, limiter=thread_limiter)
        if max(estimate, loose.written_count(store)) <= limit:  # this process's writes counted exactly, others' as git does
            return False
        loose.take_written_count(store)
        started = time.monotonic()
        try:
            await trio.to_thread.run_sync(clear_stale_temporaries, store, time.time(), limiter=thread_limiter)
            await run_git(GitTarget(git_dir=store, work_tree=None), REPACK, nice=NICENESS, env_extra=FLUSH_PACKS)
        except (SnapshotdError, OSError) as exc:
            self.stats.failures += 1
            self.stats.last_error = str(exc)
            log.warning("packing the loose objects of %s failed: %s", store, exc)
        else:
            self.stats.runs += 1
            self.stats.last_error = None
        self.stats.last_seconds = time.monotonic() - started
        return True
