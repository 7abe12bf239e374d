"""The libgit2 back-end: pygit2's own repository, with the few calls the git-command one also has.

Every SHA-1 repository is opened as a :class:`LibgitRepository`, so the
store, diff, restore and capture call the same methods on either back-end
(:class:`snapshotd.git.repository.Backend`) and never ask which one they hold.
"""

from __future__ import annotations

from typing import cast

import pygit2

from snapshotd.errors import GitError, RefLocked, RefMoved


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
        """Nothing waits to be written: libgit2 writes each object at once."""
        return False

    def close(self) -> None:
        """Nothing to end: libgit2 holds no process."""

    def swap_ref(self, name: str, new: pygit2.Oid | None, expected: pygit2.Oid | None) -> None:
        """Point ``name`` at ``new`` (None: delete it) only if it points at ``expected`` (None: absent).

        The check runs under libgit2's lock of the reference. Raises RefMoved
        when it holds another value, RefLocked when another writer holds the
        lock, GitError for any other failure.
        """
        try:
            with self.transaction() as txn:
                txn.lock_ref(name)
                if self.resolve_ref(name) != expected:
                    raise RefMoved(name)
                if new is None:
                    txn.remove(name)
                else:
                    txn.set_target(name, new, message="snapshotd")
        except pygit2.GitError as exc:
            if "lock" in str(exc).lower():
                raise RefLocked(str(exc)) from exc
            raise GitError(f"Could not update {name}: {exc}") from exc
