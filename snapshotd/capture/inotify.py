"""inotify through libc (ctypes): one instance, its watches by descriptor, its raw events.

The watcher talks to inotify itself rather than through watchfiles, whose
backend (the notify crate) follows symlinks to folders: it watched whatever a
link pointed to (all of ``/usr`` for a link to it), and because its watch maps
are keyed by path while the kernel gives one watch per folder inode, replacing
a link to a folder of the worktree removed the watches of that folder and
everything below it, silently (docs/upstream/). Folders here are opened with
``O_NOFOLLOW`` (:func:`open_in_tree`) and watched through their descriptor.

The watcher (:mod:`snapshotd.capture.watch`) uses this binding instead of a
library that follows symlinks; :meth:`Inotify.kernel_watches` reads the
kernel's own list of this instance's watches from ``/proc/self/fdinfo``, so the
watcher can check that it holds exactly the watches the kernel does.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

import trio

from snapshotd import facilities
from snapshotd.errors import WatchGivenUp

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
FOLDER_MASK = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO
    | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_SIZE = 1 << 16


def open_in_tree(root: str, rel: str) -> int:
    """Open the folder ``rel`` under ``root`` one component at a time, never through a link."""
    fd = os.open(root, OPEN_FOLDER)
    for name in rel.split("/") if rel else ():
        try:
            child = os.open(name, OPEN_FOLDER, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
    return fd


def _libc() -> ctypes.CDLL:
    """The C library, whose inotify calls this binding makes."""
    return ctypes.CDLL(None, use_errno=True)


class Inotify:
    """One inotify instance, through libc: watches by descriptor, raw events, the kernel's watch count."""

    def __init__(self) -> None:
        self._libc = _libc()
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            error = _last_error("inotify_init1")
            if error.errno in facilities.ABSENT_ERRNOS:  # not there (a sandbox's seccomp): cold from now on
                facilities.lose("inotify", error.strerror or "inotify_init1 failed")
            raise as_limit(error)

    def add(self, folder_fd: int) -> int:
        """Watch the folder open as ``folder_fd`` (its descriptor, so no path is resolved again)."""
        path = f"/proc/self/fd/{folder_fd}".encode()
        wd: int = self._libc.inotify_add_watch(self.fd, path, FOLDER_MASK)  # ctypes: a C int by default
        if wd < 0:
            raise as_limit(_last_error("inotify_add_watch"))
        return wd

    def remove(self, wd: int) -> None:
        """Drop a watch; one the kernel already dropped is no error."""
        self._libc.inotify_rm_watch(self.fd, wd)

    def read(self, *, once: bool = False) -> list[tuple[int, int, str]]:
        """Every event queued now, as (wd, mask, name); empty when none is.

        With ``once``, only what one read of the kernel's queue returns (at
        most 64 KiB of events), so that a burst of tens of thousands is filed
        a piece at a time.
        """
        events: list[tuple[int, int, str]] = []
        while True:
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                return events
            offset = 0
            while offset < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                name = data[offset : offset + length].rstrip(b"\0")
                offset += length
                events.append((wd, mask, os.fsdecode(name)))
            if once:
                return events

    def _fdinfo(self) -> bytes:
        with open(f"/proc/self/fdinfo/{self.fd}", "rb") as info:
            return info.read()

    def kernel_watch_count(self) -> int:
        """How many watches the kernel holds for this instance (one ``inotify wd:`` line each)."""
        return self._fdinfo().count(b"\ninotify wd:")

    def kernel_watches(self) -> set[int]:
        """The descriptors of the watches the kernel holds for this instance."""
        lines = self._fdinfo().splitlines()
        return {int(line.split()[1][3:], 16) for line in lines if line.startswith(b"inotify wd:")}  # in hex

    def close(self) -> None:
        trio.lowlevel.notify_closing(self.fd)
        os.close(self.fd)


def _last_error(call: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{call}: {os.strerror(number)}")


WATCHES_SYSCTL = "fs.inotify.max_user_watches"
INSTANCES_SYSCTL = "fs.inotify.max_user_instances"
_LIMIT_FILES = {  # the user namespace's own value first (equal to the sysctl outside a namespace)
    WATCHES_SYSCTL: ("/proc/sys/user/max_inotify_watches", "/proc/sys/fs/inotify/max_user_watches"),
    INSTANCES_SYSCTL: ("/proc/sys/user/max_inotify_instances", "/proc/sys/fs/inotify/max_user_instances"),
}


def limit_value(name: str) -> str:
    """The kernel's current value of one inotify limit, as text ("unknown" when unreadable)."""
    for path in _LIMIT_FILES[name]:
        try:
            with open(path) as value:
                return value.read().strip()
        except OSError:
            continue
    return "unknown"


def watches_held() -> int:
    """How many inotify watches this process holds, over all its instances (from ``/proc/self/fdinfo``)."""
    held = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{name}", "rb") as info:
                held += info.read().count(b"\ninotify wd:")
        except OSError:
            continue
    return held


def watch_limit_reached(*, reserve: bool = False, walked: bool = True) -> WatchGivenUp:
    """The user's inotify watches are all taken, or (``reserve``) all but those kept for watched worktrees;
    ``walked`` False: known before any walk (the room is no more than the worktree's last walk held)."""
    reached = "nearly reached" if reserve else "reached"
    kept = ", and keeps the rest for new folders in the worktrees it watches" if reserve else ""
    return WatchGivenUp(
        "watch_limit",
        f"The kernel's inotify watch limit is {reached} ({WATCHES_SYSCTL} = {limit_value(WATCHES_SYSCTL)}, "
        f"shared by all of the user's processes; this daemon holds {watches_held()}{kept}), so this worktree is "
        f"not watched and its captures are full scans; raise it with 'sudo sysctl {WATCHES_SYSCTL}=N'.",
        walked=walked,
    )


def as_limit(exc: OSError) -> OSError | WatchGivenUp:
    """A kernel limit named as one (the sysctl to raise, its value, the watches held); other errors as they are.

    ``inotify_add_watch`` says ENOSPC ("No space left on device", though no
    disk is full) at the user's watch limit; ``inotify_init1`` says EMFILE at
    the user's limit of instances; opening a folder says EMFILE or ENFILE when
    the daemon is out of descriptors.
    """
    if exc.errno == errno.ENOSPC:
        return watch_limit_reached()
    if exc.errno == errno.EMFILE and (exc.strerror or "").startswith("inotify_init1"):
        return WatchGivenUp(
            "watch_limit",
            f"The kernel's limit of inotify instances is reached ({INSTANCES_SYSCTL} = "
            f"{limit_value(INSTANCES_SYSCTL)}), so this worktree is not watched and its captures are full scans; "
            f"raise it with 'sudo sysctl {INSTANCES_SYSCTL}=N'.",
        )
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return WatchGivenUp(
            "descriptors",
            "The daemon is out of file descriptors, so this worktree is not watched and its captures are "
            "full scans; raise the open-files limit (ulimit -n) of the daemon.",
        )
    return exc
