"""One durability barrier for a restore's temporary files, before the first is renamed over its target.

A restore writes every file's temporary copy first, unsynced, and then
makes them all durable at once. A big one (:data:`SYNCFS_FROM` copies or
more) does it with one ``syncfs`` per file system holding one of the
folders written (a folder of the worktree may be another file system's
mount point); a small one, or one where ``syncfs`` is missing or refused,
starts every copy's writeback and then fsyncs each
(:func:`~snapshotd.git.flush.fsync_together`: on a journaled file system
they share a journal commit). A small restore does not ``syncfs``: that
would also write out every other process's dirty data on that file system.
Either way no target is replaced before every copy that replaces one is on
disk.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

from snapshotd import facilities
from snapshotd.git.flush import FDS_AT_ONCE, fsync_together, libc

SYNCFS_FROM = 32


def _syncfs(fd: int) -> bool:
    """Flush the file system holding ``fd``; False when ``syncfs`` is not there (its error otherwise raised)."""
    if not facilities.available("syncfs"):
        return False
    if libc().syncfs(fd) == 0:
        return True
    err = ctypes.get_errno()
    if err in facilities.ABSENT_ERRNOS:
        return False
    raise OSError(err, os.strerror(err))


def _fsync_each(files: list[tuple[int, str]]) -> None:
    """Fsync the files ``(folder descriptor, name)``, opened without following a link (:func:`fsync_together`)."""
    fds: list[int] = []
    try:
        for dir_fd, name in files:
            fds.append(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd))
        errors = fsync_together(fds)
        if errors:
            raise errors[0]
    finally:
        for fd in fds:
            os.close(fd)


def make_durable(written: Iterable[tuple[int, str]]) -> None:
    """Make the files ``(folder descriptor, name)`` written unsynced durable before any is renamed.

    From :data:`SYNCFS_FROM` files, one ``syncfs`` per file system of the
    folders, the files of a file system where it fails as missing synced one
    by one; fewer are synced one by one. A disk error is raised.
    """
    written = list(written)
    if len(written) < SYNCFS_FROM:
        _fsync_each(written)
        return
    devices: dict[int, int] = {}  # folder descriptor -> its file system
    by_device: dict[int, list[tuple[int, str]]] = {}
    for dir_fd, name in written:
        if dir_fd not in devices:
            devices[dir_fd] = os.fstat(dir_fd).st_dev
        by_device.setdefault(devices[dir_fd], []).append((dir_fd, name))
    for files in by_device.values():
        if not _syncfs(files[0][0]):
            for start in range(0, len(files), FDS_AT_ONCE):
                _fsync_each(files[start : start + FDS_AT_ONCE])
