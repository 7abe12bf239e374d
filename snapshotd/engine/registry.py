"""The open worktrees: each found by a path inside it or by its id, with its lock and its capture.

The registry opens a worktree on first sight (recovering an interrupted
restore and clearing stale temporary files first), follows it when it moves
(same id, new place: its capture replaces the old place's watcher) and starts
its watch in the daemon's nursery. Repair talks to it through
:class:`~snapshotd.engine.repair.Registry`, the engine's handlers through
:meth:`Registry.resolve`.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from snapshotd.capture.checkpoint import (
    broad_folder,
    refuse_broad_folder,
    refuse_unknown_broad_folder,
)
from snapshotd.capture.mirror import remove_stale_mirrors
from snapshotd.capture.presence import GONE, REMOVED, looked_at_again
from snapshotd.capture.state import StatCache
from snapshotd.capture.worktree import WorktreeCapture
from snapshotd.contract.refs import WorktreeRef
from snapshotd.engine.away import recorded_away, recorded_wire
from snapshotd.engine.batch import Ticket
from snapshotd.engine.reads import checkpoint_summary
from snapshotd.errors import InvalidParams, NotFound, SnapshotdError, WorktreeMismatch
from snapshotd.fsutil import changed_while_opened, remove_stale_temp_files
from snapshotd.git.repository import read_head
from snapshotd.restore.core import recover
from snapshotd.store.identities import Identities
from snapshotd.store.identity import (
    Located,
    Records,
    WorktreeInfo,
    check_still_trusted,
    locate,
)
from snapshotd.threads import thread_limiter

MAX_VANISHED_KEPT = 64  # worktrees found gone or moved that are still shown; older ones are forgotten
UNWATCHED_SHOWN = 20  # folders git ignores whole, left unwatched, a worktree's wire names (the first, sorted)

OnChange = Callable[[str, set[str], bool], None]
"""Called with a worktree's id, the paths its watcher saw change, and whether events were lost."""


@dataclass
class WorktreeState:
    """What the engine keeps for one open worktree: its lock, its capture (which knows where it is)
    and the checkpoint requests waiting for the lock (``batch.py``)."""

    capture: WorktreeCapture
    lock: trio.Lock
    queue: list[Ticket] = field(default_factory=list)

    @classmethod
    def open(cls, info: WorktreeInfo, counters: Counter[str], size_cap: int) -> WorktreeState:
        """A new worktree's state; its captures count into ``counters``."""
        lock = trio.Lock()
        return cls(WorktreeCapture(info, lock=lock, counters=counters, size_cap=size_cap), lock)

    @property
    def info(self) -> WorktreeInfo:
        """The worktree as last located (its capture follows it when it moves)."""
        return self.capture.info

    @property
    def cache(self) -> StatCache:
        """The capture's stat cache, for stages that write files and must make it forget them."""
        return self.capture.cache


def worktree_head(info: WorktreeInfo) -> tuple[str | None, str | None]:
    """HEAD commit and branch of a git worktree (None, None for a plain folder)."""
    if info.git_dir is None:
        return None, None
    return read_head(info.git_dir, info.path, info.common_dir)


class Registry:
    """The worktrees one engine has open, by id; watched in ``nursery`` when it is given and ``watch``."""

    def __init__(
        self,
        records: Records,
        counters: Counter[str],
        size_cap: int,
        *,
        nursery: trio.Nursery | None,
        watch: bool,
        on_change: OnChange,
    ) -> None:
        self.records = records
        self.counters = counters
        self.size_cap = size_cap
        self.nursery = nursery if watch else None
        self.on_change = on_change
        self.worktrees: dict[str, WorktreeState] = {}
        self._opening = threading.Lock()
        self.identities = Identities(records)  # under _opening, as identify was

    def open_path(self, path: str, located: Located | None = None) -> WorktreeState:
        """The state of the worktree holding ``path`` (``located`` already, if given), opened on first sight.

        A known worktree met at a new place (the folder or repository was
        moved) keeps its id and state; :meth:`ensure_watch` then replaces
        the watcher of the old place. A place no longer there by the time it
        is identified (moved on meanwhile) is ``not_found``, and the state
        keeps the newer place another request found: else it went back to a
        folder that is gone, and the captures it shares with those requests failed.
        """
        with self._opening:  # one at a time: two first sights of a folder would both create its store
            try:
                info = self.identities.identify(located if located is not None else locate(path))
            except OSError as exc:  # its .git or the folder went between looking and opening
                raise changed_while_opened(path, exc) from exc
        state = self.worktrees.get(info.id)
        if state is None:
            remove_stale_temp_files(Path(info.state_dir, "tmp"), "index-")
            remove_stale_mirrors(os.path.join(info.state_dir, "tmp"))
            recover(os.path.join(info.state_dir, "journal"), info.path)
            state = WorktreeState.open(info, self.counters, self.size_cap)
            self.worktrees[info.id] = state
            self._forget_vanished()
        elif state.info != info:
            with self._opening:  # the look and the move at once: the request that looked last has the last word
                if not os.path.isdir(info.path):
                    missing = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), info.path)
                    raise changed_while_opened(path, missing) from missing
                state.capture.info = info
            state.capture.resident.in_process(info)  # a moved store: its back-end decided here, off the loop
        return state

    def _open_unless_broad(self, path: str, force: bool, checkpoint: bool = False, first_sight: bool = False) -> WorktreeState:
        """:meth:`open_path`, after refusing a broad folder never recorded (``$HOME``, ``/``...) unless ``force``;
        for a ``checkpoint``, refusing ``$HOME`` and ``/`` first even when recorded (one look at the path for both).
        A folder in no git worktree is the recorded plain folder holding it; only a ``first_sight`` (a checkpoint,
        an open, a subscription, a fetch) makes a new one: a read names no worktree there."""
        located = locate(path)  # its root a path without links
        if located.git_dir is None:
            located = self._plain_holding(located, first_sight)
        if not force:
            if checkpoint:
                refuse_broad_folder(located.root, resolved=True)
            plain = located.git_dir is None
            if broad_folder(located.root, plain=plain) is not None:
                known = any(record.get("path") == located.root for record in self.records.load().values())
                refuse_unknown_broad_folder(located.root, plain=plain, known=known)
        return self.open_path(path, located)

    def _plain_holding(self, located: Located, first_sight: bool) -> Located:
        """The recorded plain folder that holds ``located`` (the nearest), else ``located`` on a first sight.
        A broad one (``$HOME``, checkpointed by force) holds only itself: it does not swallow the folders below."""
        root = located.root
        holders = [path for record in self.records.load().values() if record.get("kind") == "plain"
                   and (root == (path := str(record.get("path", ""))) or root.startswith(path.rstrip("/") + "/"))
                   and (path == root or broad_folder(path, plain=True) is None)]
        if holders:
            return Located(max(holders, key=len), None, None)
        if not first_sight:
            raise NotFound(
                f"{root} is in no worktree: it is not in a git repository, and no checkpoint was taken there; "
                f"run the command in a worktree, or make this folder one with "
                f"'snapshotd checkpoint {root}'.", path=root,
            )
        return located

    def _forget_vanished(self) -> None:
        """Keep only the newest :data:`MAX_VANISHED_KEPT` vanished worktrees (agents delete worktrees all day)."""
        vanished = [key for key, state in self.worktrees.items() if state.capture.vanished is not None]
        for key in vanished[:-MAX_VANISHED_KEPT]:
            self.worktrees.pop(key).capture.close()

    async def shown(self) -> list[WorktreeState]:
        """The open worktrees, less each one gone from a folder that another open worktree now holds.

        A worktree removed and made anew at its path (``git worktree remove``,
        then ``add``) is another worktree there; the old one's ``gone``, whose
        remedy has nothing left to do, is forgotten, as a restart forgets it.
        """
        await self._look_again_at_gone()
        here = {state.info.path for state in self.worktrees.values() if state.capture.vanished is None}
        for key, state in list(self.worktrees.items()):
            vanished = state.capture.vanished
            if vanished is not None and vanished.how in (GONE, REMOVED) and state.info.path in here:
                self.worktrees.pop(key).capture.close()
        return list(self.worktrees.values())

    async def gone(self) -> list[WorktreeState]:
        """The open worktrees found ``gone`` or ``moved`` away, which ``repair NEW_PATH`` finds (or ``forget``
        drops). Those ``removed`` with git are not among them: ``repair`` has nothing to find."""
        await self._look_again_at_gone()
        return [s for s in self.worktrees.values() if s.capture.vanished is not None and s.capture.vanished.how != REMOVED]

    async def away(self) -> list[dict[str, Any]]:
        """The recorded worktrees not open whose folder is not there, from their records (:func:`recorded_away`):
        after a restart nothing open tells of them."""
        return await trio.to_thread.run_sync(recorded_away, self.records, dict(self.worktrees), limiter=thread_limiter)

    async def _look_again_at_gone(self) -> None:
        """Each worktree found ``gone`` that git has since removed is ``removed`` (:func:`looked_at_again`)."""
        for state in list(self.worktrees.values()):
            vanished = state.capture.vanished
            if vanished is not None and vanished.how == GONE:
                again = await trio.to_thread.run_sync(looked_at_again, state.info, vanished, limiter=thread_limiter)
                if state.capture.vanished is vanished:
                    state.capture.vanished = again

    async def forget(self, worktree_id: str | None, path: str | None) -> list[dict[str, str]]:
        """Drop the worktree named by id or recorded path, when it is no longer there: its entry and its record.

        A worktree still at its path is refused (its next checkpoint would
        only open it again); its checkpoints are left where they are (a
        shared store keeps them reachable until ``gc``).
        """
        if (path is None) == (worktree_id is None):
            raise InvalidParams("Give either 'path' (where the worktree was) or 'worktree' (its id), one of the two.")
        known = await trio.to_thread.run_sync(self.records.load, limiter=thread_limiter)
        ids = {key for key in {*self.worktrees, *known} if key == worktree_id}
        ids |= {key for key, state in self.worktrees.items() if path is not None and state.info.path == path}
        ids |= {key for key, record in known.items() if path is not None and record.get("path") == path}
        if not ids:
            named = f"at {path}" if path is not None else f"with the id {worktree_id}"
            raise NotFound(f"No worktree is recorded {named}; 'snapshotd worktrees' lists the open ones.")
        forgotten = []
        for key in sorted(ids):
            state = self.worktrees.get(key)
            where = state.info.path if state is not None else str(known[key].get("path", ""))
            if (state.capture.vanished is None) if state is not None else os.path.isdir(where):
                raise InvalidParams(
                    f"The worktree {key} is still at {where}: only one no longer there can be forgotten "
                    "(if it moved, 'snapshotd repair NEW_PATH' keeps its checkpoints)."
                )
            forgotten.append({"worktree": key, "path": where})
        for item in forgotten:
            state = self.worktrees.pop(item["worktree"], None)
            if state is not None:
                state.capture.close()
            if item["worktree"] in known:
                await trio.to_thread.run_sync(self.records.update, item["worktree"], None, limiter=thread_limiter)
        return forgotten

    async def revisit_vanished(self) -> None:
        """Open again each vanished worktree that is usable where the records now say (after a repair).

        A repair mends git's links of worktrees it never moved (those of a
        repository moved from under them) and re-points the moved one; without
        this, ``status`` kept them ``gone`` or ``moved`` until each was used.
        The worktrees the repair opened are watched too, as a request's are.
        """
        for state in list(self.worktrees.values()):
            if state.capture.vanished is None:
                if state.capture.watcher is None:
                    await self.ensure_watch(state)
                continue
            try:
                again = await trio.to_thread.run_sync(self.open_path, state.info.path, limiter=thread_limiter)
            except SnapshotdError:
                continue  # still gone, or its git folder still is
            if again is state:
                await self.ensure_watch(state)

    async def by_id_in_thread(self, worktree_id: str) -> WorktreeState:
        """:meth:`by_id` on a worker thread."""
        return await trio.to_thread.run_sync(self.by_id, worktree_id, limiter=thread_limiter)

    def by_id(self, worktree_id: str) -> WorktreeState:
        """The open or recorded worktree with this id, where the records say it is."""
        state = self.worktrees.get(worktree_id)
        if state is not None and os.path.isdir(state.info.path):
            check_still_trusted(state.info)
            return state
        record = self.records.load().get(worktree_id)
        if record is None:
            raise NotFound(f"No worktree has the id {worktree_id}.")
        if not os.path.isdir(record["path"]):
            raise NotFound(
                f"The worktree {worktree_id} is no longer at {record['path']}; run 'snapshotd repair' with its new path."
            )
        state = self.open_path(record["path"])
        if state.info.id != worktree_id:
            raise NotFound(f"The folder {record['path']} now holds a different worktree than {worktree_id}.")
        return state

    async def resolve(self, where: WorktreeRef, *, checkpoint: bool = False, first_sight: bool = False) -> WorktreeState:
        """The worktree ``where`` names, watched from now on; a request that names none is refused.

        ``checkpoint``: a path that is ``$HOME`` or ``/`` is refused unless forced (``refuse_broad_folder``).
        ``first_sight``: a folder in no git worktree and no recorded one becomes a worktree (else: not found).
        """
        state = await self.resolve_named(where, checkpoint=checkpoint, first_sight=first_sight)
        if state is None:
            raise InvalidParams("Give either 'path' (a folder inside the worktree) or 'worktree' (its id).")
        return state

    async def resolve_named(
        self, where: WorktreeRef, *, checkpoint: bool = False, first_sight: bool = False
    ) -> WorktreeState | None:
        """As :meth:`resolve`, but None when ``where`` names no worktree (a method where one is optional)."""
        if where.path is not None:
            state = await trio.to_thread.run_sync(
                self._open_unless_broad, where.path, where.force, checkpoint, first_sight, limiter=thread_limiter
            )
            if where.id is not None and where.id != state.info.id:
                raise WorktreeMismatch(f"The path {where.path} belongs to worktree {state.info.id}, not {where.id}.")
            await self.ensure_watch(state)
            return state
        if where.id is not None:
            state = await trio.to_thread.run_sync(self.by_id, where.id, limiter=thread_limiter)
            await self.ensure_watch(state)
            return state
        return None

    async def ensure_watch(self, state: WorktreeState) -> None:
        """Watch the worktree where it is now (again, after it moved), when this engine watches at all."""
        worktree_id = state.info.id
        await state.capture.ensure_watch(
            self.nursery, lambda paths, overflow: self.on_change(worktree_id, paths, overflow)
        )

    async def known_states(self) -> list[WorktreeState]:
        """Every recorded worktree still where the records say, watched from now on (as a request's are)."""
        states = []
        for worktree_id, record in self.records.load().items():
            if os.path.isdir(record.get("path", "")):
                try:
                    states.append(state := await trio.to_thread.run_sync(self.by_id, worktree_id, limiter=thread_limiter))
                except SnapshotdError:
                    continue
                await self.ensure_watch(state)
        return states

    async def listed(self, known: bool = False) -> list[dict[str, Any]]:
        """The open worktrees as the contract shows them; with ``known``, then every recorded one not open."""
        shown = [await self.wire_worktree(state) for state in await self.shown()]
        if not known:
            return shown
        for wire in shown:
            wire["open"] = True
        recorded = await trio.to_thread.run_sync(self.records.load, limiter=thread_limiter)
        return shown + [recorded_wire(key, record, self.worktrees) for key, record in sorted(recorded.items())
                        if key not in self.worktrees]

    async def wire_worktree(self, state: WorktreeState, *, summary: bool = False) -> dict[str, Any]:
        """The worktree as the contract shows it; HEAD is read on a worker thread.

        ``summary`` adds ``checkpoint_count`` and ``last_checkpoint_at`` (for
        ``status``), read from the store's index at the cost of its sessions.
        """
        head, branch = await trio.to_thread.run_sync(worktree_head, state.info, limiter=thread_limiter)
        wire = state.info.to_wire(head, branch, state.capture.watching)
        wire["watch_error"] = state.capture.watch_error
        watcher = state.capture.watcher if state.capture.watching else None
        wire["watched_folders"] = watcher.held() if watcher is not None else None
        wire["unwatched_ignored"] = sorted(watcher.unwatched.folders)[:UNWATCHED_SHOWN] if watcher is not None else []
        wire.update(state.capture.to_wire())
        if summary:
            wire.update(await trio.to_thread.run_sync(checkpoint_summary, state.info, limiter=thread_limiter))
        return wire

    def close(self) -> None:
        """Stop every worktree's watch and forget them all."""
        for state in self.worktrees.values():
            state.capture.close()
        self.worktrees.clear()


def watch_counts(capture: WorktreeCapture) -> Counter[str]:
    """A worktree's watcher's own counts for ``status`` (none without a watcher)."""
    if (watcher := capture.watcher) is None:
        return Counter()
    return Counter({"watcher.events": watcher.events, "watcher.cookie_waits": watcher.cookies.waits,
                    "watcher.rearms": watcher.rearms, "watcher.kernel_checks": watcher.kernel_checks,
                    "watcher.watches": watcher.held(), "watcher.unwatched_ignored": len(watcher.unwatched.folders)})
