"""Flushing a store's file system whole (``syncfs``, else ``sync``), fsyncing files together, and knowing where
a file's fsync makes its rename durable too (:func:`fsync_covers_rename`).

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
from snapshotd.fsutil import fsync_dir


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


def fsync_ref(git_dir: str, name: str) -> None:
    """Make the reference ``name`` of ``git_dir`` durable as it stands: its file (``packed-refs`` when it is not
    loose), then its folder, so the rename that put it there is durable too.

    A checkpoint's ref is otherwise left to the file system, as git leaves
    its own; a restore's safety checkpoint must be on disk before the
    restore changes anything.
    """
    path = os.path.join(git_dir, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        path = os.path.join(git_dir, "packed-refs")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(path))


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


JOURNALED_RENAMES = ("xfs", "ext3", "ext4")
"""File systems on which a file's fsync after its rename also makes the rename durable (ext3/4 with a journal only).

A rename changes the renamed file's own inode (its change time) in the
journal transaction that changes the folder, and the file's fsync commits
that transaction, so the folder's fsync adds nothing but, under other
writers, a commit of its own. tests/test_rename_durability.py checks it on
ext4, with and without fast commits, by a crash: a copy of the device taken
right after the file's fsync.
"""


def fsync_covers_rename(path: str) -> bool:
    """Whether an fsync of a file renamed into the folder ``path`` makes the rename durable too (:data:`JOURNALED_RENAMES`).

    Read anew at each call (a loop device's number is reused by the next
    image mounted on it); the loose writer asks once per store. False
    wherever it is not known: ext2, or ext3/ext4 without a journal (the ext4
    driver mounts all three as ``ext4``), network, overlay and memory file
    systems, a system without ``/proc``; there the folder is fsynced as well.
    """
    try:
        device = os.stat(path).st_dev
    except OSError:
        return False
    return _covers(device)


def _covers(device: int) -> bool:
    if not facilities.available("proc"):
        return False
    kind = _mounted_kind(device)
    if kind not in JOURNALED_RENAMES:
        return False
    if kind == "xfs":
        return True  # always journaled
    try:  # ext3/4: its journal is /proc/fs/jbd2/<block device>-8 (the journal's inode) while mounted with one
        name = os.path.basename(os.readlink(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}"))
    except OSError:
        return False
    return os.path.isdir(f"/proc/fs/jbd2/{name}-8")


def _mounted_kind(device: int) -> str | None:
    """The type ``/proc/self/mountinfo`` gives the file system on ``device`` (``ext4``, ``xfs``...), None if not found."""
    wanted = f"{os.major(device)}:{os.minor(device)}"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) > 2 and fields[2] == wanted and " - " in line:
                    return line.split(" - ", 1)[1].split()[0]
    except OSError:
        pass
    return None


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
