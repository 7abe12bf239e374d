"""Watching one worktree with inotify, and knowing when the watch can be trusted.

Events are hints: they name paths to re-examine, never what happened to them.
Before a capture trusts the dirty set it syncs with the watcher: it writes a
cookie file and waits until the cookie's own event comes back, so every write
that finished before the request has been read off the kernel's queue.

:mod:`snapshotd.capture.cookies` holds that sync point. The watcher talks to inotify itself (:mod:`snapshotd.capture.inotify` says
why). Here:

- every folder is opened by name under its parent's descriptor with
  ``O_NOFOLLOW`` and watched through that descriptor, so a symlink is an entry
  and never a folder to descend, and only the worktree is watched;
- watches are keyed by descriptor; the kernel's ``IN_IGNORED`` drops one, and a
  folder that still exists without a watch is watched again and marked dirty;
- ``IN_Q_OVERFLOW`` asks for a full scan and a re-arm;
- at every sync the kernel's own count of this instance's watches
  (``/proc/self/fdinfo``) must equal the folders the watcher holds; any
  difference, a folder that could not be watched, or a folder seen twice (a
  bind mount) makes the watcher suspect: the next capture is a full scan and
  the watch is re-armed from a new walk of the worktree first.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

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
    OPEN_FOLDER,
    Inotify,
    open_in_tree,
)
from snapshotd.capture.presence import GONE, MOVED
from snapshotd.store.identity import WorktreeInfo

log = logging.getLogger(__name__)

SYNC_TIMEOUT_S = 2.0
WATCH_STEP_S = 0.005
IGNORE_FILES = (".gitignore",)
ATTRIBUTES_FILE = ".gitattributes"  # line endings and filters: a change may give unchanged files new blobs
OVERFLOW_REASON = "kernel event queue overflowed"
LOST_REASON = "inotify watches lost"

class Watcher:
    """The live change feed of one worktree.

    ``dirty`` holds worktree-relative paths changed since the last capture took
    them; ``full_scan_reasons`` says why the next capture must scan everything
    (empty when the dirty set can be trusted).
    """

    def __init__(self, info: WorktreeInfo, on_change: Callable[[set[str], bool], None] | None = None) -> None:
        self.info = info
        self.root = info.path
        self.cookies = Cookies(info.state_dir)
        self.cookie_dir = self.cookies.dir
        self.dirty: set[str] = set()
        self.full_scan_reasons: set[str] = {"watch not started"}
        self.live = False
        self.events = 0
        self.rearms = 0
        self.error: str | None = None
        self.suspect: str | None = None  # why the watch may have gaps; cleared by a re-arm that proves whole
        self.vanished: str | None = None  # the root itself was moved or deleted (presence.MOVED, GONE): the watch ends
        self._on_change = on_change
        self._started = trio.Event()
        self._git_dir = os.path.realpath(info.git_dir) if info.git_dir else None
        self._inotify: Inotify | None = None
        self._folder_of: dict[int, str] = {}  # wd -> absolute folder path
        self._wd_of: dict[str, int] = {}  # absolute folder path -> wd
        self._unchecked = True  # events other than cookies came since the kernel's watches were counted
        self._arming: trio.Event | None = None  # set while a re-arming walk runs on a worker thread

    @property
    def cookie_waits(self) -> int:
        """How many syncs this watch has made (for ``status``)."""
        return self.cookies.waits

    # --- classification ----------------------------------------------------------

    def _classify(self, path: str, changed: set[str]) -> None:
        """Turn one absolute path from the watcher into dirty paths or scan reasons."""
        if self.cookies.seen(path):
            return
        if self._git_dir is not None and (path == self._git_dir or path.startswith(self._git_dir + os.sep)):
            rel_git = os.path.relpath(path, self._git_dir)
            if rel_git == "index":
                self.full_scan_reasons.add("user index changed")
            elif rel_git in ("info/exclude", "config", "config.worktree", "info/sparse-checkout"):
                self.full_scan_reasons.add("ignore rules or config changed")
            return
        if path != self.root and not path.startswith(self.root + os.sep):
            return
        rel = os.path.relpath(path, self.root)
        if rel == ".":
            self.full_scan_reasons.add("worktree root changed")
            return
        parts = rel.split(os.sep)
        if ".git" in parts:
            # Inside a nested repository's git dir: its checked-out commit (the gitlink) may have moved.
            at = parts.index(".git")
            if at == 0:
                return
            rel = "/".join(parts[:at])
        else:
            rel = "/".join(parts)
            if parts[-1] in IGNORE_FILES:
                self.full_scan_reasons.add("ignore rules changed")
            elif parts[-1] == ATTRIBUTES_FILE:
                self.full_scan_reasons.add("attribute rules changed")
        changed.add(rel)

    def take(self) -> tuple[set[str], set[str]]:
        """Hand the dirty set and the scan reasons to a capture, and start a new window."""
        dirty, reasons = self.dirty, self.full_scan_reasons
        self.dirty, self.full_scan_reasons = set(), set()
        return dirty, reasons

    def put_back(self, dirty: set[str], reasons: set[str]) -> None:
        """Return what :meth:`take` handed to a capture that failed, so the next one sees it again."""
        self.dirty |= dirty
        self.full_scan_reasons |= reasons

    # --- the set of watches --------------------------------------------------------

    @staticmethod
    def _descend(rel_parent: str, name: str) -> bool:
        """Whether the walk watches folder ``name`` under ``rel_parent`` (worktree-relative).

        The worktree's own git dir is watched apart (only what changes the
        rules); in a nested repository's git dir only ``refs`` matters, as it
        moves the gitlink.
        """
        if not rel_parent:
            return name != ".git"
        parts = rel_parent.split("/")
        if ".git" not in parts:
            return True
        return len(parts) > parts.index(".git") + 1 or name == "refs"

    def _watch(self, folder_fd: int, path: str) -> bool:
        """Watch one open folder under ``path``; False when the kernel refused it."""
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

    def _walk(self, folder_fd: int, path: str, rel: str) -> int:
        """Watch the folder open as ``folder_fd`` and every folder below it; how many were watched."""
        if not self._watch(folder_fd, path):
            return 0
        count = 1
        try:
            entries = [entry.name for entry in os.scandir(folder_fd) if entry.is_dir(follow_symlinks=False)]
        except OSError:
            return count
        for name in entries:
            if not self._descend(rel, name):
                continue
            try:
                child = os.open(name, OPEN_FOLDER, dir_fd=folder_fd)
            except OSError:  # gone, replaced by a link, or unreadable (git cannot read it either)
                continue
            try:
                count += self._walk(child, f"{path}/{name}", f"{rel}/{name}" if rel else name)
            finally:
                os.close(child)
        return count

    def _watch_tree(self, rel: str) -> int:
        """Watch the worktree folder ``rel`` ("" is the root) and everything below it; how many were watched."""
        try:
            fd = open_in_tree(self.root, rel)
        except OSError as exc:
            if not rel:
                self.suspect = f"the worktree folder could not be opened ({exc.strerror})"
            return 0
        try:
            return self._walk(fd, os.path.join(self.root, rel) if rel else self.root, rel)
        finally:
            os.close(fd)

    def _watch_extra(self, path: str) -> None:
        """Watch one folder outside the walk (git dir, its ``info``, the cookies), on its own."""
        try:
            fd = os.open(path, OPEN_FOLDER)
        except OSError:
            return
        try:
            self._watch(fd, path)
        finally:
            os.close(fd)

    def arm(self) -> None:
        """(Re)build the whole set of watches from a walk of the worktree, dropping stale ones.

        Clears :attr:`suspect` only when the kernel's count then equals the
        folders held; otherwise the watcher stays suspect and captures stay cold.
        """
        assert self._inotify is not None
        self.suspect = None
        before = dict(self._folder_of)
        self._folder_of.clear()
        self._wd_of.clear()
        self._watch_tree("")
        extras = [self.cookie_dir]
        if self._git_dir is not None:
            extras += [self._git_dir, os.path.join(self._git_dir, "info")]
        for extra in extras:
            self._watch_extra(extra)
        for wd in (before.keys() | self._inotify.kernel_watches()) - self._folder_of.keys():
            self._inotify.remove(wd)
        self.rearms += 1
        if self.suspect is None:
            self.check(always=True)

    def check(self, *, always: bool = False) -> bool:
        """Whether every watch the watcher counts on is still in the kernel; marks it suspect if not.

        Watches change only with events (or the watcher's own doing), so the
        kernel is asked (a few microseconds a watch) only after a burst of
        events other than cookies, unless ``always``.
        """
        if self._inotify is None:
            return False
        if self.suspect is None and (always or self._unchecked):
            self._unchecked = False
            kernel = self._inotify.kernel_watch_count()
            if kernel != len(self._folder_of):
                self.suspect = f"{LOST_REASON}: the kernel holds {kernel}, the watcher {len(self._folder_of)}"
        return self.suspect is None

    async def ensure_whole(self, *, always: bool = False) -> None:
        """Re-arm when the watch may have gaps, and ask the next capture for a full scan if so.

        Called before a capture trusts the dirty set (after a burst) and
        before every full scan (``always``), so the scan that follows (the
        next capture at the latest) covers whatever the lost watches missed.
        The walk runs on a worker thread, so a tree being churned (a hostile
        rename loop, a checkout) cannot hold the event loop; events wait in
        the kernel's queue meanwhile.
        """
        if self._arming is not None:
            await self._arming.wait()  # another capture is re-arming: its walk serves this one too
        if self._inotify is None or not self.live or self.check(always=always):
            return  # not live: the first walk is still running, and captures are cold until it ends
        reason = self.suspect
        log.warning("The watch of %s may have gaps (%s); watching it again, next capture scans in full", self.root, reason)
        self._arming = trio.Event()
        try:
            await trio.to_thread.run_sync(self.arm)
        finally:
            self._arming.set()
            self._arming = None
        self.full_scan_reasons.add(reason.split(":")[0] if reason else LOST_REASON)

    # --- running -----------------------------------------------------------------

    async def run(self) -> None:
        """Watch until cancelled; :meth:`wait_started` returns once the watches are in place."""
        try:
            self.cookies.open()
            self._inotify = Inotify()
            await trio.to_thread.run_sync(self.arm)
            self.live = True
            self._started.set()
            while self.vanished is None:
                await trio.lowlevel.wait_readable(self._inotify.fd)
                await trio.sleep(WATCH_STEP_S)  # let a burst gather into one batch
                while self._arming is not None:  # the walk owns the watch tables until it ends
                    await self._arming.wait()
                self._absorb(self._inotify.read())
        except Exception as exc:  # the watch itself failed: fall back to full scans
            self.error = f"{type(exc).__name__}: {exc}"
            self.full_scan_reasons.add("watcher failed")
        finally:
            self.live = False
            self._started.set()
            self.cookies.close()
            if self._inotify is not None:
                self._inotify.close()
                self._inotify = None

    async def wait_started(self, timeout: float) -> bool:
        """Wait until the watch is confirmed live (or failed); True when live."""
        with trio.move_on_after(timeout):
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
            self._unchecked = self._unchecked or folder != self.cookie_dir
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
                    self._unwatch_under(path)
                if mask & (IN_CREATE | IN_MOVED_TO):
                    self._watch_new(path)
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
        self._watch_new(folder)  # a new folder at the old path; what was written before is in a full walk of it
        self._classify(folder, changed)

    def _watch_new(self, path: str) -> None:
        """A folder appeared in the worktree: watch it and everything already below it."""
        rel = os.path.relpath(path, self.root)
        if rel.startswith("..") or rel == ".":
            return
        parent, _, name = rel.rpartition("/")
        if self._descend(parent, name):
            self._watch_tree(rel)

    def _unwatch_under(self, path: str) -> None:
        """A folder moved away: its watches would report under a stale path, so drop them."""
        assert self._inotify is not None
        prefix = path + "/"
        for wd, folder in list(self._folder_of.items()):
            if folder == path or folder.startswith(prefix):
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
