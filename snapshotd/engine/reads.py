"""Reading checkpoints: find one by id across stores, list a worktree's, diff two trees.

The engine resolves the worktree and captures it when a diff names
``worktree``; what is read, and the shape it goes on the wire in, is decided
here. Every function here blocks (pygit2) and runs on a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import pygit2

from snapshotd.errors import Ambiguous, InvalidParams, NotFound, SnapshotdError, Unsupported
from snapshotd.git.repository import open_repository, repository
from snapshotd.paths import to_worktree_relative
from snapshotd.server.params import optional_bool, optional_int, optional_path_list
from snapshotd.store import diff as diff_mod
from snapshotd.store.changes import TreeDiff
from snapshotd.store.checkpoints import Checkpoint, Store, validate_session
from snapshotd.store.identity import Records, WorktreeInfo

WORKTREE = "worktree"  # the side of a diff that means the worktree as it is now
DEFAULT_CONTEXT = 3


class FoundCheckpoint(NamedTuple):
    """A checkpoint and the store that holds it."""

    store: Store
    checkpoint: Checkpoint


def checkpoint_ref(value: object, name: str = "checkpoint") -> str:
    """The checkpoint id given as param ``name``; refused unless a string."""
    if not isinstance(value, str):
        raise InvalidParams(f"The parameter '{name}' must be a checkpoint id (a string).")
    return value


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


def find_checkpoint(ref: str, store_dirs: Iterable[str]) -> FoundCheckpoint:
    """The live checkpoint whose id is ``ref`` or starts with it, in any of ``store_dirs``.

    Each store looks the id up as an object (no history is walked); a
    prefix matching checkpoints in two stores is ambiguous, and a store that
    cannot be opened is passed over.
    """
    found: list[FoundCheckpoint] = []
    errors: list[SnapshotdError] = []
    for store_dir in store_dirs:
        try:
            repo = open_repository(store_dir)
        except (pygit2.GitError, SnapshotdError):
            continue
        store = Store(repo)
        try:
            found.append(FoundCheckpoint(store, store.find(ref)))
        except NotFound:
            continue
        except SnapshotdError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
    distinct = {each.checkpoint.id for each in found}
    if len(distinct) > 1:
        raise Ambiguous(f"The prefix '{ref}' matches {len(distinct)} checkpoints; give more digits.")
    if not found:
        raise NotFound(f"No checkpoint matches '{ref}'.")
    return found[0]


# --- list and show -----------------------------------------------------------


@dataclass(frozen=True)
class ListOptions:
    """What ``list`` returns: one session's checkpoints (every session's when None), at most ``limit``."""

    session: str | None
    limit: int | None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ListOptions:
        return cls(session=validate_session(params.get("session")), limit=optional_int(params, "limit", min=0))


@dataclass(frozen=True)
class CheckpointList:
    """The checkpoints ``list`` found, newest first."""

    checkpoints: list[Checkpoint]

    def to_wire(self) -> dict[str, Any]:
        return {"checkpoints": [checkpoint.to_wire() for checkpoint in self.checkpoints]}


@dataclass(frozen=True)
class ShownCheckpoint:
    """The checkpoint ``show`` found."""

    checkpoint: Checkpoint

    def to_wire(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint.to_wire()}


def list_checkpoints(info: WorktreeInfo, options: ListOptions) -> CheckpointList:
    """The worktree's checkpoints, newest first, as ``options`` select them."""
    with repository(info.store_dir) as repo:
        found = Store(repo).list(info.id, options.session, options.limit, all_sessions=options.session is None)
    return CheckpointList(found)


# --- diff --------------------------------------------------------------------


@dataclass(frozen=True)
class DiffOptions:
    """The two sides of a ``diff`` (checkpoint ids or ``worktree``) and how its listing is cut."""

    source: object
    target: object
    paths: list[str] | None
    patch: bool
    context: int
    offset: int
    max_patch_bytes: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> DiffOptions:
        """Parse the params once; a side that is not a string is refused when it is looked up."""
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
        return cls(
            source=params.get("from"),
            target=WORKTREE if params.get("to") is None else params.get("to"),
            paths=paths,
            patch=patch,
            context=DEFAULT_CONTEXT if context is None else context,
            offset=offset,
            max_patch_bytes=max_patch_bytes,
        )

    @property
    def checkpoint_sides(self) -> list[object]:
        """The sides that name checkpoints, ``from`` first."""
        return [ref for ref in (self.source, self.target) if ref != WORKTREE]

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
    """The listing (and patch page) of a diff, and whether its sides are of different worktrees."""

    listing: TreeDiff
    cross_worktree: bool

    def to_wire(self) -> dict[str, Any]:
        wire = self.listing.to_wire()
        if self.cross_worktree:
            wire["cross_worktree"] = True
        return wire


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
    return DiffResult(listing, cross_worktree=len(worktrees) > 1)
