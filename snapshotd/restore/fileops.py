"""File operations relative to a worktree's descriptor, never following a symlink.

Every path is walked one component at a time from a directory descriptor with
``O_NOFOLLOW``, so a symlink or a file standing where a folder is needed stops
the walk (:class:`~snapshotd.errors.PathBlocked`) instead of leading outside
the worktree. Temporary names carry :data:`TEMP_PREFIX`, so that only files
this stage created are ever removed as leftovers.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Sequence

from snapshotd import fsutil
from snapshotd.errors import InvalidParams, PathBlocked
from snapshotd.fsutil import write_all
from snapshotd.paths import is_git_dir_name
from snapshotd.settings import disabled_facilities

TEMP_PREFIX = ".snapshotd-tmp-"

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def safe_name(name: str) -> bool:
    """Whether ``name`` can be created as one component on disk (no ``..``, no ``.git``, no slash)."""
    return (
        name not in ("", ".", "..")
        and "/" not in name
        and "\0" not in name
        and not is_git_dir_name(name)
    )


def blocked_at(dir_fd: int, name: str, path: str) -> PathBlocked:
    """The error for ``name`` under ``dir_fd`` standing where a folder is needed: a symlink or not."""
    try:
        is_link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        is_link = False
    return PathBlocked(path, is_link)


def split_path(path: str) -> list[str]:
    """The components of a worktree path; InvalidParams when one cannot be created safely."""
    parts = path.split("/")
    if not all(safe_name(part) for part in parts):
        raise InvalidParams(f"The path {path!r} is not a safe worktree path.", path=path)
    return parts


def remove_empty_folder(root_fd: int, folder: str) -> bool:
    """Remove the folder ``folder`` under ``root_fd`` if it is empty (reached without following a symlink);
    whether it was removed. One that holds anything, is gone, or is not a real folder is left as it is."""
    parts = folder.split("/")
    try:
        fd = open_dir(root_fd, parts[:-1], create=False)
    except (OSError, PathBlocked):
        return False
    try:
        os.rmdir(parts[-1], dir_fd=fd)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def open_dir(root_fd: int, parts: Sequence[str], *, create: bool, created: list[str] | None = None) -> int:
    """Open the folder ``parts`` under ``root_fd``, never following a symlink.

    Missing folders are created when ``create`` (and their paths appended to
    ``created``); a component that is not a real folder raises PathBlocked, a
    missing one FileNotFoundError (unless created).
    """
    fd = os.dup(root_fd)
    try:
        for depth, name in enumerate(parts):
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                    if created is not None:
                        created.append("/".join(parts[: depth + 1]))
                except FileExistsError:
                    pass
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise blocked_at(fd, name, "/".join(parts[: depth + 1])) from exc
                    raise
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise blocked_at(fd, name, "/".join(parts[: depth + 1])) from exc
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_umask() -> int:
    """The process umask, read without changing it (os.umask is not thread-safe).

    Without ``/proc``: the umask the daemon set at start (:data:`~snapshotd.fsutil.UMASK`), else git's usual 022.
    """
    if "proc" in disabled_facilities():
        return fsutil.UMASK if fsutil.UMASK is not None else 0o022
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return fsutil.UMASK if fsutil.UMASK is not None else 0o022


def file_permissions(mode: int, existing: os.stat_result | None, umask: int) -> int:
    """Permission bits for a file of git ``mode``: the old file's, with the exec bits as recorded."""
    executable = bool(mode & 0o100)
    if existing is not None and stat.S_ISREG(existing.st_mode):
        perm = stat.S_IMODE(existing.st_mode) & 0o777
    else:
        perm = (0o777 if executable else 0o666) & ~umask
    if executable:
        return perm | ((perm & 0o444) >> 2)
    return perm & ~0o111


def write_temp(dir_fd: int, temp: str, name: str, data: bytes, mode: int, umask: int, sync: bool = True) -> None:
    """Create ``temp`` under ``dir_fd`` (never an existing name) holding ``data``, synced unless not ``sync``
    (the caller then syncs it before it is renamed), with the permissions of git ``mode`` over those of
    ``name`` there now (:func:`file_permissions`)."""
    existing = lstat_at(dir_fd, name)
    out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        write_all(out, data)
        os.fchmod(out, file_permissions(mode, existing, umask))
        if sync:
            os.fsync(out)
    finally:
        os.close(out)


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """The lstat of ``name`` under ``dir_fd``, None when it does not exist."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def readlink_at(dir_fd: int, name: str) -> bytes | None:
    """The target of the symlink ``name`` under ``dir_fd``; None when it is gone or no longer a link."""
    try:
        return os.readlink(os.fsencode(name), dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
            return None  # replaced since it was looked at
        raise


def remove_empty_tree(dir_fd: int, name: str) -> bool:
    """Remove a folder that holds nothing but empty folders; False if anything else is in it."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        for child in os.listdir(fd):
            st = lstat_at(fd, child)
            if st is None:
                continue
            if not stat.S_ISDIR(st.st_mode) or not remove_empty_tree(fd, child):
                return False
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True


def fsync_dir(root_fd: int, parts: Sequence[str]) -> None:
    """Sync the folder ``parts`` so the renames in it are durable; a folder gone or blocked is let be."""
    try:
        fd = open_dir(root_fd, parts, create=False)
    except (OSError, PathBlocked):
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def blob_id(data: bytes, like: str) -> str:
    """The git blob id of ``data``, in the object format of the id ``like`` (SHA-1 or SHA-256)."""
    digest = hashlib.sha256 if len(like) == 64 else hashlib.sha1
    return digest(b"blob %d\0" % len(data) + data).hexdigest()


def read_at(dir_fd: int, name: str) -> bytes | None:
    """A regular file's bytes (never through a symlink, never blocking on a FIFO), or None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return read_fd(fd, st.st_size)
    finally:
        os.close(fd)


def read_fd(fd: int, size: int) -> bytes:
    """Every byte of the open file ``fd`` to its end, ``size`` (its fstat's) being a guess.

    Plain ``read`` calls: a file object would cost an fstat, two lseeks and
    an ioctl more per file, which thousands of files of a restore add up.
    """
    chunks: list[bytes] = []
    want = size + 1  # one more than the size: a file that did not grow ends on the next call
    while chunk := os.read(fd, want):
        chunks.append(chunk)
        want = 1 << 16
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def remove_temp(root_fd: int, temp: str) -> bool:
    """Remove a leftover temporary file (never a folder, never through a symlink)."""
    parts = temp.split("/")
    if not parts[-1].startswith(TEMP_PREFIX) or not all(safe_name(p) for p in parts):
        return False
    try:
        fd = open_dir(root_fd, parts[:-1], create=False)
    except (OSError, PathBlocked):
        return False
    try:
        st = lstat_at(fd, parts[-1])
        if st is None or stat.S_ISDIR(st.st_mode):
            return False
        os.unlink(parts[-1], dir_fd=fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def copy_entry(src_dir_fd: int, name: str, dst_dir_fd: int, slot: str) -> None:
    """Copy a file or symlink where it cannot be hard-linked (its bytes, link target and mode)."""
    st = os.stat(name, dir_fd=src_dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=src_dir_fd), slot, dir_fd=dst_dir_fd)
        return
    data = read_at(src_dir_fd, name)
    if data is None:
        raise OSError(errno.EINVAL, "not a regular file", name)
    out = os.open(slot, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst_dir_fd)
    try:
        write_all(out, data)
        os.fchmod(out, stat.S_IMODE(st.st_mode))
        os.fsync(out)
    finally:
        os.close(out)


class DiskReader:
    """Regular files under a worktree's root read without following any symlink, each folder opened once, from its
    parent's descriptor (a folder missing, blocked or unreadable reads as None). :meth:`close` when done."""

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self._folders: dict[tuple[str, ...], int | None] = {}

    def _folder(self, parts: tuple[str, ...]) -> int | None:
        if not parts:
            return self.root_fd
        if parts not in self._folders:
            parent = self._folder(parts[:-1])
            fd = None
            if parent is not None:
                with contextlib.suppress(OSError):
                    fd = os.open(parts[-1], DIR_FLAGS, dir_fd=parent)
            self._folders[parts] = fd
        return self._folders[parts]

    def read(self, path: str) -> bytes | None:
        """The bytes of the regular file at ``path``, or None."""
        parts = path.split("/")
        fd = self._folder(tuple(parts[:-1]))
        return None if fd is None else read_at(fd, parts[-1])

    def close(self) -> None:
        for fd in self._folders.values():
            if fd is not None:
                os.close(fd)
        self._folders.clear()
