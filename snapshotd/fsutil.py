"""Small file-system helpers shared by the store, the records and the capture.

pathlib, ctypes and secrets are imported only by the helpers that use them
(the socket folder's rule, which every agent hook checks, is :mod:`snapshotd.socketfolder`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import pwd
import stat

from snapshotd.errors import NotFound, Untrusted
from snapshotd.settings import disabled_facilities

MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.ESTALE)
"""What looking at a path that was there a moment ago fails with once it is gone (or a folder above it is)."""


def changed_while_opened(worktree: str, exc: OSError) -> NotFound:
    """``not_found`` for a worktree whose folder, ``.git`` or git dir went while it was found or checked.

    An agent server deletes worktrees all day: the path is gone, which is no
    question of who owns it nor of what kind of file it is.
    """
    name = os.fsdecode(exc.filename) if exc.filename is not None else None
    what = f"{exc.strerror}: {name}" if name else (exc.strerror or type(exc).__name__)
    return NotFound(
        f"The worktree at {worktree} changed while it was being opened ({what}); it may have been moved or deleted.",
        path=worktree,
    )

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (os.write may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def atomic_write(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old or the new file."""
    import secrets
    from pathlib import Path

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


def atomic_write_at(folder_fd: int, name: str, data: bytes, mode: int = 0o600, *, temp_prefix: str | None = None) -> None:
    """Replace ``name`` in the folder open as ``folder_fd`` with ``data``; a crash leaves the old file or the new.

    :func:`atomic_write` for a folder held by descriptor (opened without
    following links, checked to be the right one): the temporary file beside
    it (``temp_prefix``, by default ``.<name>.tmp-``, then the pid, so a later
    writer can tell a crashed one's) is created and renamed relative to the
    descriptor, never through a link planted in its place, and given ``mode``
    whatever the umask.
    """
    import secrets

    tmp = f"{temp_prefix or f'.{name}.tmp-'}{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder_fd)
    try:
        try:
            write_all(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder_fd)
        raise
    os.fsync(folder_fd)


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
    from pathlib import Path

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
    """Open (creating 0700) the folder ``name`` under ``parent_fd``; refuse a link or another user's.

    The folder is left mode 0700 whatever the umask, or the mode it was
    first made with (0755 or, under umask 000, 0777), so no other user can
    read what is kept there or replace it.
    """
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
    if stat.S_IMODE(os.fstat(fd).st_mode) != 0o700:
        os.fchmod(fd, 0o700)
    return fd


def read_private_file(folder_fd: int, name: str, limit: int) -> bytes:
    """The content of the regular file ``name`` in one of snapshotd's own folders, at most ``limit`` bytes.

    Opened without blocking and without following a link: a FIFO, a device or
    a link in its place raises OSError (ELOOP, or EINVAL "not a regular file")
    instead of holding the thread; FileNotFoundError when there is nothing.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symlink, not a regular file", name) from exc
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"it is a {_KINDS.get(stat.S_IFMT(mode), 'special file')}, not a regular file", name)
        return os.read(fd, limit)
    finally:
        os.close(fd)


_KINDS = {stat.S_IFDIR: "directory", stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket", stat.S_IFCHR: "device", stat.S_IFBLK: "device"}


def checked_private_folder(path: str | os.PathLike[str], own_levels: int = 2) -> str:
    """``path`` after :func:`open_private_folder` accepted it (and created what was missing).

    For code that hands the path on (to git, to libgit2): nothing but this user
    can replace a folder of a chain that is the user's.
    """
    os.close(open_private_folder(path, own_levels))
    return os.fspath(path)


def _private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's own group (named as the user, no other members): a user-private group."""
    try:
        group = grp.getgrgid(gid)
        user = pwd.getpwuid(os.geteuid())
    except KeyError:
        return False
    return group.gr_name == user.pw_name and not group.gr_mem and gid == user.pw_gid


def _unsafe_parent(folder: str, info: os.stat_result) -> str | None:
    """Why another user could replace what is inside ``folder`` (None: no one but root and this user can)."""
    if info.st_uid not in (0, os.geteuid()):
        return f"{folder} belongs to uid {info.st_uid}"
    if info.st_mode & stat.S_ISVTX:
        return None  # like /tmp: others may add names, never rename or remove this user's
    if info.st_mode & 0o002:
        return f"everyone may write to {folder}"
    if info.st_mode & 0o020 and not _private_group(info.st_gid):
        return f"group {info.st_gid} may write to {folder}"
    return None


def _make_home(path: Path) -> None:
    """Make ``path`` mode 0700 if missing, its missing parents 0755 (so the umask cannot open them to others)."""
    missing = [folder for folder in (path, *path.parents) if not os.path.lexists(folder)]
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700 if folder == path else 0o755)
            if folder == path:
                os.chmod(folder, 0o700)


def _unsafe_chain(folder: str) -> str | None:
    """Why another user could replace something inside ``folder`` or a folder above it (None: no one can)."""
    while True:
        reason = _unsafe_parent(folder, os.stat(folder))
        if reason is not None or folder == os.path.dirname(folder):
            return reason
        folder = os.path.dirname(folder)


def check_private_home(path: str | os.PathLike[str], *, create: bool) -> None:
    """The rule for snapshotd's home: this user's folder, mode 0700, under folders only root or the user may change.

    Every store, record and state folder of the user's plain folders is
    there, so a home another user can read leaks the files captured, and one
    another user can write, or swap through a folder above, makes snapshotd
    open that user's repositories. With ``create`` a missing home is made mode
    0700 (missing parents 0755), only once the folders above it pass; without
    it a missing home raises FileNotFoundError. Raises
    :class:`~snapshotd.errors.Untrusted` with the reason and the remedy.
    """
    remedy = "move it under a folder only you can change, or point SNAPSHOTD_HOME there"
    reason = None
    if create and not os.path.lexists(path):
        from pathlib import Path

        existing = Path(path).parent
        while not os.path.lexists(existing):
            existing = existing.parent
        reason = _unsafe_chain(os.path.realpath(existing))
        if reason is None:
            _make_home(Path(path))
    if reason is None:
        real = os.path.realpath(path)
        info = os.stat(real)
        if not stat.S_ISDIR(info.st_mode):
            reason, remedy = f"{real} is not a folder", "point SNAPSHOTD_HOME at a folder of yours"
        elif info.st_uid != os.geteuid():
            reason, remedy = f"it belongs to uid {info.st_uid}", "point SNAPSHOTD_HOME at a folder of yours"
        elif info.st_mode & 0o077:
            reason, remedy = f"other users may use it (mode {stat.S_IMODE(info.st_mode):04o})", f"run: chmod 700 {real}"
        else:
            reason = _unsafe_chain(os.path.dirname(real))
    if reason is not None:
        raise Untrusted(f"snapshotd will not use its home {os.fspath(path)}: {reason}; {remedy}.", path=os.fspath(path))


def no_world_writes() -> None:
    """Take "others may write" out of this process's umask, once, before anything is created.

    snapshotd's private files get explicit modes; this covers what libgit2 and
    git make in a repository (object folders, refs), which follow the umask:
    under umask 000 they came out world-writable. Group bits are left as the
    user set them, so a group-shared repository stays writable by its group.
    """
    global UMASK
    current = os.umask(0o022)
    UMASK = current | 0o002
    os.umask(UMASK)


UMASK: int | None = None
"""The umask :func:`no_world_writes` set: what a process without ``/proc`` knows of its umask."""


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie not yet reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if "proc" in disabled_facilities():
        return True  # no process table to tell a zombie from a live process
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


def older_than(st: os.stat_result, fence_ns: int) -> bool:
    """Whether the file's times are older than the racy-timestamp fence ``fence_ns``.

    The fence is the time the file system gives a file written at some moment
    (:func:`snapshotd.capture.state.make_fence`); a write after that moment
    gives the file other stat data, so the same stat data means the same
    content (git's racy-timestamp rule).
    """
    return max(st.st_mtime_ns, st.st_ctime_ns) < fence_ns
