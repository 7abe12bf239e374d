"""Carrying out a plan in the worktree, path by path, with a rollback of every step on a failure.

Each file is written to a temporary name in its folder, synced and renamed
over the target, so no half-written file ever sits under a real name; what a
write or delete replaces is first kept in a private backup folder (see
:mod:`.backups`), to be put back if a later step fails. A path that no longer holds what
the safety checkpoint recorded, or that turns out to sit behind a symlink or
a file, is skipped with its reason (``skipped``), never forced.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable
from typing import Any

from snapshotd.errors import PathBlocked, SnapshotdError, filesystem_error
from snapshotd.git.modes import MODE_GITLINK, MODE_LINK
from snapshotd.git.repository import Repository
from snapshotd.paths import folders_above
from snapshotd.restore import fileops
from snapshotd.restore.backups import Backups
from snapshotd.restore.fileops import (
    file_permissions,
    fsync_dir,
    open_dir,
    read_umask,
    remove_empty_tree,
)
from snapshotd.restore.plan import (
    REASON_CHANGED_ON_DISK,
    REASON_FILE,
    REASON_IN_THE_WAY,
    REASON_SYMLINK,
    Plan,
)
from snapshotd.restore.recorded import Recorded
from snapshotd.restore.stage import Stage
from snapshotd.restore.trees import Entry


def folders_to_prune(plan: Plan) -> list[str]:
    """The folders ``plan``'s deletes may leave empty and that it then removes, deepest first: those above a
    delete, except the folders above a write and a gitlink's own (still needed).

    The apply removes those it finds empty; so does the journal's recovery
    after a crash between the deletes and the pruning.
    """
    keep: set[str] = set()
    for path, entry in plan.writes:
        keep.update(folders_above(path))
        if entry.mode == MODE_GITLINK:
            keep.add(path)
    folders = {folder for path in plan.deletes for folder in folders_above(path)} - keep
    return sorted(folders, key=lambda folder: (-folder.count("/"), folder))


def _fail(path: str, exc: OSError) -> SnapshotdError:
    """The error of a write or delete the disk refused at ``path``."""
    return filesystem_error(exc, path, "write", " in the worktree")


def _blocked_reason(blocked: PathBlocked) -> str:
    """The conflict reason of a path whose folder is a symlink or a file."""
    return REASON_SYMLINK if blocked.is_link else REASON_FILE


class Applier:
    """Carries out a plan path by path, keeping what it replaces so that a failure can be undone.

    Every file, link or empty folder the plan replaces or removes is first
    hard-linked (or copied, where the file system has no hard links) into the
    private backup folder of :mod:`.backups`, and every step is logged; on a
    failure :meth:`roll_back` undoes the steps newest first. Before touching a
    path it checks that the path still holds what the safety checkpoint
    recorded (:mod:`.recorded`); one that was changed meanwhile is left alone
    as a conflict.
    """

    def __init__(self, repo: Repository, root_fd: int, plan: Plan, stage: Stage, backups: Backups) -> None:
        self.repo = repo
        self.root_fd = root_fd
        self.plan = plan
        self.stage = stage
        self.umask = read_umask()
        self.skipped: dict[str, str] = {}
        self.synced: set[tuple[str, ...]] = set()
        self.backups = backups
        self.undo: list[tuple[str, str, Any]] = []
        self.folders: dict[tuple[str, ...], int | PathBlocked] = {}  # open for the writes, by parts
        self.ready: set[str] = set()  # paths whose temporary file already holds their content
        self.placed: set[str] = set()  # paths whose temporary file was renamed into place
        self.recorded = Recorded(repo, plan, stage)

    def skip(self, path: str, reason: str) -> None:
        """Leave ``path`` alone, for ``reason`` (the first reason given stands)."""
        self.skipped.setdefault(path, reason)

    def close(self) -> None:
        """Close the writes' folders (the plan is done or rolled back; its backups are closed by their owner)."""
        for fd in self.folders.values():
            if isinstance(fd, int):
                os.close(fd)
        self.folders.clear()

    def folder(self, parts: tuple[str, ...]) -> int:
        """The folder ``parts`` opened for writes (created if missing, each creation logged), kept open.

        Opened once per folder, after the deletes and the pruning of folders,
        never following a symlink; a folder that is blocked raises PathBlocked
        every time it is asked for. The descriptor is the folder's, wherever it
        is moved meanwhile, so nothing is ever written through a link.
        """
        found = self.folders.get(parts)
        if found is None:
            created: list[str] = []
            try:
                found = open_dir(self.root_fd, parts, create=True, created=created)
            except PathBlocked as blocked:
                found = blocked
            finally:
                self.undo.extend(("rmdir", folder, None) for folder in created)
            self.folders[parts] = found
        if isinstance(found, PathBlocked):
            raise found
        return found

    def stale(self, fence_ns: int | None = None) -> list[str]:
        """The planned paths that no longer hold what the safety checkpoint recorded (:meth:`Recorded.stale`)."""
        return self.recorded.stale(self.root_fd, fence_ns)

    # undoing ------------------------------------------------------------------

    def _keep(self, dir_fd: int, name: str, path: str) -> None:
        """Put what stands at ``path`` aside in the backup folder, to put back on a failure."""
        slot = self.backups.keep(dir_fd, name)
        self.undo.append(("put_back", path, slot))

    def roll_back(self) -> list[str]:
        """Undo every step taken, newest first; returns the paths that could not be put back."""
        failed: set[str] = set()
        while self.undo:
            action, path, arg = self.undo.pop()
            try:
                self._undo_step(action, path, arg)
            except (OSError, PathBlocked):
                failed.add(path)
        return sorted(failed)

    def _undo_step(self, action: str, path: str, arg: Any) -> None:
        """Undo one logged step: put a backup back, or remove, create or re-mode what it made."""
        parts = path.split("/")
        fd = open_dir(self.root_fd, parts[:-1], create=action in ("put_back", "mkdir"))
        try:
            name = parts[-1]
            if action == "put_back":
                self.backups.put_back(arg, fd, name)
            elif action == "remove":
                os.unlink(name, dir_fd=fd)
            elif action == "rmdir":
                os.rmdir(name, dir_fd=fd)
            elif action == "mkdir":
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
            elif action == "chmod":
                target = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
                try:
                    os.fchmod(target, arg)
                finally:
                    os.close(target)
        finally:
            os.close(fd)

    # deletes -------------------------------------------------------------

    def delete(self, path: str) -> None:
        """Remove the file, link or empty nested-repository folder at ``path``, if it still holds what was recorded."""
        parts = path.split("/")
        try:
            fd = open_dir(self.root_fd, parts[:-1], create=False)
        except FileNotFoundError:
            return  # its folder is gone, so is it
        except PathBlocked as blocked:
            self.skip(path, _blocked_reason(blocked))
            return
        try:
            held, st = self.recorded.looked_at(fd, parts[-1], path)
            if st is None:
                return
            if not held:
                self.skip(path, REASON_CHANGED_ON_DISK)
                return
            if stat.S_ISDIR(st.st_mode):
                # A nested repository's folder (or a race): only ever removed empty.
                try:
                    os.rmdir(parts[-1], dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                        self.skip(path, REASON_CHANGED_ON_DISK)
                        return
                    raise _fail(path, exc) from exc
                self.undo.append(("mkdir", path, None))
            else:
                self._keep(fd, parts[-1], path)
                os.unlink(parts[-1], dir_fd=fd)
            self.synced.add(tuple(parts[:-1]))
        except OSError as exc:
            raise _fail(path, exc) from exc
        finally:
            os.close(fd)

    def prune_folders(self, folders: Iterable[str]) -> None:
        """Remove ``folders`` (:func:`folders_to_prune`) that the deletes left empty, deepest first."""
        for folder in folders:
            if fileops.remove_empty_folder(self.root_fd, folder):
                self.undo.append(("mkdir", folder, None))
                self.synced.add(tuple(folder.split("/")[:-1]))

    # writes --------------------------------------------------------------

    def write(self, path: str, entry: Entry, temp: str | None, link: bytes | None) -> None:
        """Put ``entry`` at ``path`` through its temporary name ``temp``, creating missing folders."""
        parts = path.split("/")
        name = parts[-1]
        try:
            fd = self.folder(tuple(parts[:-1]))
        except PathBlocked as blocked:
            self.skip(path, _blocked_reason(blocked))
            return
        except OSError as exc:
            raise _fail(path, exc) from exc
        try:
            self._write_at(fd, path, name, entry, temp, link)
        except OSError as exc:
            raise _fail(path, exc) from exc
        if path in self.ready and path in self.skipped and temp is not None:
            with contextlib.suppress(OSError):  # written ahead, then left alone
                os.unlink(temp.rsplit("/", 1)[-1], dir_fd=fd)
        self.ready.discard(path)
        self.synced.add(tuple(parts[:-1]))

    def _write_at(
        self, fd: int, path: str, name: str, entry: Entry, temp: str | None, link: bytes | None
    ) -> None:
        """Write ``entry`` as ``name`` in the open folder ``fd``, logging each step to undo."""
        held, existing = self.recorded.looked_at(fd, name, path)
        if not held:
            self.skip(path, REASON_CHANGED_ON_DISK)
            return
        if entry.mode == MODE_GITLINK:
            if existing is None:
                os.mkdir(name, 0o777, dir_fd=fd)
                self.undo.append(("rmdir", path, None))
            elif not stat.S_ISDIR(existing.st_mode):
                self.skip(path, REASON_CHANGED_ON_DISK)
            return
        if (
            path in self.plan.chmod_only
            and existing is not None
            and stat.S_ISREG(existing.st_mode)
            and self._chmod(fd, name, entry.mode, existing)
        ):
            self.undo.append(("chmod", path, stat.S_IMODE(existing.st_mode)))
            return
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            if not remove_empty_tree(fd, name):
                self.skip(path, REASON_IN_THE_WAY)
                return
            self.undo.append(("mkdir", path, None))
            existing = None
        assert temp is not None
        tmp_name = temp.rsplit("/", 1)[-1]
        if entry.mode == MODE_LINK:
            assert link is not None
            os.symlink(link, os.fsencode(tmp_name), dir_fd=fd)
        elif path not in self.ready:
            fileops.write_temp(fd, tmp_name, name, self.stage.take(path, entry), entry.mode, self.umask)
        if os.fstat(fd).st_nlink == 0:  # its folder was removed meanwhile: the file would be lost
            with contextlib.suppress(OSError):
                os.unlink(tmp_name, dir_fd=fd)
            self.skip(path, REASON_CHANGED_ON_DISK)
            return
        if existing is not None:
            self._keep(fd, name, path)
        try:
            os.rename(tmp_name, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name, dir_fd=fd)
            if existing is not None:
                self.undo.pop()  # nothing was replaced: its backup is not needed
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                self.skip(path, REASON_CHANGED_ON_DISK)
                return
            raise
        self.placed.add(path)
        if existing is None:
            self.undo.append(("remove", path, None))

    def _chmod(self, dir_fd: int, name: str, mode: int, existing: os.stat_result) -> bool:
        """Change only the exec bits of the regular file there; False if it must be rewritten.

        A file with other hard links is rewritten instead: its inode may be
        shared with a file outside the worktree, whose mode must not change.
        """
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if (
                not stat.S_ISREG(st.st_mode)
                or st.st_nlink != 1
                or (st.st_dev, st.st_ino) != (existing.st_dev, existing.st_ino)
            ):
                return False
            os.fchmod(fd, file_permissions(mode, st, self.umask))
            return True
        finally:
            os.close(fd)

    def sync(self) -> None:
        """Sync every folder a step changed, so the renames survive a crash (through the descriptor the writes
        used, where one is open: the folder they renamed in, wherever it is now)."""
        for parts in self.synced:
            held = self.folders.get(parts)
            if isinstance(held, int):
                os.fsync(held)
            else:
                fsync_dir(self.root_fd, parts)

