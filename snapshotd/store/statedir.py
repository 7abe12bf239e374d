"""snapshotd's folder in a git dir (``<git_dir>/snapshotd``) and the worktree id kept there.

The folder is opened without following a link and checked to be this user's
(:func:`~snapshotd.fsutil.open_private_folder`) before anything is written
through it, made 0700 whatever the umask, and every file in it is created,
read and replaced relative to that descriptor. The id is read without
blocking and only from a regular file, so a FIFO or a device planted as
``id`` is refused with a sentence instead of holding a worker thread forever.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from snapshotd.errors import StateUnreadable, Untrusted
from snapshotd.fsutil import open_private_folder, read_private_file, write_all

ID_NAME = "id"
MAX_ID_BYTES = 4096  # an id is 20 bytes; anything longer is not one


def state_folder(git_dir: str) -> Path:
    """Where snapshotd keeps its files for the worktree of ``git_dir``."""
    return Path(git_dir, "snapshotd")


def open_state_folder(git_dir: str, *, create: bool = True) -> int:
    """A descriptor on ``<git_dir>/snapshotd``, made 0700 when missing; refused when a link or not ours."""
    return open_private_folder(state_folder(git_dir), 1, create=create)


def unreadable(path: Path, cause: OSError | str) -> StateUnreadable:
    """The error for a state file that exists but cannot be used; it names the file and the cause."""
    if isinstance(cause, str):
        reason = cause
    else:
        reason = cause.strerror or type(cause).__name__
        reason = reason if reason.startswith("it is a") else reason.lower()
    return StateUnreadable(
        f"snapshotd cannot read {path} ({reason}); fix or move it away, nothing was changed.", path=str(path)
    )


def read_id(folder_fd: int, folder: Path) -> str | None:
    """The worktree id in ``id`` under ``folder_fd``; None only when there is no such file.

    Any other failure (permissions, a folder, FIFO or link in its place, no
    descriptors left) is an error: minting a new id would orphan the
    worktree's checkpoints.
    """
    path = folder / ID_NAME
    try:
        raw = read_private_file(folder_fd, ID_NAME, MAX_ID_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise unreadable(path, exc) from exc
    value = raw.decode("utf-8", "surrogateescape").strip()
    if not value.startswith("wt_"):
        raise unreadable(path, "it does not hold a snapshotd worktree id")
    return value


def read_id_of(git_dir: str) -> str | None:
    """The id another recorded worktree keeps, or None when it has none (or none that can be trusted)."""
    try:
        fd = open_state_folder(git_dir, create=False)
    except (OSError, Untrusted):
        return None
    try:
        return read_id(fd, state_folder(git_dir))
    except StateUnreadable:
        return None
    finally:
        os.close(fd)


def _write_new(folder_fd: int, name: str, data: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder_fd)
    try:
        os.fchmod(fd, 0o600)
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def claim_id(folder_fd: int, folder: Path, worktree_id: str, *, replace: bool) -> str:
    """Give the worktree ``worktree_id`` (mode 0600); two processes meeting it at once agree on one.

    With ``replace`` the id there is replaced whole (a copy of a worktree held it too).
    """
    tmp = f".id-{os.getpid()}-{secrets.token_hex(4)}"
    _write_new(folder_fd, tmp, (worktree_id + "\n").encode())
    try:
        if replace:
            os.replace(tmp, ID_NAME, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
            os.fsync(folder_fd)
            return worktree_id
        try:
            os.link(tmp, ID_NAME, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
        except FileExistsError:
            existing = read_id(folder_fd, folder)
            if existing is None:
                raise
            return existing
        return worktree_id
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder_fd)
