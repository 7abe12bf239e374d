"""Watching one worktree with inotify, and knowing when the watch can be trusted.

Events are hints: they name paths to re-examine, never what happened to them.
A capture first syncs through a cookie (:mod:`.cookies`). The watcher talks to
inotify itself (:mod:`.inotify` says why), walks new folders on a worker thread
(:mod:`.watchwalk`) and leaves out folders git ignores whole (:mod:`.unwatched`).
Watches are keyed by descriptor (``IN_IGNORED`` drops one; a folder still there
is watched again, dirty); an overflow, a lost watch (the kernel's count, from
``/proc/self/fdinfo``, differs) or a folder seen twice (a bind mount) makes it
suspect: the next capture is a full scan, after a re-arm from a new walk.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import trio

from snapshotd.capture.cookies import Cookies
from snapshotd.capture.inotify import (
    IN_CREATE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    IN_UNMOUNT,
    Inotify,
)
from snapshotd.capture.presence import GONE, MOVED
from snapshotd.capture.unwatched import UnwatchedFolders
from snapshotd.capture.watchpaths import IGNORE_RULES, classify
from snapshotd.capture.watchsupply import supply
from snapshotd.capture.watchwalk import Budget, watch_each, watch_tree
from snapshotd.errors import WatchGivenUp
from snapshotd.settings import watch_ceiling
from snapshotd.store.identity import WorktreeInfo

# Events after which the kernel's set of watches may differ from the watcher's.
_WATCH_EVENTS = IN_ISDIR | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT

log = logging.getLogger(__name__)
_T = TypeVar("_T")

SYNC_TIMEOUT_S = 2.0
WATCH_STEP_S = 0.005
NEW_FOLDERS_BUDGET_S = 5.0  # a batch's new folders watched for longer than this: stop, scan and re-arm
OVERFLOW_REASON = "kernel event queue overflowed"
LOST_REASON = "inotify watches lost"
UNIGNORED_REASON = "a folder git ignored whole no longer is"

class Watcher:
    """The live change feed of one worktree.

    ``dirty`` holds worktree-relative paths changed since the last capture took
    them; ``full_scan_reasons`` says why the next capture must scan everything
    (empty when the dirty set can be trusted).
    """

    def __init__(
        self,
        info: WorktreeInfo,
        on_change: Callable[[set[str], bool], None] | None = None,
        *,
        ceiling: int | None = None,
        need: int = 0,
    ) -> None:
        self.info = info
        self.need = need  # folders the worktree needs more than (its last walk stopped at the limit), or 0
        self.ceiling = watch_ceiling(ceiling)
        self.root = info.path
        self.cookies = Cookies(info.state_dir)
        self.cookie_dir = self.cookies.dir
        self.dirty: set[str] = set()
        self.full_scan_reasons: set[str] = {"watch not started"}
        self.live = False
        self.events = 0
        self.rearms = 0
        self.kernel_checks = 0  # times the kernel's watches were counted (a read of all of them)
        self.error: str | None = None
        self.suspect: str | None = None  # why the watch may have gaps; cleared by a re-arm that proves whole
        self.vanished: str | None = None  # the root itself was moved or deleted (presence.MOVED, GONE): the watch ends
        self._on_change = on_change
        self._started = trio.Event()
        self._walking = trio.Event()  # the first walk's turn came (walks take turns: watchsupply)
        self._git_dir = os.path.realpath(info.git_dir) if info.git_dir else None
        self._inotify: Inotify | None = None
        self._folder_of: dict[int, str] = {}  # wd -> absolute folder path
        self._wd_of: dict[str, int] = {}  # absolute folder path -> wd
        self._unchecked = True  # events that can change the set of watches came since the kernel's were counted
        self._arming: trio.Event | None = None  # set while a walk runs on a worker thread (it owns the tables)
        self._halt = threading.Event()  # the watch is ending: a walk still running stops at its next folder
        self._new: list[str] = []  # folders that appeared in the batch being filed, to walk after it
        self._gone: list[str] = []  # folders moved away in that batch, to unwatch before the walk
        self.given_up: str | None = None  # the limit that ended the watch (WatchGivenUp.reason)
        self.walked = True  # False when it ended before its walk (no room for the ``need`` known)
        self._limit: WatchGivenUp | None = None  # a limit met by a capture's re-arm, for the loop to end on
        self._loop: trio.CancelScope | None = None
        self.unwatched = UnwatchedFolders(info)  # folders git ignores whole, left out of the walks
        self.rule_events = 0  # events that named ignore rules or the configuration
        self.rule_changes = 0  # those, and events that named attribute rules

    # --- classification ----------------------------------------------------------

    def _classify(self, path: str, changed: set[str]) -> None:
        """Turn one absolute path from the watcher into dirty paths or scan reasons (a cookie is neither)."""
        seen, reasons = self.cookies.seen(path), self.full_scan_reasons
        rules = None if seen else classify(path, self.root, self._git_dir, reasons, changed)
        self.rule_changes += rules is not None
        if rules == IGNORE_RULES:
            self.rule_events += 1
            self.unwatched.note_rules(path)

    def rules_epoch(self) -> tuple[object, ...] | None:
        """Equal while no event named a rule file and the watch had no gap (None while it may have one)."""
        return (self, self.rearms, self.rule_changes) if self.live and self.suspect is None else None

    def take(self) -> tuple[set[str], set[str]]:
        """Hand the dirty set and the scan reasons to a capture, and start a new window."""
        taken, self.dirty, self.full_scan_reasons = (self.dirty, self.full_scan_reasons), set(), set()
        return taken

    def put_back(self, dirty: set[str], reasons: set[str]) -> None:
        """Return what :meth:`take` handed to a capture that failed, so the next one sees it again."""
        self.dirty |= dirty
        self.full_scan_reasons |= reasons

    async def seen_since_taken(self) -> set[str]:
        """The paths seen changed since the last :meth:`take` (an agent writing during a reconciliation's scan)."""
        return set(self.dirty) if await self.sync() else set()

    # --- the set of watches --------------------------------------------------------

    def to_watch(self, folder_fd: int | None, rel: str, names: list[str], rules: bool = False) -> list[str]:
        return self.unwatched.to_watch(folder_fd, rel, names, rules)

    def held(self) -> int:
        """How many folders the watch holds (the walk's ceiling counts these)."""
        return len(self._folder_of)

    def watch_folder(self, folder_fd: int, path: str) -> bool:
        """Watch one open folder under ``path``; False when the kernel refused it (a limit raises instead)."""
        assert self._inotify is not None
        try:
            wd = self._inotify.add(folder_fd)
        except OSError as exc:
            self.suspect = f"a folder could not be watched ({exc.strerror}): {path}"
            return False
        known = self._folder_of.get(wd)
        if known is not None and known != path:
            if os.path.lexists(known) and self._wd_of.get(known) == wd:
                self.suspect = f"one folder appears twice in the worktree: {known} and {path}"
                return True
            self._wd_of.pop(known, None)
        self._folder_of[wd] = path
        self._wd_of[path] = wd
        return True

    def arm(self, room: Callable[[], int] | None = None) -> None:
        """(Re)build the whole set of watches from a walk of the worktree, dropping stale ones; :attr:`suspect`
        is cleared only if the kernel's count then equals the folders held. ``room``: :mod:`.watchsupply`."""
        assert self._inotify is not None
        self.suspect = None
        before = dict(self._folder_of)
        self._folder_of.clear()
        self._wd_of.clear()
        self.unwatched.start_over(self.rule_events)
        try:
            watch_tree(self, self.root, "", Budget(self.ceiling, halt=self._halt, room=room))
        except BaseException:
            self.suspect = "a walk of the worktree was interrupted"
            raise
        extras = [self.cookie_dir]
        if self._git_dir is not None:
            extras += [self._git_dir, os.path.join(self._git_dir, "info")]
        watch_each(self, extras)  # folders outside the walk
        stale = before.keys() | (self._inotify.kernel_watches() if self.rearms else set())  # none in a new instance
        for wd in stale - self._folder_of.keys():
            self._inotify.remove(wd)
        self.rearms += 1
        if self.suspect is None:
            self.check(always=True)

    def check(self, always: bool = False) -> bool:
        """Whether every watch the watcher counts on is still in the kernel; marks it suspect if not. Asked (7 ms
        at 20,000 files) only after an event about folders, which alone change the watches, unless ``always``."""
        if self._inotify is None:
            return False
        if self.suspect is None and (always or self._unchecked):
            self._unchecked = False
            self.kernel_checks += 1
            kernel = self._inotify.kernel_watch_count()
            if kernel != len(self._folder_of):
                self.suspect = f"{LOST_REASON}: the kernel holds {kernel}, the watcher {len(self._folder_of)}"
        return self.suspect is None

    async def ensure_whole(self, *, always: bool = False) -> None:
        """Re-arm when the watch may have gaps, and ask the next capture for a full scan if so: before a capture
        trusts the dirty set, and before every full scan (``always``: folders left out decided again). Walks run
        on a worker thread (a rename loop cannot hold the loop); events wait in the kernel meanwhile."""
        while self._arming is not None:
            await self._arming.wait()  # another walk is running: it may serve this one too
        if self._inotify is None or not self.live:
            return  # not live: the first walk is still running, and captures are cold until it ends
        if always and self.suspect is None:
            await self._owning(self._recheck_unwatched)
        if self.suspect is None and (always or self._unchecked):
            await self._owning(self.check, always)  # the kernel's list of 20,000 watches takes tens of ms to read
        if self._inotify is None or not self.live or self.suspect is None:
            return
        reason = self.suspect
        log.log(logging.INFO if reason == UNIGNORED_REASON else logging.WARNING,
                "The watch of %s may have gaps (%s); watching it again, next capture scans in full", self.root, reason)
        try:
            async with supply.walks:
                await self._owning(self.arm, supply.room(self))
        except WatchGivenUp as exc:  # past a limit now: the watch ends (its loop is told), this capture goes on cold
            self._limit, self.live = exc, False
            if self._loop is not None:
                self._loop.cancel()
        self.full_scan_reasons.add(reason.split(":")[0] if reason else LOST_REASON)

    def _recheck_unwatched(self) -> None:
        """After the rules or the index changed: re-arm if a folder left out is git's again; unwatch newly ignored."""
        unignored, ignored = self.unwatched.recheck(self.rule_events, self.root, self._wd_of)
        if unignored:
            self.suspect = UNIGNORED_REASON
        elif ignored:
            self._unwatch_under([f"{self.root}/{rel}" for rel in ignored])
            self.unwatched.folders.update(ignored)

    # --- running -----------------------------------------------------------------

    async def run(self) -> None:
        """Watch until cancelled; :meth:`wait_started` returns once the watches are in place."""
        served = False  # whether the first walk ended whole (watchsupply counts the watches given back)
        try:
            self.cookies.open()
            self._inotify = Inotify()
            supply.join(self)
            async with supply.walks:
                self._walking.set()
                supply.fits(self, self.need)
                await trio.to_thread.run_sync(self.arm, supply.room(self))
            self.unwatched.tracked.release()  # read again when a new folder asks; let go when idle (recheck)
            self.live = served = True
            self._started.set()
            with trio.CancelScope() as self._loop:
                while self.vanished is None:
                    await trio.lowlevel.wait_readable(self._inotify.fd)
                    with trio.move_on_after(WATCH_STEP_S):  # let a burst gather into one batch, unless a sync waits
                        await self.cookies.requested.wait()
                    self.cookies.gather()  # a cookie placed from here on is read at the next turn, at once
                    while self._arming is not None:  # the walk owns the watch tables until it ends
                        await self._arming.wait()
                    self._absorb(self._inotify.read(once=True))  # a burst of 20,000 events: a piece at a time
                    if self._new or self._gone:
                        await self._update_watches()
                    self.cookies.wake()
            if self._limit is not None:
                raise self._limit
        except WatchGivenUp as exc:  # a limit: named, and the worktree cold (its watches released below)
            self.given_up, self.walked, self.error = exc.reason, exc.walked, str(exc)
            self.need = max(self.need, len(self._folder_of))
            self.full_scan_reasons.add("watcher failed")
        except Exception as exc:  # the watch itself failed: fall back to full scans
            self.error = f"{type(exc).__name__}: {exc}"
            self.full_scan_reasons.add("watcher failed")
        finally:
            self.live = False
            self._started.set()
            self._walking.set()
            self._halt.set()
            with trio.CancelScope(shield=True):  # a capture's re-arm on a worker thread stops at its next folder
                while self._arming is not None:
                    await self._arming.wait()
            self.cookies.close()
            self.unwatched.close()
            if self._inotify is not None:
                supply.leave(self, served=served)
                self._inotify.close()
                self._inotify = None

    async def _owning(self, work: Callable[..., _T], *args: object) -> _T:
        """``work(*args)`` on a worker thread that owns the watch tables meanwhile (events wait in the kernel);
        not behind the project's limiter: captures wait for the watcher, never it for their hashing."""
        while self._arming is not None:
            await self._arming.wait()
        self._arming = trio.Event()
        try:
            return await trio.to_thread.run_sync(work, *args)
        finally:
            self._arming.set()
            self._arming = None

    async def _update_watches(self) -> None:
        """Drop the watches of folders moved away and watch the new ones of the last batch, off the loop."""
        gone, self._gone = self._gone, []
        new, self._new = self._new, []
        budget = Budget(self.ceiling, time.monotonic() + NEW_FOLDERS_BUDGET_S, self._halt)
        await self._owning(self._apply_moves, gone, new, budget)

    def _apply_moves(self, gone: list[str], new: list[str], budget: Budget) -> None:
        """Folders moved away lose their watches first (a new one may come at the same path); then the new are walked."""
        self.unwatched.begin(self.rule_events, full=False)
        if gone:
            self._unwatch_under(gone)
        for rel in sorted({os.path.relpath(path, self.root) for path in new}):  # parents first: theirs covers all
            inside = not rel.startswith("..") and rel != "." and f"{self.root}/{rel}" not in self._wd_of
            if inside and self.unwatched.met_anew(rel):
                watch_tree(self, self.root, rel, budget)

    async def wait_started(self, timeout: float, queued: float | None = None) -> bool:
        """Wait until the watch is confirmed live (or failed); True when live. ``timeout`` counts from the first
        walk's turn among the walks, itself waited for at most ``queued`` (``timeout`` if None; not come by
        then: no wait for the walk)."""
        with trio.move_on_after(timeout if queued is None else queued):
            await self._walking.wait()
        with trio.move_on_after(timeout if self._walking.is_set() else 0):
            await self._started.wait()
        return self.live

    def _absorb(self, events: list[tuple[int, int, str]]) -> None:
        """File one batch of raw events: dirty paths, new folders to watch, lost watches."""
        changed: set[str] = set()
        overflow = False
        for wd, mask, name in events:
            self.events += 1
            if mask & IN_Q_OVERFLOW:
                overflow = True
                self.full_scan_reasons.add(OVERFLOW_REASON)
                self.suspect = OVERFLOW_REASON
                continue
            folder = self._folder_of.get(wd)
            if folder is None:
                continue  # a watch already dropped (a folder moved away or deleted)
            if mask & _WATCH_EVENTS and folder != self.cookie_dir:
                self._unchecked = True
            if mask & IN_IGNORED:
                self._dropped(wd, folder, changed)
                continue
            if folder == self.root and not name and mask & (IN_MOVE_SELF | IN_DELETE_SELF | IN_UNMOUNT):
                self.vanished = MOVED if mask & IN_MOVE_SELF else GONE
                self.full_scan_reasons.add("worktree root changed")
                continue
            path = f"{folder}/{name}" if name else folder
            if mask & IN_ISDIR:
                if mask & IN_MOVED_FROM:
                    self._gone.append(path)  # its watches (20,000 for a big tree) are dropped off the loop
                if mask & (IN_CREATE | IN_MOVED_TO):
                    self._new.append(path)
            self._classify(path, changed)
        self.dirty |= changed
        if (changed or overflow) and self._on_change is not None:
            self._on_change(changed, overflow)

    def _dropped(self, wd: int, folder: str, changed: set[str]) -> None:
        """The kernel dropped a watch: the folder went, or (if it is still there) it must be watched again."""
        del self._folder_of[wd]
        if self._wd_of.get(folder) == wd:
            del self._wd_of[folder]
        rel = os.path.relpath(folder, self.root)
        if folder in self._wd_of or rel.startswith("..") or not os.path.isdir(folder) or os.path.islink(folder):
            return
        if rel == ".":
            self.suspect = f"{LOST_REASON}: the worktree folder's own watch"
            return
        self._new.append(folder)  # a new folder at the old path; what was written before is in a full walk of it
        self._classify(folder, changed)

    def _unwatch_under(self, paths: list[str]) -> None:
        """Folders moved away: their watches would report under stale paths, so drop them (a worker thread)."""
        assert self._inotify is not None
        exact, prefixes = set(paths), tuple(path + "/" for path in paths)
        for path in paths:
            self.unwatched.forget_under(os.path.relpath(path, self.root))
        for wd, folder in list(self._folder_of.items()):
            if folder in exact or folder.startswith(prefixes):
                self._inotify.remove(wd)
                del self._folder_of[wd]
                self._wd_of.pop(folder, None)

    async def sync(self, timeout: float = SYNC_TIMEOUT_S) -> bool:
        """Write a cookie and wait for its event: True when every earlier write has been seen.

        A watch found with gaps is re-armed here, and the next capture told to scan everything.
        """
        synced = await self.cookies.wait(timeout) and self.live
        if synced:
            await self.ensure_whole()
        return synced
