"""The walk that watches a folder and every folder below it: iterative, on a worker thread, within budgets.

The walk never runs on the trio loop: a tree of 200,000 folders (or one
renamed in and out of a worktree in a loop) takes seconds to watch, and the
loop must go on answering every other worktree meanwhile. It is iterative
(a chain of folders thousands deep is as good as a wide tree): it descends by
name under the current folder (``O_NOFOLLOW``, so a link is never a folder)
and holds the folders above it open, at most :data:`FOLDERS_HELD`; below
that depth it climbs back through ``..``, checking that it came back to the
folder it left (the device and inode), and a folder moved meanwhile ends the
walk with the watch suspect.

Budgets: the worktree's ceiling of watched folders (past it the watch is
given up and the worktree captured cold, :class:`~snapshotd.errors.WatchGivenUp`),
the room a whole walk has in the user's watches (:mod:`.watchsupply`),
an optional deadline (past it the walk stops and the watch is suspect, so
the next capture scans and re-arms), and cancellation (the host task's, or
``halt``), checked at every folder so that a stopping daemon never waits
for a walk.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import trio

from snapshotd.capture.inotify import OPEN_FOLDER, as_limit, open_in_tree, watch_limit_reached
from snapshotd.errors import WatchGivenUp


class WatchTable(Protocol):
    """What the walk needs of the watcher: watch one open folder, say which folders to enter, hold the count."""

    suspect: str | None

    def watch_folder(self, folder_fd: int, path: str) -> bool: ...

    def to_watch(self, folder_fd: int | None, rel: str, names: list[str], rules: bool = False) -> list[str]:
        """Of the folders ``names`` in ``rel`` (open as ``folder_fd``; ``rules``: it has a ``.gitignore``),
        those the walk enters."""
        ...

    def held(self) -> int: ...


@dataclass
class Budget:
    """How far one walk may go: the worktree's ceiling of folders, a deadline, and a stop flag."""

    ceiling: int
    deadline: float | None = None  # time.monotonic() value; None: no time limit
    halt: threading.Event = field(default_factory=threading.Event)
    room: Callable[[], int] | None = None  # how many folders the walk may hold now (watchsupply)


@dataclass
class _Frame:
    path: str
    rel: str
    names: Iterator[str]
    fd: int | None  # the folder, kept open while the walk is below it (None past FOLDERS_HELD: climbed by "..")
    ident: tuple[int, int] | None  # its device and inode, to check a climb back through ".." against


ROOM_EVERY = 16  # folders between two looks at the room left in the user's watches
FOLDERS_HELD = 64  # folders a walk holds open, from the top; a deeper chain climbs back through ".."


class _Stopped(Exception):
    """The walk stopped early (deadline, or the walk lost its way); the watch is already marked suspect."""


def _check(table: WatchTable, budget: Budget, root: str) -> None:
    if budget.halt.is_set():
        raise _Stopped
    with contextlib.suppress(RuntimeError):  # not on a trio worker thread (a direct call): nothing to ask
        trio.from_thread.check_cancelled()
    if table.held() > budget.ceiling:
        raise WatchGivenUp(
            "watch_ceiling",
            f"{root} has more than {budget.ceiling} folders, the most snapshotd watches in one worktree "
            "(SNAPSHOTD_WATCH_CEILING), so it is not watched and its captures are full scans.",
        )
    held = table.held()
    if budget.room is not None and held % ROOM_EVERY == 0 and held > budget.room():
        raise watch_limit_reached(reserve=True)
    if budget.deadline is not None and time.monotonic() > budget.deadline:
        table.suspect = "new folders took too long to watch"
        raise _Stopped


def _enter(table: WatchTable, fd: int, path: str, rel: str, keep: bool) -> _Frame | None:
    """Watch the open folder and list the folders in it; None when the kernel refused the watch.

    ``keep``: the frame holds ``fd`` (else the walk climbs back to this folder through ".." and checks it).
    """
    if not table.watch_folder(fd, path):
        return None
    ident = None
    if not keep:
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
    names, rules = [], False
    try:
        for entry in os.scandir(fd):
            if entry.is_dir(follow_symlinks=False):
                names.append(entry.name)
            elif entry.name == ".gitignore":
                rules = True
    except OSError:
        names = []
    if names or rules:
        names = table.to_watch(fd, rel, names, rules)
    return _Frame(path, rel, iter(names), fd if keep else None, ident)


def walk(table: WatchTable, folder_fd: int, path: str, rel: str, budget: Budget, root: str) -> int:
    """Watch the folder open as ``folder_fd`` (``rel`` under the worktree ``root``) and all below; how many.

    ``folder_fd`` stays the caller's. Raises :class:`WatchGivenUp` past the
    ceiling or at a kernel limit, and trio's ``Cancelled`` when the host task is.
    The folders above the current one are held open up to :data:`FOLDERS_HELD`
    deep, so most climbs cost no system call; deeper, the walk climbs through
    ".." and checks that it came back to the folder it left.
    """
    current = os.dup(folder_fd)  # the top frame's folder; owned by that frame when it keeps it
    stack: list[_Frame] = []
    count = 0
    try:
        first = _enter(table, current, path, rel, keep=True)
        if first is None:
            return 0
        stack.append(first)
        count = 1
        while stack:
            _check(table, budget, root)
            top = stack[-1]
            name = next(top.names, None)
            if name is None:
                stack.pop()
                if not stack:
                    break
                below = stack[-1]
                if below.fd is not None:
                    os.close(current)
                    current = below.fd
                    continue
                parent = os.open("..", OPEN_FOLDER, dir_fd=current)
                os.close(current)
                current = parent
                st = os.fstat(current)
                if (st.st_dev, st.st_ino) != below.ident:
                    table.suspect = f"a folder moved while it was being watched: {top.path}"
                    raise _Stopped
                continue
            try:
                child = os.open(name, OPEN_FOLDER, dir_fd=current)
            except OSError as exc:  # gone, replaced by a link, unreadable (git cannot read it either)...
                limit = as_limit(exc)
                if isinstance(limit, WatchGivenUp):  # ... or the daemon is out of descriptors
                    raise limit from exc
                continue
            try:
                frame = _enter(
                    table, child, f"{top.path}/{name}", f"{top.rel}/{name}" if top.rel else name,
                    keep=len(stack) < FOLDERS_HELD,
                )
            except BaseException:
                os.close(child)
                raise
            if frame is None:
                os.close(child)
                continue
            if top.fd is None:
                os.close(current)
            current = child
            stack.append(frame)
            count += 1
    except _Stopped:
        pass
    except OSError as exc:  # climbing back failed: the tree changed under the walk
        table.suspect = f"a folder changed while it was being watched ({exc.strerror})"
    finally:
        held = {frame.fd for frame in stack if frame.fd is not None}
        for fd in held | {current}:
            os.close(fd)
    return count


def watch_tree(table: WatchTable, root: str, rel: str, budget: Budget) -> int:
    """Watch the worktree folder ``rel`` ("" is the root) and everything below it; how many were watched."""
    try:
        fd = open_in_tree(root, rel)
    except OSError as exc:
        if not rel:
            table.suspect = f"the worktree folder could not be opened ({exc.strerror})"
        return 0
    try:
        return walk(table, fd, os.path.join(root, rel) if rel else root, rel, budget, root)
    finally:
        os.close(fd)


def watch_each(table: WatchTable, folders: list[str]) -> None:
    """Watch each folder on its own, none below it (folders outside the worktree's walk); one gone is left."""
    for folder in folders:
        with contextlib.suppress(OSError):
            fd = os.open(folder, OPEN_FOLDER)
            try:
                table.watch_folder(fd, folder)
            finally:
                os.close(fd)
