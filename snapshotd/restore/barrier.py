"""One durability barrier for a big restore's temporary files: ``syncfs`` of each file system they are on.

A big restore writes every file's temporary copy first, unsynced, and then
makes them all durable at once, before the first is renamed over its target:
one ``syncfs`` per file system holding one of the folders written (a folder
of the worktree may be another file system's mount point), instead of an
``fsync`` per file, each a journal commit of its own. Where ``syncfs`` is
missing or refused, each file is synced on its own, on a few threads. Either
way no target is replaced before every copy that replaces one is on disk.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Iterable
from typing import Any

from snapshotd import facilities
from snapshotd.restore.parallel import run_each


@functools.cache
def _libc() -> Any:
    """The C library, loaded on first use."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _syncfs(fd: int) -> bool:
    """Flush the file system holding ``fd``; False when ``syncfs`` is not there (its error otherwise raised)."""
    if not facilities.available("syncfs"):
        return False
    if _libc().syncfs(fd) == 0:
        return True
    err = ctypes.get_errno()
    if err in facilities.ABSENT_ERRNOS:
        return False
    raise OSError(err, os.strerror(err))


def _fsync_at(dir_fd: int, name: str) -> None:
    """Sync the file ``name`` under ``dir_fd`` (opened without following a link)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_durable(written: Iterable[tuple[int, str]]) -> None:
    """Make the files ``(folder descriptor, name)`` written unsynced durable before any is renamed.

    One ``syncfs`` per file system of the folders; the files of a file system
    where it fails as missing are synced one by one. A disk error is raised.
    """
    devices: dict[int, int] = {}  # folder descriptor -> its file system
    by_device: dict[int, list[tuple[int, str]]] = {}
    for dir_fd, name in written:
        if dir_fd not in devices:
            devices[dir_fd] = os.fstat(dir_fd).st_dev
        by_device.setdefault(devices[dir_fd], []).append((dir_fd, name))
    for files in by_device.values():
        if not _syncfs(files[0][0]):
            run_each(lambda item: _fsync_at(*item), files)
