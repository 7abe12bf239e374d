"""Opening a repository: the one place that chooses its back-end, and reading HEAD.

A SHA-1 repository is opened by libgit2 (:class:`~snapshotd.git.libgit.LibgitRepository`,
pygit2's own object); any other (SHA-256, which pygit2's libgit2 1.9 cannot
open) by the git command (:class:`~snapshotd.git.command.GitRepository`).
Both answer the calls of :class:`Backend` as well as the part of pygit2's
interface the store, diff and restore read (``repo[oid]``, ``references``,
``odb``, ``config``, ``create_commit``); so code outside this package never
asks which one it holds. Where a stage runs a different algorithm for the git
command (a capture or a diff by git alone), it asks ``in_process``, or
:func:`libgit2_opens` when it has only a path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol, TypeAlias

import pygit2

from snapshotd.errors import GitError
from snapshotd.git.command import GitRepository
from snapshotd.git.format import HEX_LENGTH, object_format
from snapshotd.git.libgit import LibgitRepository
from snapshotd.git.ownership import check_store_owner
from snapshotd.git.process import GitTarget, run_git_sync

__all__ = [
    "Backend",
    "Repository",
    "head_of",
    "libgit2_opens",
    "open_repository",
    "read_head",
    "repository",
]

ObjectId: TypeAlias = "pygit2.Oid | str"  # a hex string in the git-command back-end


class Backend(Protocol):
    """What both back-ends offer beyond pygit2's shapes: the calls that differ between them."""

    in_process: bool  # True: libgit2 in this process; False: every read and write is a git process
    object_format: str  # "sha1" or "sha256"
    hex_length: int  # digits of a full id: 40 or 64
    path: str  # the git dir, with a trailing slash

    def oid(self, hex_id: str) -> Any:
        """``hex_id`` as this back-end names objects (an ``Oid`` or the hex string)."""

    def resolve_ref(self, name: str) -> Any:
        """The id a full reference name points at, or None."""

    def ref_names(self, prefix: str = "") -> list[str]:
        """Every reference name starting with ``prefix``."""

    def swap_ref(self, name: str, new: Any, expected: Any) -> None:
        """Compare-and-swap of one reference; RefMoved or RefLocked when it cannot."""

    def flush(self) -> bool:
        """Write any objects still queued; True if there were some."""

    def make_durable(self) -> None:
        """Every object written so far is on disk (before a reference names one)."""

    def write_empty_tree(self) -> Any:
        """The empty tree's id, the tree stored."""

    def close(self) -> None:
        """Release what the back-end holds (a reading process)."""


Repository: TypeAlias = "LibgitRepository | GitRepository"


def libgit2_opens(git_dir: str) -> bool:
    """True when the repository at ``git_dir`` is one libgit2 can open (SHA-1): the back-end choice."""
    return object_format(git_dir) == "sha1"


def open_repository(path: str) -> Repository:
    """The repository at ``path`` (a git dir) on the back-end that can open it.

    It must be the user's (:func:`~snapshotd.git.ownership.check_store_owner`)
    before anything of it is read: libgit2 is told not to check (see :mod:`.ownership`).
    One gone by then, or by the time it is opened, is ``not_found`` naming its worktree.
    """
    check_store_owner(path)
    try:
        if libgit2_opens(path):
            return LibgitRepository(path, pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
        return GitRepository(path)
    except pygit2.GitError:
        check_store_owner(path)  # deleted since it was checked: not_found rather than libgit2's words
        raise


@contextlib.contextmanager
def repository(path: str) -> Iterator[Repository]:
    """:func:`open_repository` for one block; a git reader is ended when the block is left."""
    repo = open_repository(path)
    try:
        yield repo
    finally:
        repo.close()


Head: TypeAlias = "tuple[str | None, str | None]"


def read_head(git_dir: str, work_tree: str | None, common_dir: str | None = None) -> Head:
    """HEAD's commit and branch of a worktree (None for each part that is unborn, detached or unreadable).

    ``git_dir`` is the worktree's own git dir, ``common_dir`` the repository's
    (when they differ); read in-process by libgit2 where it can open the
    repository, by git otherwise. Runs blocking: call it on a worker thread.
    """
    if libgit2_opens(common_dir or git_dir):
        return _head_by_libgit2(git_dir)
    try:
        return _head_by_git(git_dir, work_tree)
    except GitError:
        return None, None


def _head_by_libgit2(git_dir: str) -> Head:
    """:func:`read_head` in-process."""
    try:
        repo = pygit2.Repository(git_dir, pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
    except (pygit2.GitError, KeyError, ValueError):
        return None, None
    return head_of(repo)


def head_of(repo: pygit2.Repository) -> Head:
    """:func:`read_head` of a repository libgit2 has open (at the worktree's own git dir).

    HEAD is read once and the branch it names once (each record asks: the
    checkpoint's base), not once per question about it.
    """
    try:
        head = repo.lookup_reference("HEAD")
        if head.type == pygit2.enums.ReferenceType.DIRECT:
            return str(head.target), None
        name = head.target
        try:
            branch = head.resolve()
        except KeyError:  # unborn: the branch HEAD names has no commit yet
            unborn = name.removeprefix("refs/heads/") if isinstance(name, str) else None
            return None, unborn
        return str(branch.target), branch.shorthand
    except (pygit2.GitError, KeyError, ValueError):
        return None, None


def _head_by_git(git_dir: str, work_tree: str | None) -> Head:
    """:func:`read_head` by git: one ``rev-parse`` (and ``symbolic-ref`` on an unborn branch)."""
    target = GitTarget(git_dir=git_dir, work_tree=work_tree)
    out = run_git_sync(target, ["rev-parse", "HEAD", "--symbolic-full-name", "HEAD"], ok_codes=(0, 128))
    lines = out.decode("utf-8", "surrogateescape").split("\n")
    oid: str | None = lines[0]
    if len(lines) >= 2 and len(lines[0]) in HEX_LENGTH.values() and all(c in "0123456789abcdef" for c in lines[0]):
        ref = lines[1]
    else:  # an unborn branch (rev-parse echoes the name it could not resolve)
        oid = None
        ref = run_git_sync(target, ["symbolic-ref", "-q", "HEAD"], ok_codes=(0, 1)).decode("utf-8", "surrogateescape")
    ref = ref.strip()
    return oid, ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None
