"""One worktree's capture: its watcher, warm state and stat cache, and the warm-or-cold decision.

The engine keeps one :class:`WorktreeCapture` per open worktree and asks it
for a tree with :meth:`WorktreeCapture.take`. A warm capture applies the live
watcher's dirty set to the last tree; a cold one is a full scan. When the
worktree is quiet after warm captures, the idle reconciliation checks the warm
tree against a full scan, paced (:mod:`.pace`), and reports what the watcher missed.

The worktree's own tasks (its watcher, the idle reconciliation, the presence
check) run under :meth:`WorktreeCapture._run`, a supervisor: a task that fails
is logged with its traceback and the worktree drops to cold captures (the
watch is tried again later, backing off), and a worktree found deleted or
moved away stops its tasks and says so (:mod:`snapshotd.capture.presence`).
Nothing a worktree does ends the daemon or holds another worktree's request.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import trio

from snapshotd import facilities
from snapshotd.capture import presence
from snapshotd.capture.core import capture_cold
from snapshotd.capture.firstwalk import scan_is_dear, wait_for_walk
from snapshotd.capture.gitlinks import moved as moved_gitlinks
from snapshotd.capture.misses import VerifyResult, watch_misses
from snapshotd.capture.pace import ReconcilePace
from snapshotd.capture.resident import Resident
from snapshotd.capture.state import CaptureResult, CaptureStats, StatCache, Then, make_fence
from snapshotd.capture.warm import WarmBasis, WarmState, capture_warm, signature_of
from snapshotd.capture.watch import Watcher
from snapshotd.capture.watchsupply import WatchRetry
from snapshotd.errors import NotFound, missing_object_error
from snapshotd.git.format import object_format
from snapshotd.store.identity import WorktreeInfo
from snapshotd.threads import current_caller, full_scan_turn, full_scans, thread_limiter

log = logging.getLogger(__name__)

RECONCILE_IDLE_S = 5.0
PRESENCE_CHECK_S = RECONCILE_IDLE_S / 2
VANISH_GRACE_S = 0.3  # a failed capture looks again after this for a worktree being deleted

OnChange = Callable[[set[str], bool], None]


class WorktreeCapture:
    """What capture keeps for one worktree, and the one place that decides warm or cold.

    ``counters`` is the engine's: captures count into it under the names
    ``status`` reports (``captures.*``, ``cold_reasons.*``, ``processes``,
    ``watch_miss``, ...). ``lock`` is the worktree's: the idle reconciliation
    takes it as every other capture's caller does.
    """

    def __init__(self, info: WorktreeInfo, *, lock: trio.Lock, counters: Counter[str], size_cap: int) -> None:
        self.info = info
        self.lock = lock
        self.counters = counters
        self.size_cap = size_cap
        self.cache = StatCache()
        self.resident = Resident()  # the open store, its back-end decided once (here, on the opening thread)
        self.resident.in_process(info)
        self.scan_dear = scan_is_dear(info)  # read here, on the opening thread, once: what the first walk is worth
        self.watcher: Watcher | None = None
        self.watched: WorktreeInfo | None = None  # where the watcher was started (the worktree may have moved since)
        self.warm: WarmState | None = None
        self.needs_reconcile = False
        self.pace = ReconcilePace()  # how soon the next reconciliation may come (capture/pace.py)
        self.last_activity = time.monotonic()
        self.vanished: presence.Vanished | None = None  # the worktree is no longer where it was opened
        self.failure: str | None = None  # why the worktree's own tasks last failed (it is cold since)
        self._root: presence.RootId | None = None  # the root folder's device and inode when the watch started
        self._retry = WatchRetry()
        self._cancel: trio.CancelScope | None = None

    @property
    def watching(self) -> bool:
        """Whether a live watcher follows the worktree, so captures can be warm."""
        return self.watcher is not None and self.watcher.live

    @property
    def watch_error(self) -> str | None:
        """Why the watcher could not watch or the worktree's tasks failed (None when nothing went wrong, or
        when a later watch is live: an earlier failure is past)."""
        if self.watcher is not None and self.watcher.error is not None:
            return self.watcher.error
        return None if self.watching else self.failure

    def to_wire(self) -> dict[str, str | None]:
        """Where the worktree stands, for the wire: ``presence`` and the sentence that explains a problem."""
        if self.vanished is not None:
            return self.vanished.to_wire()
        return {"presence": presence.HERE, "problem": None}

    # --- taking a tree -----------------------------------------------------------

    async def take(self, *, exact: bool = False, then: Then | None = None) -> CaptureResult:
        """The worktree's tree now, warm when a live watcher's dirty set can be trusted; callers hold ``lock``.

        ``then``, given the tree, runs on a warm capture's worker thread (saving a hand-off); a cold capture
        leaves it to the caller. A capture that fails as the worktree vanished says so (``not_found``).
        """
        opened = self.info  # a worktree moved meanwhile is at a new place by the time it fails
        try:
            return await self._take(exact, then)
        except Exception as exc:
            await self.raise_clear_error(exc, opened)
            raise

    async def raise_clear_error(self, exc: Exception, opened: WorktreeInfo | None = None) -> None:
        """After ``exc``: ``not_found`` naming the worktree if it vanished (looked at twice: ``rm -rf``
        takes the root last) or changed under the work, begun at ``opened``; the sentence naming
        the store and the object when one is missing."""
        for attempt in range(2):
            await trio.sleep(VANISH_GRACE_S * attempt)
            vanished = await trio.to_thread.run_sync(presence.check, self.info, self._root, limiter=thread_limiter)
            if vanished is not None:
                self._vanish(vanished, self.watcher)
                raise NotFound(vanished.message) from exc
        message = presence.changed_while_captured(exc, self.info, opened)
        if message is not None:  # there again now: deleted and made anew, or moved away and back, meanwhile
            raise NotFound(message) from exc
        missing = missing_object_error(exc, self.info.store_dir, self.info.path)
        if missing is not None:
            raise missing from exc

    async def _take(self, exact: bool, then: Then | None = None) -> CaptureResult:
        self.last_activity = time.monotonic()
        watcher = self.watcher
        if watcher is None or not watcher.live or self.warm is None or exact:
            reason = "exact requested" if exact else ("no watcher" if watcher is None else "watcher not warm")
            if reason == "watcher not warm" and not self.resident.in_process(self.info):
                # The warm path keeps libgit2 indexes; here every capture is git's full scan.
                reason = f"{object_format(self.info.store_dir)} repository"
            if watcher is not None and watcher.live:
                await watcher.sync()  # the events so far filed first: a folder just deleted is no lost watch
            return await self._cold(reason)
        started = time.perf_counter()
        if not await watcher.sync():
            return await self._cold("cookie wait timed out")
        dirty, reasons = watcher.take()
        warm = self.warm
        stats = CaptureStats(scan="watch", phases={"sync": (time.perf_counter() - started) * 1000})
        applied: set[str] = set()
        done: list[float] = []  # when the capture ended, if ``then`` ran after it
        asked = time.perf_counter()

        def look_and_apply() -> str | None:  # on a worker thread: stat calls, small reads, the dirty paths applied
            stats.phases["thread"] = (time.perf_counter() - asked) * 1000
            if reasons or signature_of(warm.sources) != warm.signature:
                return None
            applied.update(dirty | warm.linked | moved_gitlinks(self.info.path, warm.index, warm.gitlinks))
            tree: str | None = warm.tree
            if applied:
                fence_ns = make_fence(os.path.join(self.info.state_dir, "tmp"))  # a file written to disk
                tree = capture_warm(self.info, warm, applied, self.cache, stats, self.size_cap, fence_ns,
                                    self.resident.store(self.info), self.resident.ignores, self.resident.attributes)
            if tree is not None and then is not None:
                done.append(time.perf_counter())
                then(tree)
            return tree

        try:
            tree = await trio.to_thread.run_sync(look_and_apply, limiter=thread_limiter)
        except BaseException:
            self._forget_failed_capture(applied)
            raise
        if tree is None:
            reason = sorted(reasons)[0] if reasons else "ignore rules or user index changed"
            if applied:
                reason = "new paths for a full scan (many, or rules in a folder met anew) or a pruned store"
            return await self._cold(reason, hints=dirty | applied)
        self.needs_reconcile = self.needs_reconcile or bool(applied)
        stats.skipped = dict(warm.skipped)
        stats.ms = ((done[0] if done else time.perf_counter()) - started) * 1000
        stats.count_into(self.counters)
        return CaptureResult(tree=warm.tree, stats=stats, index=None, flagged=set())

    async def _cold(self, reason: str, hints: set[str] | None = None) -> CaptureResult:
        """A full scan, in its turn among them; paths the watcher saw change are re-hashed even if their stat
        data look clean."""
        hints = set(hints or ())
        keep, epoch = await self._watched_scan(reason, hints, late=False)
        async with full_scan_turn(self.scan_dear):  # a warm capture always finds a thread
            if not keep:  # a watch come live while this scan waited for its turn (a fleet's start) serves it
                keep, epoch = await self._watched_scan(reason, hints, late=True)
            basis = await trio.to_thread.run_sync(WarmBasis.read, self.info, keep, limiter=thread_limiter)
            try:
                result = await capture_cold(self.info, self.cache, self.size_cap, hints=hints, resident=self.resident)
            except BaseException:
                self._forget_failed_capture(hints)
                raise
        old, self.warm = self.warm, None
        if keep and (warm := WarmState.from_cold(result, basis.index_mtime_ns, basis.sources, basis.signature,
                                                  basis.rules(epoch))) is not None:
            self.warm = warm
            warm.linked |= old.linked if old is not None else set()  # re-checked until one name is left
        if self.warm is not None and self.warm.same_rules(old):
            self.resident.carry_children(old, self.warm, hints)  # what they answered holds for the new one
        else:
            self.resident.end_children()  # they answered under the rules of the warm state this one replaces
        result.stats.count_into(self.counters)
        return result

    async def _watched_scan(self, reason: str, hints: set[str], *, late: bool) -> tuple[bool, tuple[object, ...] | None]:
        """Ready a full scan whose result becomes the warm state: whether it can (watched), the rules' epoch."""
        if not self.watching or (watcher := self.watcher) is None:
            return False, None
        self.counters[f"cold_reasons.{reason}"] += 1
        if late:
            await watcher.sync()  # its walk's events filed: a folder deleted meanwhile is no lost watch
        await watcher.ensure_whole(always=True)  # watches re-armed before the scan reads the disk
        hints |= watcher.take()[0]  # the full scan covers everything the watcher saw so far
        return True, watcher.rules_epoch()

    def _forget_failed_capture(self, dirty: set[str]) -> None:
        """A capture failed part-way: drop the warm state it may have half changed, keep what it took. The next
        capture is then a full scan that re-hashes ``dirty`` whatever their stat data say."""
        self.warm = None
        if self.watcher is not None:
            self.watcher.put_back(dirty, {"a capture failed"})
        self.counters["captures.failed"] += 1

    def forget_objects(self) -> None:
        """Drop the warm tree, the stat cache and the open store: a prune may have removed objects they name
        (libgit2's object cache may still hold them). The next capture hashes afresh, in a store opened anew."""
        self.warm, self.cache = None, StatCache()
        self.resident.close()

    async def verify(self) -> VerifyResult:
        """The warm state against a full scan now; the scan's result becomes the warm state (a miss brings the
        idle reconciliation back at every quiet moment). Callers hold ``lock``."""
        warm = await self.take()
        started = time.perf_counter()
        disk = await self._cold("verify")
        scan_ms = (time.perf_counter() - started) * 1000
        differences = await watch_misses(self.info, warm.tree, disk.tree, "verify", self.counters)
        self.pace.verified(missed=bool(differences))
        return VerifyResult(differences, scan_ms)

    # --- watching ----------------------------------------------------------------

    async def ensure_watch(self, nursery: trio.Nursery | None, on_change: OnChange) -> None:
        """Watch the worktree where it is now (again, after it moved); no nursery means no watching.
        ``on_change`` hears every batch of changed paths (for subscriptions)."""
        if self.watcher is not None and self.watched != self.info:
            self.forget_watch()
        if self.watched != self.info:  # opened at a new place (or cold): whatever happened before is past
            self.vanished, self.failure, self._retry, self._root = None, None, WatchRetry(), None
        if self._root is None:  # the root as this request finds it: one made anew later is not this one
            self._root = await trio.to_thread.run_sync(presence.root_id, self.info.path, limiter=thread_limiter)
        if nursery is None or self.watcher is not None or not self._retry.due():
            return
        if not facilities.available("inotify"):  # lost since the engine started (inotify_init1 said ENOSYS)
            return
        self.vanished = None

        def changed(paths: set[str], overflow: bool) -> None:
            self.last_activity = time.monotonic()
            on_change(paths, overflow)

        watcher = Watcher(self.info, on_change=changed, need=self._retry.need())
        self.watcher = watcher
        self.watched = self.info
        nursery.start_soon(self._run, watcher)
        if not await wait_for_walk(watcher, dear=False) and watcher.error is not None:  # not one waiting its turn
            self.counters["watch_failures"] += 1

    async def wait_for_watch(self) -> None:
        """Before a checkpoint whose scan is dear: wait for a starting watch's turn too (:mod:`.firstwalk`)."""
        if self.scan_dear and self.watcher is not None and not self.watcher.live:
            await wait_for_walk(self.watcher, dear=True)

    def forget_watch(self) -> None:
        """Stop the watcher and drop the warm tree built from it (it watched another place)."""
        self.close()
        self.watcher, self.warm = None, None

    def close(self) -> None:
        """End the worktree's own tasks (its watcher and the idle reconciliation; its git children end with them)."""
        if self._cancel is not None:
            self._cancel.cancel()

    async def _run(self, watcher: Watcher) -> None:
        """The worktree's supervisor: its watcher, the idle reconciliation and the presence check.

        None of them ends the daemon: a failure is logged with its traceback
        and ends the worktree's tasks; the worktree is cold from then on and
        its watch is tried again (backing off) at a later request.
        """
        current_caller.set(None)  # their thread calls are the daemon's, not the requester's of the moment
        try:
            with trio.CancelScope() as scope:
                self._cancel = scope
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._supervised, "watch", watcher, self._watch_until_it_ends)
                    nursery.start_soon(self._supervised, "idle reconciliation", watcher, self._reconcile_when_idle)
        finally:
            self.resident.end_children()  # they answered for what was watched
        if self.watcher is watcher:
            self.watcher = None
            self.warm = None

    async def _supervised(self, name: str, watcher: Watcher, task: Callable[[Watcher], Awaitable[None]]) -> None:
        """Run one of the worktree's tasks; its failure is logged, and ends the worktree's tasks only."""
        try:
            await task(watcher)
        except Exception as exc:
            if watcher is not self.watcher or watcher.info != self.info:
                return  # the worktree was opened at a new place meanwhile: this watch is being replaced
            vanished = await trio.to_thread.run_sync(presence.check, self.info, self._root, watcher.vanished)
            if vanished is not None:
                log.warning("%s", vanished.message)
                self._vanish(vanished, watcher)
                return
            log.exception("The %s of %s failed; its captures are full scans until it is watched again", name, self.info.path)
            self._failed(f"the {name} failed ({type(exc).__name__}: {exc})", watcher)

    async def _watch_until_it_ends(self, watcher: Watcher) -> None:
        """The watcher itself; its end (the worktree moved or deleted, a kernel limit) ends the worktree's tasks."""
        await watcher.run()
        vanished = await trio.to_thread.run_sync(presence.check, self.info, self._root, watcher.vanished)
        if vanished is not None:
            log.warning("%s", vanished.message)
            self._vanish(vanished, watcher)
        elif watcher.vanished is None:
            if watcher.given_up is not None and watcher.walked:
                self.counters[f"watch_given_up.{watcher.given_up}"] += 1
            if watcher.walked:  # else still no room at the limit: nothing new to count or say
                log.warning("The watch of %s ended (%s); captures there are full scans", self.info.path, watcher.error)
            self._failed(watcher.error or "the watch ended", watcher)
        else:
            self._failed(None, watcher)  # moved away and back: watched again at the next request

    def _failed(self, why: str | None, watcher: Watcher) -> None:
        """The worktree's tasks failed: cold from now on, the watch tried again after a back-off.

        Only the tasks of the current watcher count: those of a watch already
        replaced (the worktree reopened at a new place) change nothing.
        """
        if watcher is not self.watcher:
            return
        self.counters["worktree_task_failures"] += why is not None and watcher.walked
        self.failure = why
        self._retry.failed(why is not None, at_limit=watcher.given_up == "watch_limit", need=watcher.need)
        self.warm = None
        if self._cancel is not None:
            self._cancel.cancel()

    def _vanish(self, vanished: presence.Vanished, watcher: Watcher | None) -> None:
        """The worktree is no longer where it was opened: stop its tasks and keep nothing read from the old place."""
        if watcher is not self.watcher:
            return
        if self.vanished is None:
            self.counters[f"worktrees_{vanished.how}"] += 1
        self.vanished, self.warm, self.needs_reconcile, self.cache = vanished, None, False, StatCache()
        self.resident.close()
        if self._cancel is not None:
            self._cancel.cancel()

    async def _reconcile_when_idle(self, watcher: Watcher) -> None:
        """After warm captures, once the worktree is quiet (and its pace allows), check the warm tree against a
        full scan: each difference is a change the watcher missed (``watch_miss``, which must stay 0); the scan's
        result is kept. Each round also checks that the worktree is still where it was opened."""
        while True:
            await trio.sleep(PRESENCE_CHECK_S)
            vanished = await trio.to_thread.run_sync(presence.check, self.info, self._root, watcher.vanished)
            if vanished is not None:
                raise FileNotFoundError(vanished.message)  # the supervisor records it
            self.resident.end_idle_children()
            if not self._due_for_reconcile():
                continue
            async with full_scans:  # its turn first, not under the lock: a checkpoint here never waits for it
                if not self._due_for_reconcile():
                    continue
                async with self.lock:
                    warm = await self._take(False)
                    if warm.stats.scan != "watch":
                        self.needs_reconcile = False
                        continue
                    began, seen = time.monotonic(), await watcher.seen_since_taken()
                    cold = await self._cold("idle reconciliation")
                    seen |= await watcher.seen_since_taken()
                    self.needs_reconcile = False
                    misses = await watch_misses(self.info, warm.tree, cold.tree, "idle reconciliation",
                                                self.counters, seen)
                    self.pace.done(began, missed=bool(misses))
                    self.counters["reconciliations"] += 1  # once its misses and pace are recorded too
            self.last_activity = time.monotonic()

    def _due_for_reconcile(self) -> bool:
        quiet = time.monotonic() - self.last_activity >= RECONCILE_IDLE_S
        return self.needs_reconcile and quiet and self.watching and not self.lock.locked() and self.pace.due()
