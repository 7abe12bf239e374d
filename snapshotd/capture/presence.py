"""Whether an open worktree is still where it was opened: deleted, moved and unmounted worktrees.

An agent server creates and deletes worktrees all day; one that vanishes
must cost its own captures only. The worktree's root folder is known by its
device and inode when a request first finds it: a check (on a worker thread,
from the worktree's supervisor and after a failed capture) finds it gone when
the path no longer holds that folder, a git worktree no longer holds its git
dir, or its git dir no longer holds its id (a folder made anew can be given
the freed inode back, so the inode alone cannot tell).
The watcher tells moved from deleted (its root's own ``IN_MOVE_SELF`` or
``IN_DELETE_SELF``); without it the worktree is only known to be gone. A
linked worktree whose folder and git's own folder for it (``worktrees/NAME``)
are both gone was removed with git (``git worktree remove``, or ``prune``
once it went): git has no worktree there to move or mend either, so it is
``removed``, not a problem to look at.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from snapshotd.errors import NotFound
from snapshotd.fsutil import MISSING_ERRNOS, changed_while_opened
from snapshotd.store.identity import WorktreeInfo
from snapshotd.store.statedir import read_id_of, state_folder

MOVED = "moved"
GONE = "gone"
REMOVED = "removed"  # a linked worktree git no longer has either: `git worktree remove`, or its prune
HERE = "here"

RootId = tuple[int, int]


@dataclass(frozen=True)
class Vanished:
    """A worktree no longer at its path: ``how`` is ``moved`` or ``gone``, ``message`` the sentence shown."""

    how: str
    message: str

    def to_wire(self) -> dict[str, str | None]:
        return {"presence": self.how, "problem": self.message}


def root_id(path: str) -> RootId | None:
    """The device and inode of the folder at ``path`` (None when there is none)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def check(info: WorktreeInfo, opened: RootId | None, hint: str | None = None) -> Vanished | None:
    """Why the worktree is no longer at ``info.path`` (None while it is); blocking: on a worker thread.

    ``opened`` is the root's device and inode when it was opened; ``hint``
    what the watcher saw happen to the root (``moved`` or ``gone``).
    """
    now = root_id(info.path)
    missing_git = info.git_dir is not None and not _still_a_repository(info.git_dir, info.common_dir)
    if now is not None and (opened is None or now == opened) and not missing_git and _keeps_its_id(info):
        return None  # here (perhaps moved away and back)
    how = MOVED if hint == MOVED else GONE
    if now is None and removed_with_git(info.git_dir, info.common_dir):
        return _removed(info)
    if how == MOVED:
        return Vanished(
            MOVED,
            f"The worktree {info.id} was moved away from {info.path}; "
            "run 'snapshotd repair NEW_PATH' (or use it at its new path) to keep its checkpoints.",
        )
    deleted = "it was deleted, moved or unmounted"
    what = "its git folder is gone or no longer a repository" if now is not None and missing_git else deleted
    return Vanished(
        GONE,
        f"The worktree {info.id} is no longer at {info.path} ({what}); "
        "if it moved, run 'snapshotd repair NEW_PATH' to keep its checkpoints.",
    )


def looked_at_again(info: WorktreeInfo, vanished: Vanished) -> Vanished:
    """A worktree found ``gone`` may since have been removed with git: ``git worktree remove`` deletes the
    folder before git's own, and ``prune`` runs later; blocking: on a worker thread."""
    if vanished.how == GONE and not os.path.lexists(info.path) and removed_with_git(info.git_dir, info.common_dir):
        return _removed(info)
    return vanished


def _removed(info: WorktreeInfo) -> Vanished:
    return Vanished(
        REMOVED,
        f"The worktree {info.id} at {info.path} was removed with git (git has no worktree there any more); "
        f"its checkpoints stay in {info.common_dir}, and 'snapshotd forget {info.id}' drops its record.",
    )


def removed_with_git(git_dir: str | None, common_dir: str | None) -> bool:
    """Whether ``git_dir`` was a linked worktree's folder in ``common_dir`` (``worktrees/NAME``) and is gone."""
    if not git_dir or not common_dir or os.path.normpath(git_dir) == os.path.normpath(common_dir):
        return False
    return not os.path.lexists(git_dir) and os.path.isdir(common_dir)


def _still_a_repository(git_dir: str, common_dir: str | None) -> bool:
    """Whether the git dir is still one: ``rm -rf`` under way may have taken its ``HEAD`` or objects already."""
    objects = os.path.join(common_dir or git_dir, "objects")
    return os.path.isdir(git_dir) and os.path.lexists(os.path.join(git_dir, "HEAD")) and os.path.isdir(objects)


def _keeps_its_id(info: WorktreeInfo) -> bool:
    """Whether a git worktree whose id lives in its git dir still has that id there (always, for others)."""
    if info.git_dir is None or Path(info.state_dir) != state_folder(info.git_dir):
        return True
    return read_id_of(info.git_dir) == info.id


def went_missing(exc: BaseException, *infos: WorktreeInfo) -> str | None:
    """What of the worktree was missing when ``exc`` happened (None when that was not the cause).

    Looks down ``exc``'s chain (and into exception groups) for a missing file
    or folder in the worktree or its git folder, at any of the places
    ``infos`` give (a worktree moved while it was captured has two), or a git
    that could not start (its folder, the worktree, gone: git itself is on PATH).
    """
    places = [p.rstrip("/") + "/" for info in infos for p in (info.path, info.git_dir) if p]
    pending: list[BaseException] = [exc]
    for _ in range(16):
        if not pending:
            return None
        seen = pending.pop()
        if isinstance(seen, BaseExceptionGroup):
            pending.extend(seen.exceptions)
            continue
        if isinstance(seen, OSError) and seen.errno in MISSING_ERRNOS:
            name = os.fsdecode(seen.filename) if seen.filename is not None else None
            if name is None and shutil.which("git") is None:
                return None  # no git at all: not the worktree's doing
            if name is not None and not any((name + "/").startswith(place) for place in places):
                return None
            what = os.strerror(seen.errno)
            return f"{what}: {name}" if name else f"git could not start there: {what}"
        pending.extend(e for e in (seen.__cause__ or seen.__context__,) if e is not None)
    return None


def changed_while_captured(exc: BaseException, info: WorktreeInfo, opened: WorktreeInfo | None) -> str | None:
    """The sentence for work on ``info`` that failed on something of it gone missing (None: not that)."""
    missing = went_missing(exc, info, *([opened] if opened is not None else []))
    if missing is None:
        return None
    return (
        f"The worktree {info.id} at {info.path} changed while it was captured ({missing}); "
        "it was deleted, moved or made anew meanwhile: checkpoint it again."
    )


@contextlib.contextmanager
def naming_the_path_asked(asked: object) -> Iterator[None]:
    """A worktree found changed while it was opened is named as the client asked for it (``asked``, a path).

    The store or the worktree looked at is the one the request's worktree had
    a moment before: a worktree moved mid-request is met at its old place by
    a request that found it at the new one (their captures are shared), and a
    linked worktree's store is its main worktree's. The sentence names the
    path given, with what was missing where; other errors go on as they are.
    """
    try:
        yield
    except NotFound as exc:
        named, missing = exc.data.get("path"), exc.__cause__
        if not isinstance(asked, str) or not isinstance(named, str) or not isinstance(missing, OSError):
            raise
        real = os.path.realpath(asked)
        if named in (asked, real) or real.startswith(named.rstrip("/") + "/"):
            raise
        raise changed_while_opened(asked, missing) from exc
