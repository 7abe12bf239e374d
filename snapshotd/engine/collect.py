"""Dropping checkpoints: ``delete`` by id or session, and ``gc``'s choice of what goes.

The engine resolves the worktrees and holds their locks; this module decides
which checkpoints go, re-pins the sessions without them, and prunes a plain
folder's own store. Apart from :func:`prune_store`, every function blocks and
runs on a worker thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from snapshotd.contract.params import (
    optional_bool,
    optional_int,
    optional_str_list,
    validate_session,
)
from snapshotd.contract.refs import CheckpointRef, parse_ref, session_choice
from snapshotd.errors import InvalidParams, NotFound
from snapshotd.git.process import GitTarget, run_git
from snapshotd.git.repository import repository
from snapshotd.settings import SAFETY_SESSION
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.identity import WorktreeInfo
from snapshotd.store.refnames import ref_name
from snapshotd.threads import thread_limiter

DEFAULT_KEEP = 50  # what gc keeps of each session when given neither keep nor older_than_s


@dataclass(frozen=True)
class Deleted:
    """How many checkpoints a ``delete`` dropped."""

    count: int

    def to_wire(self) -> dict[str, Any]:
        return {"deleted": self.count}


# --- delete ------------------------------------------------------------------


@dataclass(frozen=True)
class DeleteOptions:
    """What ``delete`` drops: the checkpoints named by id, or else every one of ``session``."""

    checkpoints: list[CheckpointRef] | None
    session: str | None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> DeleteOptions:
        """With ``checkpoints``, ``session`` only says which session ``@`` and ``#N`` count in."""
        texts = optional_str_list(params, "checkpoints")
        if texts is None and "session" not in params:
            raise InvalidParams("Give 'checkpoints' (a list of references) or 'session' with 'path' or 'worktree'.")
        if texts is None:
            return cls(checkpoints=None, session=validate_session(params.get("session")))
        choice = session_choice(params)
        return cls(checkpoints=[parse_ref(text, "checkpoints", choice) for text in texts], session=None)


def drop_session(info: WorktreeInfo, session: str | None) -> Deleted:
    """Drop every checkpoint of one session of the worktree; a session it does not have is not found."""
    with repository(info.store_dir) as repo:
        store = Store(repo)
        name = ref_name(info.id, session)
        if not store.newest_ids(name, 1):
            which = f"session {session!r}" if session is not None else "default session"
            raise NotFound(
                f"The worktree at {info.path} has no checkpoint in the {which}; `snapshotd list` shows its sessions."
            )
        count = store.rewrite(name, keep=[])
    return Deleted(count)


def drop_checkpoints(found: Sequence[tuple[Store, Checkpoint]]) -> Deleted:
    """Drop the given checkpoints, re-pinning each session they are in once."""
    groups: dict[tuple[str, str], tuple[Store, set[str]]] = {}
    for store, checkpoint in found:
        key = (store.repo.path, ref_name(checkpoint.worktree, checkpoint.session))
        groups.setdefault(key, (store, set()))[1].add(checkpoint.id)
    return Deleted(sum(store.rewrite(name, drop=ids) for (_, name), (store, ids) in groups.items()))


# --- gc ------------------------------------------------------------------------


@dataclass(frozen=True)
class GcOptions:
    """What ``gc`` keeps of each session, and of which worktrees (one, or ``every`` known one)."""

    keep: int | None
    cutoff: str | None  # checkpoints created at or after this UTC time stay
    every: bool
    dry_run: bool
    include_safety: bool

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> GcOptions:
        keep = optional_int(params, "keep", min=0)
        older_than = optional_int(params, "older_than_s", min=0)
        every = optional_bool(params, "all")
        dry_run = optional_bool(params, "dry_run")
        include_safety = optional_bool(params, "include_safety")
        if keep is None and older_than is None:
            keep = DEFAULT_KEEP
        cutoff = None
        if older_than is not None:
            cutoff = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - older_than))
        return cls(keep=keep, cutoff=cutoff, every=every, dry_run=dry_run, include_safety=include_safety)

    @property
    def skipped_session(self) -> str | None:
        """The session left whole: the safety checkpoints, unless ``include_safety``."""
        return None if self.include_safety else SAFETY_SESSION

    def keeps(self, index: int, checkpoint: Checkpoint) -> bool:
        """Whether the checkpoint at ``index`` (0 is the newest) of its session stays."""
        return (self.keep is not None and index < self.keep) or (
            self.cutoff is not None and checkpoint.created_at[:19] >= self.cutoff
        )


@dataclass(frozen=True)
class SessionCollection:
    """The checkpoints gc drops (or, dry, would drop) from one session of one worktree."""

    worktree: str
    path: str
    session: str | None
    checkpoints: list[str]

    def to_wire(self) -> dict[str, Any]:
        return {"worktree": self.worktree, "path": self.path, "session": self.session, "checkpoints": self.checkpoints}


@dataclass(frozen=True)
class GcResult:
    """What a ``gc`` dropped and freed; with ``dry_run``, what it would drop instead."""

    deleted: int
    freed_bytes: int
    would_delete: list[SessionCollection] | None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"deleted": self.deleted, "freed_bytes": self.freed_bytes}
        if self.would_delete is not None:
            wire["would_delete"] = [item.to_wire() for item in self.would_delete]
        return wire


def collect_sessions(store: Store, info: WorktreeInfo, options: GcOptions) -> list[SessionCollection]:
    """Per session of one worktree, the checkpoints gc drops (dropped unless ``dry_run``).

    A checkpoint stays when it is among the newest ``keep`` of its session or
    newer than the cutoff; the skipped session is left whole.
    """
    out = []
    for name in store.session_refs(info.id):
        if options.skipped_session is not None and name == ref_name(info.id, options.skipped_session):
            continue
        going = _going(store, name, options)
        if not going:
            continue
        if not options.dry_run:
            store.rewrite(name, drop=set(going))
        out.append(SessionCollection(info.id, info.path, store.load(going[0]).session, going))
    return out


def _going(store: Store, name: str, options: GcOptions) -> list[str]:
    """The ids gc drops from one session, newest first.

    With ``keep`` alone, the ones past the newest ``keep`` are taken from the
    session's index without reading a checkpoint; with a cutoff, each one
    past ``keep`` is read for its time.
    """
    keep = options.keep or 0
    if options.cutoff is None:
        return store.past_newest(name, keep)
    ids = store.newest_ids(name)
    return [cp for index, cp in enumerate(ids) if index >= keep and not options.keeps(index, store.load(cp))]


def collect_worktree(info: WorktreeInfo, options: GcOptions) -> list[SessionCollection]:
    """:func:`collect_sessions` on the worktree's own store."""
    with repository(info.store_dir) as repo:
        return collect_sessions(Store(repo), info, options)


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under ``folder``; files that vanish meanwhile count nothing."""
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


async def prune_store(store_dir: str) -> int:
    """Run ``git gc --prune=now`` on an app-owned store; the bytes its objects shrank by.

    Only for a plain folder's own repository: a git worktree's is left to the
    user's ``git gc``, where the dropped checkpoints are unreachable.
    """
    objects = Path(store_dir, "objects")
    before = await trio.to_thread.run_sync(folder_bytes, objects, limiter=thread_limiter)
    await run_git(GitTarget(git_dir=store_dir, work_tree=None), ["gc", "--prune=now", "--quiet"])
    return max(0, before - await trio.to_thread.run_sync(folder_bytes, objects, limiter=thread_limiter))
