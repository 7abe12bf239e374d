"""Finding checkpoints in one store: by id prefix, by seq, and counting back from a session's newest.

Each lookup reads as little as it can: a prefix is looked up as an object
(git's own list of matching objects only when it is ambiguous), a session's
newest is its ref's head pin, and counting back or finding a seq reads the
session's index (:mod:`snapshotd.store.index`), never its whole chain. A prefix matches
checkpoints only, never another object of the repository; one fetched from a
remote counts too (:mod:`snapshotd.store.remotes`).
"""

from __future__ import annotations

import os

from snapshotd.errors import NotFound
from snapshotd.git.process import GitTarget, run_git_sync
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.refnames import ref_name
from snapshotd.store.remotes import remote_of


def _checkpoint_at(store: Store, object_id: str) -> Checkpoint | None:
    """The live checkpoint ``object_id`` is, or None for any other object (or a deleted checkpoint).

    A checkpoint fetched from a remote is live while its fetched ref pins it.
    """
    try:
        checkpoint = store.load(object_id)
    except NotFound:
        return None
    return checkpoint if store.is_live(checkpoint) or remote_of(store, checkpoint) else None


def _objects_with_prefix(store: Store, prefix: str) -> list[str]:
    """Every object id of the store starting with ``prefix``, as ``git rev-parse --disambiguate`` lists them."""
    out = run_git_sync(GitTarget(store.repo.path, None), ["rev-parse", f"--disambiguate={prefix}"])
    return [os.fsdecode(line) for line in out.split(b"\n") if line]


def by_prefix(store: Store, prefix: str) -> list[Checkpoint]:
    """The live checkpoints whose id starts with ``prefix`` (lower-case hex), at most a few."""
    if len(prefix) > store.hex_length:
        return []
    try:
        obj = store.repo[prefix]
    except KeyError:
        return []
    except ValueError as exc:  # pygit2.AmbiguousError is one; the git command's back-end says so too
        if "ambiguous" not in str(exc).lower():
            return []
        ids = _objects_with_prefix(store, prefix)
    else:
        ids = [str(obj.id)]
    return [checkpoint for checkpoint in (_checkpoint_at(store, each) for each in ids) if checkpoint is not None]


def session_heads(store: Store, worktree_id: str) -> list[Checkpoint]:
    """The newest checkpoint of each of the worktree's sessions that has one, newest first."""
    heads = [store.load(ids[0]) for ids in (store.newest_ids(name, 1) for name in store.session_refs(worktree_id)) if ids]
    return sorted(heads, key=lambda cp: (cp.created_at, cp.seq), reverse=True)


def back_from_head(store: Store, worktree_id: str, session: str | None, back: int, path: str) -> Checkpoint:
    """The checkpoint ``back`` before the newest of the session; NotFound (naming the worktree at ``path``) when shorter."""
    ids = store.newest_ids(ref_name(worktree_id, session), back + 1)
    if len(ids) > back:
        return store.load(ids[back])
    count = len(ids)
    where = f"session {session!r}" if session is not None else "the default session"
    if count == 0:
        raise NotFound(f"There is no checkpoint in {where} of the worktree {path}; `snapshotd list` shows its sessions.")
    held = f"{count} checkpoint" if count == 1 else f"{count} checkpoints"
    raise NotFound(
        f"{where[0].upper()}{where[1:]} of the worktree {path} has {held}, so none is {back} before the newest; "
        "`snapshotd list` shows them."
    )


def by_seq(store: Store, worktree_id: str, session: str | None, seq: int) -> Checkpoint | None:
    """The live checkpoint with ``seq`` in the session (the session's index, no walk)."""
    return store.at_seq(ref_name(worktree_id, session), seq)
