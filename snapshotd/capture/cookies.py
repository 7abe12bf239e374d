"""The watcher's sync point: a cookie file written, and its own event awaited.

Before a capture trusts the watcher's dirty set it writes a cookie in
snapshotd's own folder (watched with the worktree) and waits until the
cookie's event comes back: every write that finished before the request has
then been read off the kernel's queue. The folder is opened once, never
through a symlink, and cookies are made and removed relative to that
descriptor only, so the clean-up can never delete anything outside it.

A cookie is a file renamed to a new name at each wait (its ``IN_MOVED_TO``
is the event awaited), not made and deleted: a capture then frees no inode,
and on an ext4 without a journal each inode freed makes the next ones made
nearby slower to allocate for minutes (``recently_deleted``). A file is made
only when every earlier one is in use by a wait.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets

import trio

from snapshotd.fsutil import open_private_folder

COOKIE_PREFIX = "cookie-"


class Cookies:
    """The cookie folder of one watch: written to by :meth:`wait`, its events filed by :meth:`seen`."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.dir = os.path.join(os.path.realpath(state_dir), "cookies")
        self.waits = 0
        self._events: dict[str, trio.Event] = {}
        self._arrived: list[trio.Event] = []  # seen, their waiters woken by :meth:`wake`
        self._counter = itertools.count()
        self._fd: int | None = None
        self._idle: list[str] = []  # cookie files no wait uses now: the next waits rename them
        self.requested = trio.Event()  # a cookie was placed since the watcher last read: it reads without gathering

    def open(self) -> None:
        """Open the folder (see :func:`open_private_folder`) and empty it of stale cookies."""
        self._fd = open_private_folder(os.path.join(self.state_dir, "cookies"))
        self._idle = []
        for stale in os.listdir(self._fd):
            if stale.startswith(COOKIE_PREFIX):
                with contextlib.suppress(OSError):
                    os.unlink(stale, dir_fd=self._fd)

    def gather(self) -> None:
        """The watcher is about to read: a cookie placed from now on sets :attr:`requested` anew."""
        self.requested = trio.Event()

    def close(self) -> None:
        """Release every waiter (they then report no sync) and close the folder."""
        for event in [*self._events.values(), *self._arrived]:
            event.set()
        self._arrived = []
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def seen(self, path: str) -> bool:
        """Whether ``path`` (from an event) is in the cookie folder; a cookie's waiter wakes at :meth:`wake`."""
        if not path.startswith(self.dir + os.sep):
            return False
        event = self._events.pop(os.path.basename(path), None)
        if event is not None:
            self._arrived.append(event)
        return True

    def wake(self) -> None:
        """Wake the waiters of the cookies seen so far: once their batch of events is fully filed.

        A batch's new folders are watched before its cookies count, so a sync
        never returns while a folder made before it is still unwatched.
        """
        arrived, self._arrived = self._arrived, []
        for event in arrived:
            event.set()

    async def wait(self, timeout: float) -> bool:
        """Write a cookie and wait for its event: True when it came back within ``timeout``."""
        folder = self._fd
        if folder is None:  # the watch has not opened its cookie folder, or has ended
            return False
        name = f"{COOKIE_PREFIX}{os.getpid()}-{next(self._counter)}-{secrets.token_hex(3)}"
        event = trio.Event()
        self._events[name] = event
        self.waits += 1
        placed = False
        try:
            try:
                self._place(folder, name)
            except OSError:  # the folder went (the worktree was deleted): no sync, the capture goes cold
                return False
            placed = True
            self.requested.set()
            with trio.move_on_after(timeout):
                await event.wait()
            return event.is_set() and name not in self._events
        finally:
            self._events.pop(name, None)
            if placed and self._fd == folder:  # else the watch ended and closed it; the next start clears it
                self._idle.append(name)

    def _place(self, folder: int, name: str) -> None:
        """Put a cookie file at ``name``: an idle one renamed, else a new one."""
        while self._idle:
            try:
                os.rename(self._idle.pop(), name, src_dir_fd=folder, dst_dir_fd=folder)
                return
            except FileNotFoundError:  # removed meanwhile (the folder cleared): try the next, or make one
                continue
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        os.close(os.open(name, flags, 0o600, dir_fd=folder))
