"""A private copy of some of the worktree's paths, for a git that opens files by path.

git opens every file it hashes by its full path, so a neighbour who swaps a
folder above one for a link (to ``~/.ssh``, say) while git runs has it hash
what lies outside the worktree. Where git must do the hashing (its filters
and line-ending rules, and every capture of a repository or index libgit2
cannot read), its work tree is a copy instead: each path is read through the
capture's :class:`~snapshotd.capture.walker.Walker` (never through a link)
into a folder made by descriptor in the user's own ``.git/snapshotd/tmp``
(0700). The copy keeps what git records of a path: the bytes (at most the
size the file had when opened, as git reads it), the executable bit, a link's
target, a folder where a file was, and, for a nested repository, the commit
it has checked out, read in-process by descriptor and given to git as a
``.git`` holding only that ``HEAD``. The ``.gitattributes`` above a copied
path are copied too; the index, the configuration and the other attributes
files are the repository's, so git's answer is the one it gives in the
worktree. A filter that reads other files of the worktree (none of git's own
do) sees only the copy.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections import OrderedDict

from snapshotd.capture.gitlinks import commit_at
from snapshotd.capture.walker import Walker
from snapshotd.errors import Untrusted
from snapshotd.fsutil import open_private_folder, pid_alive, write_all
from snapshotd.git.attributes import ATTRIBUTES_FILE

PREFIX = "tree-"  # then the pid: a copy left by a process that died is removed at the next open
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_OPEN_FOLDERS = 64
_CHUNK = 1 << 20


def attributes_above(path: str) -> list[str]:
    """The ``.gitattributes`` files git reads for ``path`` in the check-in direction, root first."""
    parts = path.split("/")[:-1]
    return ["/".join([*parts[:depth], ATTRIBUTES_FILE]) for depth in range(len(parts) + 1)]


def _copy_bytes(source: int, target: int, size: int) -> None:
    """Copy ``size`` bytes (fewer if the file shrank) from ``source`` to ``target``, in the kernel where it can."""
    left = size
    try:
        while left > 0:
            done = os.copy_file_range(source, target, min(left, 1 << 30))
            if done == 0:
                return
            left -= done
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
            raise
    while left > 0:  # a file system copy_file_range does not serve: plain reads, on from where it stopped
        data = os.read(source, min(left, _CHUNK))
        if not data:
            return
        left -= len(data)
        write_all(target, data)


class Mirror:
    """One copy for one git run: made empty in ``tmp_dir``, filled path by path, removed on close."""

    def __init__(self, walker: Walker, tmp_dir: str) -> None:
        self.walker = walker
        self._tmp_fd = open_private_folder(tmp_dir)
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        try:
            os.mkdir(name, 0o700, dir_fd=self._tmp_fd)
            self._root_fd = os.open(name, _FOLDER_FLAGS, dir_fd=self._tmp_fd)
        except BaseException:
            os.close(self._tmp_fd)
            raise
        self.name = name
        self.path = os.path.join(tmp_dir, name)
        self._folders: OrderedDict[str, int | None] = OrderedDict()
        self._done: dict[str, os.stat_result | None] = {}  # each path copied, with its stat as copied
        self._tried: set[str] = set()  # the attributes files looked for

    def __enter__(self) -> Mirror:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the copy (relative to the private folder's descriptor) and let go of its descriptors."""
        for fd in self._folders.values():
            if fd is not None:
                os.close(fd)
        self._folders.clear()
        os.close(self._root_fd)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.name, dir_fd=self._tmp_fd)
        os.close(self._tmp_fd)

    def _folder(self, folder: str) -> int | None:
        """The copy's folder ``folder`` ("" its root), made 0700 where missing; None where a copied file is.

        Iterative, from the deepest folder already open down, as the walker's.
        """
        missing: list[str] = []
        above = folder
        while above and above not in self._folders:
            missing.append(above)
            above = above.rpartition("/")[0]
        if above:
            self._folders.move_to_end(above)
        fd = self._folders[above] if above else self._root_fd
        for inner in reversed(missing):
            if fd is not None:
                name = inner.rpartition("/")[2]
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fd)
                try:
                    fd = os.open(name, _FOLDER_FLAGS, dir_fd=fd)
                except OSError as exc:  # a file or link copied there: the worktree changed between two reads
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    fd = None
            self._folders[inner] = fd
            while len(self._folders) > _MAX_OPEN_FOLDERS:  # never the newest, the next one's parent
                _, old = self._folders.popitem(last=False)
                if old is not None:
                    os.close(old)
        return fd

    def copy_attributes_above(self, path: str) -> None:
        """Copy each ``.gitattributes`` git reads for ``path``, where it is a regular file (git follows no link there)."""
        for name in attributes_above(path):
            if name not in self._tried:
                self._tried.add(name)
                self.copy_file(name)

    def copy_file(self, path: str) -> os.stat_result | None:
        """Copy ``path`` if it is a regular file now; its fstat after the copy, or None (gone, or another kind)."""
        if path in self._done:
            return self._done[path]
        source = self.walker.open_file(path)
        if source is None:
            return None
        try:
            opened = os.fstat(source)
            if not stat.S_ISREG(opened.st_mode):
                return None
            folder, _, name = path.rpartition("/")
            parent = self._folder(folder)
            if parent is None:
                return None
            try:
                target = os.open(name, _NEW_FILE, 0o600, dir_fd=parent)
            except (FileExistsError, IsADirectoryError):  # a folder copied there: the worktree changed meanwhile
                return None
            try:
                _copy_bytes(source, target, opened.st_size)
                os.fchmod(target, 0o700 if opened.st_mode & stat.S_IXUSR else 0o600)  # whatever the umask
            finally:
                os.close(target)
            copied = self._done[path] = os.fstat(source)
            return copied
        finally:
            os.close(source)

    def copy(self, path: str, *, folder: bool, commit: str | None = None) -> os.stat_result | None:
        """Copy ``path`` as it is now: a file, a link, or (with ``folder``) a folder; its lstat, or None if not copied.

        A folder is copied empty, or, when a nested repository is there, as a
        ``.git`` whose ``HEAD`` is the commit it has checked out (``commit``
        when the caller read it already): what git reads to record a gitlink.
        """
        if path in self._done:
            return self._done[path]
        st = self.walker.lstat(path)
        if st is None:
            return None
        if stat.S_ISREG(st.st_mode):
            return self.copy_file(path)
        parent_name, _, name = path.rpartition("/")
        if stat.S_ISLNK(st.st_mode):
            target = self.walker.readlink(path)
            parent = self._folder(parent_name)
            if target is None or parent is None:
                return None
            try:
                os.symlink(target, os.fsencode(name), dir_fd=parent)
            except FileExistsError:  # a folder copied there: the worktree changed meanwhile
                return None
        elif stat.S_ISDIR(st.st_mode) and folder:
            commit = commit or commit_at(self.walker, path)
            made = self._folder(path)
            if made is None:
                return None
            if commit is not None:
                self._fake_repository(made, commit)
        else:
            return None  # a FIFO, socket or device: git finds nothing there
        after = self._done[path] = self.walker.lstat(path)
        return after

    @staticmethod
    def _fake_repository(folder_fd: int, commit: str) -> None:
        """A ``.git`` in ``folder_fd`` that git takes for a repository with ``commit`` checked out."""
        os.mkdir(".git", 0o700, dir_fd=folder_fd)
        dotgit = os.open(".git", _FOLDER_FLAGS, dir_fd=folder_fd)
        try:
            for name in ("objects", "refs"):
                os.mkdir(name, 0o700, dir_fd=dotgit)
            head = os.open("HEAD", _NEW_FILE, 0o600, dir_fd=dotgit)
            try:
                os.write(head, commit.encode("ascii") + b"\n")
            finally:
                os.close(head)
        finally:
            os.close(dotgit)


def remove_stale_mirrors(tmp_dir: str) -> list[str]:
    """Remove the copies in ``tmp_dir`` whose process is gone (a crash mid-capture); their names."""
    try:
        fd = open_private_folder(tmp_dir, create=False)
    except (FileNotFoundError, NotADirectoryError, Untrusted):
        return []
    removed = []
    try:
        for name in os.listdir(fd):
            pid_text = name[len(PREFIX):].split("-", 1)[0] if name.startswith(PREFIX) else ""
            if pid_text.isdigit() and not pid_alive(int(pid_text)):
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    shutil.rmtree(name, dir_fd=fd)
                removed.append(name)
    finally:
        os.close(fd)
    return removed
