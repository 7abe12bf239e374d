"""Reading checkpoints: find one by id across stores, list a worktree's, diff two trees.

The engine resolves the worktree and captures it when a diff names
``worktree``; what is read, and the shape it goes on the wire in, is decided
here. Every function here blocks (pygit2) and runs on a worker thread.
"""

from __future__ import annotations

import heapq
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import pygit2

from snapshotd.contract.params import (
    optional_bool,
    optional_int,
    optional_path_list,
    validate_session,
)
from snapshotd.contract.refs import (
    CheckpointRef,
    IdPrefix,
    RemoteHead,
    SessionHead,
    SessionSeq,
    parse_ref,
    session_choice,
)
from snapshotd.errors import Ambiguous, InvalidParams, NotFound, SnapshotdError, Unsupported
from snapshotd.git.repository import open_repository, repository
from snapshotd.paths import to_worktree_relative
from snapshotd.settings import SAFETY_SESSION
from snapshotd.store import diff as diff_mod, lookup
from snapshotd.store.changes import TreeDiff
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.identity import Records, WorktreeInfo
from snapshotd.store.refnames import session_key
from snapshotd.store.remotes import back_from_remote_head, iter_remote, remote_key

WORKTREE = "worktree"  # the side of a diff that means the worktree as it is now
_TREE_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # sha1 or sha256, as the stores write them
DEFAULT_CONTEXT = 3


class FoundCheckpoint(NamedTuple):
    """A checkpoint and the store that holds it."""

    store: Store
    checkpoint: Checkpoint


def stores_to_search(records: Records, preferred: WorktreeInfo | None) -> list[tuple[str, str]]:
    """(store_dir, worktree id) pairs to search for a checkpoint, the preferred worktree's first.

    Every store any recorded worktree uses is searched once, since a
    checkpoint id names no store.
    """
    seen: dict[str, str] = {}
    if preferred is not None:
        seen[preferred.store_dir] = preferred.id
    for worktree_id, record in records.load().items():
        store_dir = record.get("store_dir")
        if store_dir and os.path.isdir(store_dir):
            seen.setdefault(store_dir, worktree_id)
    return list(seen.items())


def find_checkpoint(ref: CheckpointRef, store_dirs: Iterable[str], worktree: WorktreeInfo | None = None) -> FoundCheckpoint:
    """The live checkpoint ``ref`` names: the one place a reference is resolved.

    An id or prefix is looked up as an object in each of ``store_dirs`` (no
    history is walked) and matches checkpoints only; one matching
    checkpoints in two places is ambiguous, and a store that cannot be
    opened is passed over. ``@``, ``@~N`` and ``#N`` count in ``worktree``'s
    sessions, reading only the pins between a session's newest and the one
    named.
    """
    if isinstance(ref, IdPrefix):
        return _by_prefix(ref, store_dirs)
    if worktree is None:
        raise InvalidParams(
            f"{ref.text!r} counts in a worktree's sessions; give 'path' or 'worktree' "
            "(on the command line, run it inside the worktree)."
        )
    store = Store(open_repository(worktree.store_dir))
    if isinstance(ref, RemoteHead):
        found = back_from_remote_head(store, remote_key(ref.remote), ref.session.name, ref.session.named, ref.back)
        return FoundCheckpoint(store, found)
    if isinstance(ref, SessionHead):
        session = ref.session.name if ref.session.named else _newest_session(store, worktree)
        return FoundCheckpoint(store, lookup.back_from_head(store, worktree.id, session, ref.back, worktree.path))
    return FoundCheckpoint(store, _by_seq(store, worktree, ref))


def _by_prefix(ref: IdPrefix, store_dirs: Iterable[str]) -> FoundCheckpoint:
    found: dict[str, FoundCheckpoint] = {}
    errors: list[SnapshotdError] = []
    for store_dir in store_dirs:
        try:
            repo = open_repository(store_dir)
        except (pygit2.GitError, SnapshotdError):
            continue
        store = Store(repo)
        try:
            for checkpoint in lookup.by_prefix(store, ref.hex):
                found.setdefault(checkpoint.id, FoundCheckpoint(store, checkpoint))
        except SnapshotdError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
    if len(found) > 1:
        raise _ambiguous(
            f"The prefix {ref.text!r} matches {len(found)} checkpoints",
            [each.checkpoint for each in found.values()],
            "give more digits",
        )
    if not found:
        raise NotFound(f"No checkpoint matches {ref.text!r}; `snapshotd list` shows the checkpoints here.")
    return next(iter(found.values()))


def _newest_session(store: Store, worktree: WorktreeInfo) -> str | None:
    """The session of the worktree's newest checkpoint, safety checkpoints aside."""
    for head in lookup.session_heads(store, worktree.id):
        if head.session != SAFETY_SESSION:
            return head.session
    raise NotFound(f"There is no checkpoint in the worktree {worktree.path} yet (safety checkpoints aside).")


def _by_seq(store: Store, worktree: WorktreeInfo, ref: SessionSeq) -> Checkpoint:
    """``#N`` in the named session, or in whichever of the worktree's sessions has that seq (one only).

    Without a session named, safety checkpoints are not counted, as ``@``
    does not count them: after a first restore, whose safety checkpoint is
    ``#1`` of its own session, ``#1`` still means the first checkpoint taken.
    """
    if ref.session.named:
        sessions = [ref.session.name]
    else:
        sessions = [head.session for head in lookup.session_heads(store, worktree.id) if head.session != SAFETY_SESSION]
    found = [cp for cp in (lookup.by_seq(store, worktree.id, session, ref.seq) for session in sessions) if cp]
    if len(found) > 1:
        raise _ambiguous(f"{ref.text!r} is in {len(found)} sessions", found, "name the session (--session S)")
    if not found:
        where = f" in session {ref.session.name!r}" if ref.session.named else ""
        raise NotFound(f"No checkpoint has seq {ref.seq}{where} in the worktree {worktree.path}; `snapshotd list` shows the seqs.")
    return found[0]


def _candidate(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "id": checkpoint.id,
        "session": checkpoint.session,
        "seq": checkpoint.seq,
        "label": checkpoint.label,
        "created_at": checkpoint.created_at,
        "worktree": checkpoint.worktree,
    }


def _ambiguous(what: str, matches: list[Checkpoint], remedy: str) -> Ambiguous:
    """``ambiguous``, listing every candidate (id, session, seq, label) in ``data.candidates``, as git rev-parse does."""
    ordered = sorted(matches, key=lambda cp: (cp.created_at, cp.seq), reverse=True)
    shown = "; ".join(
        f"{cp.id[:12]} #{cp.seq} of {'session ' + repr(cp.session) if cp.session is not None else 'the default session'}"
        + (f" ({' '.join(cp.label.split())[:40]!r})" if cp.label else "")
        for cp in ordered[:5]
    )
    more = f" and {len(ordered) - 5} more" if len(ordered) > 5 else ""
    return Ambiguous(
        f"{what}: {shown}{more}; {remedy}.", candidates=[_candidate(cp) for cp in ordered]
    )


# --- list and show -----------------------------------------------------------


@dataclass(frozen=True)
class ListOptions:
    """What ``list`` returns: one session's checkpoints (every session's when None), at most ``limit``."""

    session: str | None
    limit: int | None
    remote: str | bool | None = None  # also those fetched: from the remote with this key, or from all (True)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ListOptions:
        session, limit = validate_session(params.get("session")), optional_int(params, "limit", min=0)
        return cls(session, limit, remote_choice(params.get("remote")))


@dataclass(frozen=True)
class CheckpointList:
    """The checkpoints ``list`` found, newest first, and the remote each was fetched from (if any)."""

    checkpoints: list[Checkpoint]
    remotes: list[str | None] | None = None

    def to_wire(self) -> dict[str, Any]:
        remotes = self.remotes or [None] * len(self.checkpoints)
        return {
            "checkpoints": [
                checkpoint.to_wire() | ({"remote": remote} if remote is not None else {})
                for checkpoint, remote in zip(self.checkpoints, remotes, strict=True)
            ]
        }


def remote_choice(value: object) -> str | bool | None:
    """The ``remote`` param of ``list``: absent (None), a remote's name or URL (its key), or ``true`` for all."""
    if value is None or value is False:
        return None
    if value is True:
        return True
    if not isinstance(value, str) or not value:
        raise InvalidParams("'remote' must be a remote's name, a URL, or true for every remote.")
    return remote_key(value)


def list_checkpoints(info: WorktreeInfo, options: ListOptions) -> CheckpointList:
    """The worktree's checkpoints, newest first, as ``options`` select them, with the fetched ones asked for."""
    with repository(info.store_dir) as repo:
        store = Store(repo)
        found = store.list(info.id, options.session, options.limit, all_sessions=options.session is None)
        if options.remote is None:
            return CheckpointList(found)
        local = {cp.id for cp in found}  # a machine's own checkpoints fetched back are listed once
        pairs = [(None, cp) for cp in found] + [pair for pair in _fetched(store, options) if pair[1].id not in local]
    count = len(pairs) if options.limit is None else options.limit
    ordered = heapq.nlargest(count, pairs, key=lambda pair: (pair[1].created_at, pair[1].seq))
    return CheckpointList([cp for _, cp in ordered], [remote for remote, _ in ordered])


def _fetched(store: Store, options: ListOptions) -> list[tuple[str | None, Checkpoint]]:
    """(remote, checkpoint) fetched from one remote (or all), each ref's newest ``limit``, of ``session`` if given."""
    key = None if options.remote is True else str(options.remote)
    wanted = None if options.session is None else session_key(options.session)
    return [
        (remote, cp) for remote, cp in iter_remote(store, key, options.limit)
        if wanted is None or session_key(cp.session) == wanted
    ]


def checkpoint_summary(info: WorktreeInfo) -> dict[str, Any]:
    """``checkpoint_count`` and ``last_checkpoint_at`` of a worktree for ``status``, from the store's index.

    Both are None when the store cannot be read now (a worktree gone, say):
    ``status`` reports, it does not fail.
    """
    try:
        with repository(info.store_dir) as repo:
            count, newest = Store(repo).summary(info.id)
    except (pygit2.GitError, OSError, SnapshotdError):
        return {"checkpoint_count": None, "last_checkpoint_at": None}
    return {"checkpoint_count": count, "last_checkpoint_at": newest}


# --- diff --------------------------------------------------------------------


@dataclass(frozen=True)
class DiffOptions:
    """The two sides of a ``diff`` (checkpoint ids or ``worktree``) and how its listing is cut."""

    source: CheckpointRef | str
    target: CheckpointRef | str
    paths: list[str] | None
    patch: bool
    context: int
    offset: int
    max_patch_bytes: int
    worktree_tree: str | None = None  # the worktree's tree an earlier page captured: later pages read it, not the disk

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> DiffOptions:
        """Parse the params once: each side is the word ``worktree`` or a checkpoint reference."""
        if "from" not in params:
            raise InvalidParams("The parameter 'from' is required (a checkpoint id or 'worktree').")
        paths = optional_path_list(params, "paths")
        patch = optional_bool(params, "patch")
        context = optional_int(params, "context", min=0, max=diff_mod.MAX_CONTEXT)
        offset = optional_int(params, "offset", 0, min=0)
        max_patch_bytes = optional_int(
            params, "max_patch_bytes", diff_mod.DEFAULT_MAX_PATCH_BYTES, min=1, max=diff_mod.MAX_PATCH_BYTES
        )
        assert offset is not None and max_patch_bytes is not None
        session = session_choice(params)
        worktree_tree = params.get("worktree_tree")
        if worktree_tree is not None and not (isinstance(worktree_tree, str) and _TREE_ID.fullmatch(worktree_tree)):
            raise InvalidParams("'worktree_tree' must be the tree id an earlier page of this diff gave, or left out.")

        def side(name: str, value: object) -> CheckpointRef | str:
            return WORKTREE if value == WORKTREE else parse_ref(value, name, session)

        return cls(
            source=side("from", params.get("from")),
            target=side("to", WORKTREE if params.get("to") is None else params.get("to")),
            paths=paths,
            patch=patch,
            context=DEFAULT_CONTEXT if context is None else context,
            offset=offset,
            max_patch_bytes=max_patch_bytes,
            worktree_tree=worktree_tree,
        )

    @property
    def checkpoint_sides(self) -> list[CheckpointRef]:
        """The sides that name checkpoints, ``from`` first."""
        return [ref for ref in (self.source, self.target) if not isinstance(ref, str)]

    @property
    def names_worktree(self) -> bool:
        return WORKTREE in (self.source, self.target)


@dataclass(frozen=True)
class DiffSide:
    """One side of a diff: its tree, the store holding it, and its checkpoint (None for the worktree)."""

    tree: str
    store_dir: str
    checkpoint: Checkpoint | None


@dataclass(frozen=True)
class DiffResult:
    """The listing (and patch page) of a diff, whether its sides are of different worktrees, and the worktree's
    tree it captured (None when neither side is the worktree), which later pages ask for as ``worktree_tree``."""

    listing: TreeDiff
    cross_worktree: bool
    worktree_tree: str | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = self.listing.to_wire()
        if self.cross_worktree:
            wire["cross_worktree"] = True
        if self.worktree_tree is not None:
            wire["worktree_tree"] = self.worktree_tree
        return wire


def captured_tree(store_dir: str, tree: str) -> str:
    """``tree``, the worktree's tree an earlier page of a diff captured, checked to be a tree in ``store_dir``."""
    with repository(store_dir) as repo:
        try:
            found = repo.get(tree)
        except (ValueError, TypeError):
            found = None
        if found is None or getattr(found, "type_str", None) != "tree":
            raise NotFound(
                f"The worktree's tree {tree} that an earlier page of this diff captured is not in its store; "
                "ask for the diff again from its first page.",
                oid=tree,
            )
    return tree


def diff_sides(old: DiffSide, new: DiffSide, options: DiffOptions, worktree: WorktreeInfo | None) -> DiffResult:
    """Compare two trees of one store; paths are taken relative to ``worktree`` when one is known."""
    if os.path.realpath(old.store_dir) != os.path.realpath(new.store_dir):
        raise Unsupported("The two sides of this diff are stored in different repositories; diff them with git.")
    paths = options.paths
    if paths and worktree is not None:
        paths = [to_worktree_relative(worktree.path, path) for path in paths]
    with repository(old.store_dir) as repo:
        listing = diff_mod.diff_trees(
            repo,
            old.tree,
            new.tree,
            paths=paths,
            patch=options.patch,
            context=options.context,
            offset=options.offset,
            max_patch_bytes=options.max_patch_bytes,
        )
    worktrees = {side.checkpoint.worktree for side in (old, new) if side.checkpoint is not None}
    if worktree is not None and options.names_worktree:
        worktrees.add(worktree.id)
    captured = next((side.tree for side in (old, new) if side.checkpoint is None), None)
    return DiffResult(listing, cross_worktree=len(worktrees) > 1, worktree_tree=captured)
