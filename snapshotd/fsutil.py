"""Small file-system helpers shared by the store, the records and the capture."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


def atomic_write(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old or the new file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive flock: released by the kernel if the holder dies, so it never goes stale."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie not yet reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def remove_stale_temp_files(folder: Path, prefix: str) -> list[str]:
    """Remove ``<prefix><pid>-…`` files whose creating process is gone; return their names."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(folder):
            if not entry.name.startswith(prefix):
                continue
            pid_text = entry.name[len(prefix) :].split("-", 1)[0]
            if pid_text.isdigit() and not pid_alive(int(pid_text)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                removed.append(entry.name)
    return removed


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def sync_filesystem(path: str | os.PathLike[str]) -> None:
    """Flush the file system holding ``path`` (syncfs): objects reach disk before a ref names them."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)
