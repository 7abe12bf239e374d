"""Flushing a store's file system whole (``syncfs``, else ``sync``), and starting a file's writeback early.

For the objects whose files the daemon does not follow: those git writes (the
git-command back-end, the fallback capture, git's filters) and libgit2 (a cold
capture's trees, a large file streamed). What :mod:`snapshotd.git.loose`
writes itself is fsynced file by file instead. Where ``syncfs`` is missing
(macOS, the BSDs, a sandbox that refuses it, ``SNAPSHOTD_DISABLE=syncfs``)
libgit2 fsyncs what it writes (:func:`snapshotd.git.loose.fsync_each_write`)
and this flushes every file system for git's writes.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from snapshotd import facilities


@functools.cache
def libc() -> Any:
    """The C library, loaded on first use (finding it runs ldconfig: too slow for every command's start)."""
    import ctypes
    import ctypes.util

    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


_SYNC_FILE_RANGE_WRITE = 2  # start writing the range's dirty pages; wait for nothing


def start_writeback(fd: int) -> None:
    """Have the kernel start writing ``fd``'s dirty pages now, without waiting for them (Linux).

    A hint before a series of fsyncs, never in place of one: on a journaled
    file system an fsync first writes the file's data, and that allocates its
    blocks in the journal's running transaction, which the fsync must then
    commit; so a dozen files fsynced in turn waited for a dozen commits. With
    every file's writeback started first, the first fsync's commit carries
    every file's blocks and the others wait for none of their own (a dozen
    new object files: 1.3 ms instead of 2.6-3.4 on a journaled ext4, and less
    CPU). Where the call is missing it does nothing.
    """
    call = getattr(libc(), "sync_file_range", None)
    if call is not None:
        import ctypes

        call(fd, ctypes.c_longlong(0), ctypes.c_longlong(0), _SYNC_FILE_RANGE_WRITE)


FDS_AT_ONCE = 256
"""Descriptors a caller of :func:`fsync_together` holds open at once."""


def fsync_together(fds: list[int]) -> list[OSError]:
    """Fsync every descriptor, every writeback started first (:func:`start_writeback`); the errors met.

    Each is fsynced whatever another's fsync raised, so the caller knows all that failed.
    """
    for fd in fds:
        start_writeback(fd)
    errors: list[OSError] = []
    for fd in fds:
        try:
            os.fsync(fd)
        except OSError as exc:
            errors.append(exc)
    return errors


def sync_filesystem(path: str | os.PathLike[str]) -> None:
    """Flush the file system holding ``path`` (syncfs): objects reach disk before a ref names them.

    Without ``syncfs`` (or once it fails as a missing call does: ENOSYS, a
    sandbox's EPERM) every file system is flushed (``sync``) and the facility
    is marked missing, so from then on each write is flushed as it is made.
    """
    import ctypes

    if not facilities.available("syncfs"):
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if libc().syncfs(fd) != 0:
            err = ctypes.get_errno()
            if err not in facilities.ABSENT_ERRNOS:
                raise OSError(err, os.strerror(err))
            facilities.lose("syncfs", f"syncfs: {os.strerror(err)}")
            os.sync()
    finally:
        os.close(fd)
