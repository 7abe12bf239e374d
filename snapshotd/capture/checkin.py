"""Hashing files through git's filters as ``git add`` does, with the index entries git's conversion reads.

git's clean direction (convert.c, ``convert_to_git``) reads the index in two
places. ``has_crlf_in_index`` keeps a file as it is under ``text=auto`` (or
``core.autocrlf`` with no ``text`` attribute) when the blob the index holds at
its path has CRLF line endings: git's "safer autocrlf". And attributes are read
in the check-in direction: a folder's ``.gitattributes`` from the worktree, or,
when that file cannot be read there, the index's copy. ``hash-object`` loads no
index, so neither holds for it.

Here ``update-index`` hashes the files into a private index holding exactly what
those two reads find in ``git add -A``: the user's blob at each path hashed
(stage 0, else "ours" of a conflict, as ``read_blob_data_from_index`` picks) and
each ``.gitattributes`` the user's index keeps that is not on disk (flagged
skip-worktree or assume-unchanged; an unflagged one is removed by ``git add
-A`` before its folder's files are read). The new ids are read back
in-process: one process, as ``hash-object`` was. ``core.safecrlf`` is off for
it: that setting only makes ``git add`` refuse or warn about a conversion, and
a checkpoint records what git would store.

git opens the files it hashes by path, so it hashes a private copy of them
and of the ``.gitattributes`` above them, read by descriptor
(capture/mirror.py): a folder swapped for a link while git runs is never
followed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

import pygit2

from snapshotd.capture.mirror import Mirror
from snapshotd.capture.scan import git_target, read_index
from snapshotd.capture.userindex import index_blob
from snapshotd.capture.walker import Walker
from snapshotd.fsutil import checked_private_folder
from snapshotd.git.attributes import ATTRIBUTES_FILE
from snapshotd.git.modes import MODE_FILE
from snapshotd.git.process import GitTarget, run_git_sync
from snapshotd.store.identity import WorktreeInfo

__all__ = ["NO_SAFECRLF", "Pending", "hash_through_git", "is_attributes"]

# core.safecrlf=false for one git command, whatever the user's configuration says.
NO_SAFECRLF = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.safecrlf", "GIT_CONFIG_VALUE_0": "false"}


@dataclass(frozen=True)
class Pending:
    """A file for git to hash: its path and the user's index blob there (None: no blob)."""

    path: str
    basis: pygit2.Oid | None


def is_attributes(path: str) -> bool:
    """Whether ``path`` names a ``.gitattributes`` file (in any folder)."""
    return path.rpartition("/")[2] == ATTRIBUTES_FILE


def hash_through_git(
    info: WorktreeInfo,
    files: list[Pending],
    kept_attributes: Iterable[tuple[str, pygit2.Oid]],
    walker: Walker,
) -> list[pygit2.Oid | None]:
    """The blob git records for each of ``files`` (None where git recorded nothing), written to the store.

    ``kept_attributes`` are the ``.gitattributes`` entries of the user's index
    that stand though their file is not on disk; ``walker`` reads the worktree.
    """
    folder = checked_private_folder(os.path.join(info.state_dir, "tmp"))
    index_path = os.path.join(folder, f"checkin-{os.getpid()}-{secrets.token_hex(6)}")
    try:
        seed = pygit2.Index(index_path)
        entries = {path: oid for path, oid in kept_attributes}
        entries.update((item.path, item.basis) for item in files if item.basis is not None)
        for path, oid in entries.items():
            # No stat data: git hashes every file anew.
            seed.add(pygit2.IndexEntry(path, oid, MODE_FILE))  # type: ignore[arg-type]  # an int mode; pygit2's stub says FileMode
        seed.write()
        listing = b"".join(os.fsencode(item.path) + b"\0" for item in files)
        with Mirror(walker, folder) as mirror:
            for item in files:
                mirror.copy_attributes_above(item.path)
                mirror.copy_file(item.path)
            run_git_sync(
                GitTarget(git_dir=git_target(info).git_dir, work_tree=mirror.path),
                ["update-index", "-z", "--add", "--remove", "--replace", "--stdin"],
                index_file=index_path,
                input=listing,
                env_extra=NO_SAFECRLF,
            )
        written = read_index(index_path)
        return [index_blob(written, item.path) for item in files]
    finally:
        for leftover in (index_path, index_path + ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
