"""Watching one worktree with watchfiles, and knowing when the watch can be trusted.

Events are hints: they name paths to re-examine, never what happened to them.
Before a capture trusts the dirty set it syncs with the watcher: it writes a
cookie file and waits until the cookie's own event comes back, so every write
that finished before the request has been read off the kernel's queue.

Watchfiles does not report an inotify queue overflow and can miss files made
inside a just-created folder, so the capture treats every folder event as
"walk this folder to its depth", and the watcher asks for a full scan when a
window holds so many changes that the kernel queue may have overflowed, after
any error or restart of the watch, and when ignore rules or the user's index
change.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
from collections.abc import Callable
from pathlib import Path

import trio
import watchfiles

from .worktree import WorktreeInfo

COOKIE_PREFIX = "cookie-"
SYNC_TIMEOUT_S = 2.0
WATCH_DEBOUNCE_MS = 30
WATCH_STEP_MS = 5
RUST_TIMEOUT_MS = 100
IGNORE_FILES = (".gitignore",)
OVERFLOW_REASON = "burst large enough to overflow the kernel queue"


def _queue_limit() -> int:
    try:
        return int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    except (OSError, ValueError):
        return 16384


QUEUE_LIMIT = _queue_limit()


class Watcher:
    """The live change feed of one worktree.

    ``dirty`` holds worktree-relative paths changed since the last capture took
    them; ``full_scan_reasons`` says why the next capture must scan everything
    (empty when the dirty set can be trusted).
    """

    def __init__(self, info: WorktreeInfo, on_change: Callable[[set[str], bool], None] | None = None) -> None:
        self.info = info
        self.root = info.path
        self.cookie_dir = os.path.join(os.path.realpath(info.state_dir), "cookies")
        self.dirty: set[str] = set()
        self.full_scan_reasons: set[str] = {"watch not started"}
        self.live = False
        self.events = 0
        self.cookie_waits = 0
        self.window_changes = 0
        self.error: str | None = None
        self._on_change = on_change
        self._counter = itertools.count()
        self._cookie_events: dict[str, trio.Event] = {}
        self._started = trio.Event()
        self._git_dir = os.path.realpath(info.git_dir) if info.git_dir else None

    # --- classification ----------------------------------------------------------

    def _classify(self, path: str, changed: set[str]) -> None:
        """Turn one absolute path from the watcher into dirty paths or scan reasons."""
        if path.startswith(self.cookie_dir + os.sep):
            name = os.path.basename(path)
            event = self._cookie_events.pop(name, None)
            if event is not None:
                event.set()
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
        changed.add(rel)

    @staticmethod
    def _real_path(path: str, real_parents: dict[str, str]) -> str:
        """The event's path through real folders only.

        The watcher follows symlinks to folders and may report a change under
        a link's name (``link_to_dir/x`` for ``dir/x``); the capture never
        looks through links, so the change is filed under the real path too.
        (The literal path is kept as well: when a folder was just replaced by a
        link, the event is about what used to be there.)
        """
        parent, _, name = path.rpartition(os.sep)
        real = real_parents.get(parent)
        if real is None:
            real = real_parents[parent] = os.path.realpath(parent)
        return real + os.sep + name if real != parent else path

    def take(self) -> tuple[set[str], set[str]]:
        """Hand the dirty set and the scan reasons to a capture, and start a new window."""
        dirty, reasons = self.dirty, self.full_scan_reasons
        self.dirty, self.full_scan_reasons = set(), set()
        self.window_changes = 0
        return dirty, reasons

    # --- running -----------------------------------------------------------------

    def _paths(self) -> list[str]:
        paths = [self.root]
        for extra in (self._git_dir, self.cookie_dir):
            if extra and not any(extra == p or extra.startswith(p + os.sep) for p in paths):
                paths.append(extra)
        return paths

    async def run(self) -> None:
        """Watch until cancelled; :meth:`wait_started` returns once events are flowing."""
        os.makedirs(self.cookie_dir, exist_ok=True)
        for stale in os.listdir(self.cookie_dir):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.cookie_dir, stale))
        stop = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._announce_start)
                async for changes in watchfiles.awatch(
                    *self._paths(),
                    watch_filter=None,
                    debounce=WATCH_DEBOUNCE_MS,
                    step=WATCH_STEP_MS,
                    rust_timeout=RUST_TIMEOUT_MS,
                    stop_event=stop,
                    ignore_permission_denied=True,
                ):
                    self._absorb(changes)
        except Exception as exc:  # the watch itself failed: fall back to full scans
            self.error = f"{type(exc).__name__}: {exc}"
            self.live = False
            self.full_scan_reasons.add("watcher failed")
        finally:
            self.live = False
            self._started.set()
            for event in self._cookie_events.values():
                event.set()

    async def _announce_start(self) -> None:
        """Writes before the first iteration are lost, so confirm the watch with a cookie."""
        while not self.live:
            if await self.sync(timeout=0.5):
                self.live = True
                self._started.set()
                return

    async def wait_started(self, timeout: float) -> bool:
        """Wait until the watch is confirmed live (or failed); True when live."""
        with trio.move_on_after(timeout):
            await self._started.wait()
        return self.live

    def _absorb(self, changes: set[tuple[watchfiles.Change, str]]) -> None:
        changed: set[str] = set()
        real_parents: dict[str, str] = {}
        for _, path in changes:
            self.events += 1
            self._classify(path, changed)
            real = self._real_path(path, real_parents)
            if real != path:
                self._classify(real, changed)
        self.window_changes += len(changed)
        overflow = self.window_changes >= QUEUE_LIMIT // 2
        if overflow:
            self.full_scan_reasons.add(OVERFLOW_REASON)
        self.dirty |= changed
        if changed and self._on_change is not None:
            self._on_change(changed, overflow)

    async def sync(self, timeout: float = SYNC_TIMEOUT_S) -> bool:
        """Write a cookie and wait for its event: True when every earlier write has been seen."""
        name = f"{COOKIE_PREFIX}{os.getpid()}-{next(self._counter)}-{secrets.token_hex(3)}"
        event = trio.Event()
        self._cookie_events[name] = event
        path = os.path.join(self.cookie_dir, name)
        self.cookie_waits += 1
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.close(fd)
            with trio.move_on_after(timeout):
                await event.wait()
            return event.is_set() and name not in self._cookie_events
        finally:
            self._cookie_events.pop(name, None)
            with contextlib.suppress(OSError):
                os.unlink(path)
