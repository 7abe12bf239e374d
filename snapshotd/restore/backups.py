"""A restore's backups: what a plan replaces, kept where only the user can reach it.

The backup folder lives in the worktree's private journal folder
(``.git/snapshotd/journal``, or ``$SNAPSHOTD_HOME/state/<id>/journal``),
never in the worktree: in a shared worktree a neighbour could rename a
folder of the victim's to its name, or swap in a folder of their own,
between its ``mkdir`` and its ``open``. It is created from the journal
folder's descriptor, opened without following a link, checked to be the
user's, and used only through its descriptor, so a rollback puts back the
user's own bytes. Where the worktree is on another file system than the
journal folder (a linked worktree, a plain folder), what is replaced is
copied rather than hard-linked, and put back by a copy renamed into place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets

from snapshotd.errors import Untrusted
from snapshotd.fsutil import open_private_folder
from snapshotd.restore.fileops import DIR_FLAGS, TEMP_PREFIX, copy_entry

BACKUP_PREFIX = "backup-"
_NO_LINK = (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.EOPNOTSUPP)


class Backups:
    """The backup folder ``journal_dir/name``, made on first use and removed by :meth:`close`."""

    def __init__(self, journal_dir: str, name: str) -> None:
        self.journal_dir = journal_dir
        self.name = name
        self._parent_fd: int | None = None
        self._fd: int | None = None
        self._slots = 0

    def _folder(self) -> int:
        if self._fd is None:
            self._parent_fd = open_private_folder(self.journal_dir)
            os.mkdir(self.name, 0o700, dir_fd=self._parent_fd)
            fd = os.open(self.name, DIR_FLAGS, dir_fd=self._parent_fd)
            if os.fstat(fd).st_uid != os.geteuid():
                os.close(fd)
                raise Untrusted(f"snapshotd will not keep backups in {self.journal_dir}: {self.name} is not yours.")
            os.fchmod(fd, 0o700)
            self._fd = fd
        return self._fd

    def keep(self, dir_fd: int, name: str) -> str:
        """Put a hard link (or a copy) of the entry ``name`` under ``dir_fd`` in the backup folder; its slot."""
        folder = self._folder()
        self._slots += 1
        slot = str(self._slots)
        try:
            os.link(name, slot, src_dir_fd=dir_fd, dst_dir_fd=folder, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
            copy_entry(dir_fd, name, folder, slot)
        return slot

    def put_back(self, slot: str, dir_fd: int, name: str) -> None:
        """Put the entry kept in ``slot`` back as ``name`` under ``dir_fd`` (renamed, or copied across file systems)."""
        folder = self._folder()
        try:
            os.rename(slot, name, src_dir_fd=folder, dst_dir_fd=dir_fd)
            return
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
        temp = f"{TEMP_PREFIX}{secrets.token_hex(8)}"
        copy_entry(folder, slot, dir_fd, temp)
        try:
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        with contextlib.suppress(OSError):
            os.unlink(slot, dir_fd=folder)

    def close(self) -> None:
        """Remove the backup folder and what is left in it."""
        if self._fd is not None:
            folder = self._fd
            for child in os.listdir(folder):
                _unlink(child, folder)
            assert self._parent_fd is not None
            with contextlib.suppress(OSError):
                os.rmdir(self.name, dir_fd=self._parent_fd)
        self.let_go()

    def let_go(self) -> None:
        """Close the backup folder, leaving it and what it holds (to the journal's recovery)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._parent_fd is not None:
            os.close(self._parent_fd)
            self._parent_fd = None


def _unlink(name: str, dir_fd: int) -> None:
    """Remove ``name`` under ``dir_fd``, if it is still there."""
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)


def remove_left_behind(journal_dir: str, name: object) -> bool:
    """Remove a backup folder an interrupted restore left in the journal folder; whether there was one.

    Only a flat folder carrying the prefix, reached by descriptor from the
    private journal folder. (A name from an older journal, a folder at the
    worktree's root, is left alone: a neighbour may have put anything there.)
    """
    if not isinstance(name, str) or not name.startswith(BACKUP_PREFIX) or "/" in name:
        return False
    try:
        parent = open_private_folder(journal_dir, create=False)
    except (OSError, Untrusted):
        return False
    try:
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        except OSError:
            return False
        try:
            for child in os.listdir(fd):
                with contextlib.suppress(OSError):
                    os.unlink(child, dir_fd=fd)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=parent)
        return True
    finally:
        os.close(parent)
