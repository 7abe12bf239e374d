"""Small file-system helpers shared by the store, the records and the capture."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from snapshotd.errors import Untrusted


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
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def open_private_folder(path: str | os.PathLike[str], own_levels: int = 2, *, create: bool = True) -> int:
    """A descriptor on one of snapshotd's own folders (a state folder or one inside it).

    The last ``own_levels`` components of ``path`` are snapshotd's: each is
    created mode 0700 when missing (unless ``create`` is false), opened without
    following a symlink, and must belong to this user; the folders above are
    the repository's (already checked, see :mod:`.ownership`) or snapshotd's
    home. So a symlink or another user's folder planted there never redirects
    a write or a deletion: :class:`~snapshotd.errors.Untrusted` says what is
    in the way. With ``create`` false a missing folder raises FileNotFoundError.
    """
    parts = Path(path).parts
    base, names = Path(*parts[:-own_levels]), parts[-own_levels:]
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            parent, fd = fd, _open_own_child(fd, name, Path(path), create)
            os.close(parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_own_child(parent_fd: int, name: str, path: Path, create: bool) -> int:
    """Open (creating 0700) the folder ``name`` under ``parent_fd``; refuse a link or another user's."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent_fd)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise Untrusted(
            f"snapshotd will not use {path}: {name} there is not a plain folder (a symlink or a file is in "
            "its place); remove it and try again.",
            path=str(path),
        ) from exc
    owner = os.fstat(fd).st_uid
    if owner != os.geteuid():
        os.close(fd)
        raise Untrusted(
            f"snapshotd will not use {path}: {name} there belongs to uid {owner}, not to you; "
            "remove it and try again.",
            path=str(path),
        )
    return fd


def checked_private_folder(path: str | os.PathLike[str], own_levels: int = 2) -> str:
    """``path`` after :func:`open_private_folder` accepted it (and created what was missing).

    For code that hands the path on (to git, to libgit2): nothing but this user
    can replace a folder of a chain that is the user's.
    """
    os.close(open_private_folder(path, own_levels))
    return os.fspath(path)


def check_socket_folder(folder: str, *, create: bool = False) -> None:
    """The rule for the socket's folder, for the daemon and its clients alike.

    It must be a folder (not a symlink) of this user that no one else may
    write to, or another user could put a socket of theirs, or a log symlink,
    where snapshotd looks. With ``create`` a missing folder is made mode 0700;
    without it, a missing folder raises FileNotFoundError. An unsafe one raises
    PermissionError (NotADirectoryError for a file) with one sentence.
    """
    if create:
        try:
            os.makedirs(folder, mode=0o700)
        except FileExistsError:
            pass
        else:
            os.chmod(folder, 0o700)
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode):
        raise PermissionError(f"Refusing the socket folder {folder}: it is a symlink.")
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"The socket folder {folder} is not a folder.")
    own = os.geteuid()
    if info.st_uid != own:
        raise PermissionError(f"Refusing the socket folder {folder}: it belongs to uid {info.st_uid}, not {own}.")
    if info.st_mode & 0o022:
        raise PermissionError(
            f"Refusing the socket folder {folder}: other users may write to it "
            f"(mode {stat.S_IMODE(info.st_mode):04o})."
        )


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
    """Remove ``<prefix><pid>-…`` files whose creating process is gone; return their names.

    ``folder`` is one of snapshotd's own (see :func:`open_private_folder`):
    when a symlink or another user's folder is in its place, nothing is removed.
    """
    try:
        fd = open_private_folder(folder, create=False)
    except (FileNotFoundError, NotADirectoryError, Untrusted):
        return []
    removed = []
    try:
        for name in os.listdir(fd):
            if not name.startswith(prefix):
                continue
            pid_text = name[len(prefix) :].split("-", 1)[0]
            if pid_text.isdigit() and not pid_alive(int(pid_text)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=fd)
                removed.append(name)
    finally:
        os.close(fd)
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
