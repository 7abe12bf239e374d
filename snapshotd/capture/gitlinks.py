"""Which gitlinks moved: the commit each submodule or nested repository has checked out, read in-process.

A submodule's HEAD lives under the superproject's ``.git/modules/`` (its
``.git`` is a file naming that folder), where the watcher does not look, and
a commit, checkout or reset inside it changes none of the worktree's files
that git records. A warm capture therefore reads each gitlink's HEAD and the
ref it names (loose or packed) as plain files, with no process, and
re-examines the gitlinks whose commit is not the one recorded.
"""

from __future__ import annotations

import os
import string
from collections.abc import Iterable, Mapping

import pygit2

from snapshotd.capture.walker import Walker
from snapshotd.git.modes import MODE_GITLINK

UNREADABLE = "?"  # a repository is there, but its HEAD cannot be read as plain files (reftable, say)
_HEX = frozenset(string.hexdigits.lower())
_MAX_SYMREF_DEPTH = 5


def note_changes(gitlinks: set[str], changes: Mapping[str, tuple[pygit2.Oid, int] | None]) -> None:
    """Follow a capture's index changes: entries that became gitlinks or stopped being one."""
    for path, value in changes.items():
        if value is not None and value[1] == MODE_GITLINK:
            gitlinks.add(path)
        else:
            gitlinks.discard(path)


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(4096).decode("utf-8", "surrogateescape").strip()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _is_id(text: str) -> bool:
    return len(text) in (40, 64) and set(text) <= _HEX


def _git_dir(folder: str) -> str | None:
    """The git folder of the repository at ``folder``: its ``.git``, or where a ``.git`` file points."""
    dotgit = os.path.join(folder, ".git")
    if os.path.isdir(dotgit):
        return dotgit
    text = _read(dotgit)
    if text is None or not text.startswith("gitdir:"):
        return None
    return os.path.join(folder, text[len("gitdir:"):].strip())


def _packed(common: str, ref: str) -> str | None:
    text = _read(os.path.join(common, "packed-refs"))
    for line in (text or "").splitlines():
        value, _, name = line.partition(" ")
        if name == ref and _is_id(value):
            return value
    return None


def checked_out(folder: str) -> str | None:
    """The commit the repository at ``folder`` has checked out, as hex.

    None when there is no repository there or its branch has no commit yet;
    :data:`UNREADABLE` when one is there but its refs are not plain files.
    """
    try:
        git_dir = _git_dir(folder)
        if git_dir is None:
            return None
        head = _read(os.path.join(git_dir, "HEAD"))
        common_link = _read(os.path.join(git_dir, "commondir"))
        common = os.path.join(git_dir, common_link) if common_link else git_dir
        if head is None or os.path.exists(os.path.join(common, "reftable")):
            return UNREADABLE
        for _ in range(_MAX_SYMREF_DEPTH):
            if _is_id(head):
                return head
            if not head.startswith("ref:"):
                return UNREADABLE
            ref = head[len("ref:"):].strip()
            found = _read(os.path.join(git_dir, ref)) or _read(os.path.join(common, ref))
            if found is None:
                return _packed(common, ref)
            head = found
    except OSError:
        pass
    return UNREADABLE


def commit_at(walker: Walker, path: str) -> str | None:
    """:func:`checked_out` for the folder ``path`` of the walker's worktree, reached by descriptor; None for no commit.

    The folder is the one the walker opened beneath the root (never through a
    link), named to the reads as ``/proc/self/fd/N``, so a folder above it
    swapped for a link meanwhile does not redirect them; what its ``.git``
    names (a ``gitdir:`` file, a ``commondir``) is followed, as git follows
    it. Without ``/proc`` the folder is read by its path.
    """
    fd = walker.folder_fd(path)
    if fd is None:
        return None
    folder = f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else os.path.join(walker.root, path)
    found = checked_out(folder)
    return None if found == UNREADABLE else found


def moved(root: str, index: pygit2.Index, gitlinks: Iterable[str]) -> set[str]:
    """The gitlinks of ``index`` whose repository now has another commit checked out (or cannot say)."""
    found = set()
    for path in gitlinks:
        try:
            recorded = str(index[path].id)
        except (KeyError, ValueError):
            continue
        now = checked_out(os.path.join(root, path))
        if now is not None and now != recorded:
            found.add(path)
    return found
