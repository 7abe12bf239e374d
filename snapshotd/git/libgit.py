"""The libgit2 back-end: pygit2's own repository, with the few calls the git-command one also has.

Every SHA-1 repository is opened as a :class:`LibgitRepository`, so the
store, diff, restore and capture call the same methods on either back-end
(:class:`snapshotd.git.repository.Backend`) and never ask which one they hold.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import cast

import pygit2

from snapshotd.errors import GitError, RefLocked, RefMoved
from snapshotd.git import bodies, loose

OBJECT_CACHE_BYTES = 8 * 1024 * 1024  # libgit2's default is 256 MiB


def bound_object_cache() -> None:
    """Cap libgit2's object cache, shared by every repository of the process, at :data:`OBJECT_CACHE_BYTES`.

    Each worktree keeps its store open (capture/resident.py), so what its
    checkpoints read stays cached (the previous checkpoint and pin, the trees
    a capture edits): about 2 KB a checkpoint, almost none of it read again,
    which grew a daemon of 25 worktrees by 14 MiB in a minute of 250 sessions.
    The trees a warm capture reads again fit many times over.
    """
    pygit2.settings.cache_max_size(OBJECT_CACHE_BYTES)


class LibgitRepository(pygit2.Repository):
    """A repository libgit2 reads and writes in this process (ids are ``pygit2.Oid``)."""

    in_process = True
    object_format = "sha1"
    hex_length = 40

    def oid(self, hex_id: str) -> pygit2.Oid:
        """``hex_id`` as this back-end names objects."""
        return pygit2.Oid(hex=hex_id)

    def resolve_ref(self, name: str) -> pygit2.Oid | None:
        """The id a reference points at, or None when there is no such reference."""
        ref = self.references.get(name)
        return None if ref is None else cast(pygit2.Oid, ref.target)  # a direct reference: an id

    def ref_names(self, prefix: str = "") -> list[str]:
        """Every reference name, or those starting with ``prefix``."""
        return [name for name in self.references if name.startswith(prefix)]

    def flush(self) -> bool:
        """Nothing waits to be written: each object is written at once."""
        return False

    def create_commit(  # type: ignore[override]
        self,
        update_ref: str | None,
        author: pygit2.Signature,
        committer: pygit2.Signature,
        message: str,
        tree: pygit2.Oid | str,
        parents: Sequence[pygit2.Oid | str],
        encoding: str | None = None,
    ) -> pygit2.Oid:
        """A commit as libgit2 writes it, written by :mod:`.loose` (no reference is updated: ``update_ref`` is None).

        libgit2 would hold the interpreter's lock while the disk works. Its check that the tree
        and parents exist is kept (a look each, no read): a commit naming a tree deleted meanwhile
        (``rm -rf`` under way in ``.git``, say) is never written, as with libgit2 (KeyError, its form).
        """
        if update_ref is not None:
            raise NotImplementedError("create_commit here never updates a reference")
        for needed in (tree, *parents):
            if needed not in self.odb:
                raise KeyError(f"object not found - no match for id ({needed})")
        body = bodies.commit_body(str(tree), [str(parent) for parent in parents], author, committer, message, encoding)
        return loose.write_object(self.path, "commit", body)

    def write_empty_tree(self) -> pygit2.Oid:
        """The empty tree, stored (git treats it as always present, but fsck wants it there)."""
        return loose.write_object(self.path, "tree", b"", self.odb)

    def make_durable(self) -> None:
        """Every object written so far is on disk (:func:`.loose.make_durable`): before a ref names one."""
        loose.make_durable(self.path)

    def close(self) -> None:
        """Nothing to end: libgit2 holds no process."""

    def swap_ref(self, name: str, new: pygit2.Oid | None, expected: pygit2.Oid | None) -> None:
        """Point ``name`` at ``new`` (None: delete it) only if it points at ``expected`` (None: absent).

        The check runs under libgit2's lock of the reference. Raises RefMoved
        when it holds another value, RefLocked when another writer holds the
        lock, GitError for any other failure. A lock the repository took
        along when it was moved meanwhile is removed (:func:`_drop_moved_lock`):
        the lock is opened through the repository's folder as opened before it
        was taken, so it is found even when the move came just after it.
        """
        lock = os.path.join(self.path, name + ".lock")
        held: int | None = None
        root: int | None = None
        with contextlib.suppress(OSError):  # (gone: libgit2's lock says so)
            root = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # follows a move from here on
        updated = False
        try:
            with self.transaction() as txn:
                txn.lock_ref(name)
                if root is not None:
                    with contextlib.suppress(OSError):  # gone with its repository: nothing left to refuse anyone
                        held = os.open(name + ".lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
                if self.resolve_ref(name) != expected:
                    raise RefMoved(name)
                if new is None:
                    txn.remove(name)
                else:
                    txn.set_target(name, new, message="snapshotd")
            updated = True  # committed: libgit2 renamed its lock into place (or removed it with the ref)
        except pygit2.GitError as exc:
            if "lock" in str(exc).lower():
                raise RefLocked(str(exc)) from exc
            raise GitError(f"Could not update {name}: {exc}") from exc
        finally:
            if held is not None:
                if not updated:  # whatever stopped it: a value found moved (RefMoved) as much as a failed rename
                    _drop_moved_lock(held, lock)
                os.close(held)
            if root is not None:
                os.close(root)


def _drop_moved_lock(held: int, lock: str) -> None:
    """Remove the lock file open as ``held`` if it is no longer at ``lock``: its repository was moved.

    libgit2 renames a reference's lock into place, and on failure unlinks it,
    by the path it had when it was taken; the folder moved meanwhile, both
    miss, and the lock stays in the moved repository, where it would refuse
    every update of that reference until it is stale. The kernel knows where
    the open file is now (``/proc/self/fd``); no other writer can hold a lock
    this one created.
    """
    with contextlib.suppress(OSError):
        now = os.readlink(f"/proc/self/fd/{held}")
        mine = os.fstat(held)
        if now == lock or mine.st_nlink == 0:  # still in place (libgit2 cleans it up) or already unlinked
            return
        there = os.lstat(now)
        if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino) and now.endswith(".lock"):
            os.unlink(now)
