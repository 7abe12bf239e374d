"""Reaching the worktree's files from beneath its root, never through a link.

A capture reads nothing outside the worktree: each folder is opened from its
parent's descriptor with ``O_NOFOLLOW | O_DIRECTORY``, and every lstat, open
and readlink is relative to the descriptor of the file's own folder. A folder
swapped for a symlink (to ``~/.ssh``, say) while a capture runs is then a
folder that is not there, never a way out: the kernel refuses the link at
that one component, on every kernel (no ``openat2`` needed). The
descriptors are kept for the capture (a few, least recently used first out),
so the warm path pays one ``openat`` per folder, not one per component.
"""

from __future__ import annotations

import errno
import os
from collections import OrderedDict

# O_PATH: a folder only searchable (mode 0111) is reached as a path walk reaches it.
DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_OPEN_FOLDERS = 64
# The entry is not there or not what it was a moment ago (a folder swapped for a
# link or a file, a link for a folder): the path is taken as gone.
CHANGED = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EINVAL)


class Walker:
    """One capture's view of the worktree: folders held open, reached only through real folders."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._root_fd: int | None = None
        self._open: OrderedDict[str, int | None] = OrderedDict()

    def close(self) -> None:
        """Close every descriptor held (the walker can be used again: it reopens what it needs)."""
        for fd in self._open.values():
            if fd is not None:
                os.close(fd)
        self._open.clear()
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None

    def __enter__(self) -> Walker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def folder_fd(self, folder: str) -> int | None:
        """A descriptor of the worktree folder ``folder`` ("" is the root), or None if it is not a real folder now."""
        if folder == "":
            if self._root_fd is None:
                self._root_fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            return self._root_fd
        # Iterative, from the deepest folder already open down: a chain may be thousands deep.
        missing: list[str] = []
        above = folder
        while above and above not in self._open:
            missing.append(above)
            above = above.rpartition("/")[0]
        if above:
            self._open.move_to_end(above)
        fd = self._open[above] if above else self.folder_fd("")
        for inner in reversed(missing):
            if fd is not None:
                try:
                    fd = os.open(inner.rpartition("/")[2], DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in CHANGED:
                        raise
                    fd = None
            self._open[inner] = fd
            while len(self._open) > MAX_OPEN_FOLDERS:  # never the newest, the next one's parent
                _, old = self._open.popitem(last=False)
                if old is not None:
                    os.close(old)
        return fd

    def _place(self, path: str) -> tuple[int | None, str]:
        folder, _, name = path.rpartition("/")
        return self.folder_fd(folder), name

    def parent_is_real(self, path: str) -> bool:
        """Whether every folder above ``path`` is a real folder (no symlink, no file in the way)."""
        return self._place(path)[0] is not None

    def lstat(self, path: str) -> os.stat_result | None:
        """The lstat of ``path`` reached through real folders only; None when it is not there."""
        fd, name = self._place(path)
        if fd is None:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in CHANGED:
                return None
            raise

    def names(self, folder: str) -> list[str] | None:
        """The names in the worktree folder ``folder`` (reached through real folders only); None when it is not one now."""
        fd = self.folder_fd(folder)
        if fd is None:
            return None
        try:
            listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno in CHANGED:
                return None
            raise
        try:
            return os.listdir(listing)
        finally:
            os.close(listing)

    def readlink(self, path: str) -> bytes | None:
        """The target of the symlink ``path``; None when it is gone or no longer a link."""
        fd, name = self._place(path)
        if fd is None:
            return None
        try:
            return os.readlink(os.fsencode(name), dir_fd=fd)
        except OSError as exc:
            if exc.errno in CHANGED:
                return None
            raise

    def open_file(self, path: str) -> int | None:
        """A read-only descriptor of ``path`` (never through a link, never blocking); None when it is not there."""
        fd, name = self._place(path)
        if fd is None:
            return None
        try:
            return os.open(name, FILE_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in CHANGED:
                return None
            raise
