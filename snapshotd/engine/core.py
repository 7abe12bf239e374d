"""The engine: every operation of the contract, on real worktrees and stores.

One core, used two ways: the daemon serves it on the socket, and ``snapshotd --embedded``
runs it in the command's own process. Both give the same results because they share this
code and the on-disk state (git refs and the records file). Blocking work (pygit2,
hashing) runs on worker threads behind a limiter so the trio loop stays responsive.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from snapshotd import facilities
from snapshotd.capture.checkpoint import CheckpointOptions, CheckpointResult, refuse_broad_folder
from snapshotd.capture.presence import GONE, naming_the_path_asked
from snapshotd.capture.state import CaptureResult, Then
from snapshotd.contract.params import optional_bool, optional_path, optional_path_list, optional_str
from snapshotd.contract.refs import CheckpointRef, ref_param, worktree_param
from snapshotd.engine import collect, leftovers, reads, transfer
from snapshotd.engine.batch import take_checkpoint
from snapshotd.engine.belonging import refuse_restore_elsewhere, refuse_revert_elsewhere
from snapshotd.engine.disk import disk_refusals
from snapshotd.engine.locked import Locked, locked
from snapshotd.engine.packing import BackgroundPacking
from snapshotd.engine.recording import record_many
from snapshotd.engine.registry import Registry, WorktreeState, watch_counts
from snapshotd.engine.repair import repair
from snapshotd.engine.subscriptions import Subscriptions, require_connection
from snapshotd.errors import InvalidParams, MethodNotFound, WorktreeMismatch
from snapshotd.facilities import log_location
from snapshotd.git import loose, spawn
from snapshotd.paths import to_worktree_relative
from snapshotd.restore import core as restore_mod
from snapshotd.settings import VERSION, data_home, size_cap as resolve_size_cap
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.identity import Records
from snapshotd.threads import thread_limiter


class Engine:
    """Owns the open worktrees and performs every method of the contract."""

    def __init__(
        self, home: str | os.PathLike[str] | None = None, *, size_cap: int | None = None,
        nursery: trio.Nursery | None = None, watch: bool = True,
    ) -> None:
        self.home = data_home(home)
        self.nursery = nursery  # with one, worktrees are watched and captures can be warm
        self.watch = watch and nursery is not None and facilities.available("inotify")
        loose.fsync_each_write()  # without syncfs, each object is made durable as it is written
        self.size_cap = resolve_size_cap(size_cap)
        self.records = Records(self.home)
        self.counters: Counter[str] = Counter()
        self.subscriptions = Subscriptions()
        self.registry = Registry(self.records, self.counters, self.size_cap, nursery=nursery, watch=self.watch,
                                 on_change=self.subscriptions.changed)
        self.worktrees = self.registry.worktrees
        self.started = time.monotonic()
        self.transfers = transfer.Transfers(self.registry, self.subscriptions, nursery)
        self.leftovers = leftovers.Leftovers()
        self.packing = BackgroundPacking(self.registry, self.subscriptions, nursery)
        self._on_shutdown: Callable[[], None] | None = None
        self._handlers: dict[str, Callable[[dict[str, Any], Any], Awaitable[dict[str, Any]]]] = {
            "ping": self._ping,
            "open": self._open,
            "worktrees": self._worktrees,
            "checkpoint": self._checkpoint,
            "list": self._list,
            "show": self._show,
            "resolve": self._show,  # the same lookup; its own name for clients that only resolve
            "diff": self._diff,
            "restore": self._restore,
            "revert": self._revert,
            "delete": self._delete,
            "gc": self._gc,
            "repair": self._repair,
            "forget": self._forget,
            "status": self._status,
            "shutdown": self._shutdown,
            "subscribe": self._subscribe,
            "unsubscribe": self._unsubscribe,
            "verify": self._verify,
            "push": self.transfers.push,
            "fetch": self.transfers.fetch,
        }

    # --- the service face ------------------------------------------------------

    async def call(self, method: str, params: dict[str, Any] | None = None, session: Any = None) -> dict[str, Any]:
        """Run one method of the contract with its params (as they come off the wire)."""
        handler = self._handlers.get(method)
        if handler is None:
            raise MethodNotFound(f"There is no method '{method}'.")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise InvalidParams("The params must be a JSON object.")
        self.counters[f"calls.{method}"] += 1
        with naming_the_path_asked(params.get("path")):
            return await handler(params, session)

    def add_method(self, name: str, handler: Callable[[dict[str, Any], Any], Awaitable[dict[str, Any]]]) -> None:
        self._handlers[name] = handler  # the daemon's ``hook``, which runs agent hooks (snapshotd.agents.hookserve)

    def on_shutdown(self, callback: Callable[[], None]) -> None:
        self._on_shutdown = callback

    async def aclose(self) -> None:
        self.subscriptions.close()
        self.registry.close()

    # --- worktrees and their captures ---------------------------------------------

    async def capture(self, state: WorktreeState, *, exact: bool = False, then: Then | None = None) -> CaptureResult:
        """The worktree's tree now, warm or cold; callers hold ``state.lock``. A disk's refusal is one sentence."""
        await self.leftovers.recover(state.info)  # a restore another process left unfinished: not to be captured
        with disk_refusals(state.info.store_dir, "capture the worktree into"):
            return await state.capture.take(exact=exact, then=then)

    # --- watching ----------------------------------------------------------------

    async def _verify(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        """The warm state against a full scan now; the scan's result becomes the warm state, nothing is recorded."""
        state = await self.registry.resolve(worktree_param(params))
        async with state.lock:
            with disk_refusals(state.info.store_dir, "capture the worktree into"):
                found = await state.capture.verify()
        return found.to_wire()

    async def _subscribe(self, params: dict[str, Any], session: Any) -> dict[str, Any]:
        nursery = require_connection(session, self.nursery)
        checkpoints = optional_bool(params, "checkpoints")
        state = await self.registry.resolve(worktree_param(params), first_sight=True)
        return {"subscription": self.subscriptions.subscribe(state.info.id, session, nursery, checkpoints=checkpoints).id}

    async def _unsubscribe(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        self.subscriptions.unsubscribe(optional_str(params, "subscription"))
        return {}

    # --- checkpoint ----------------------------------------------------------------

    async def _checkpoint(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        started, options = time.perf_counter(), CheckpointOptions.from_params(params)
        named_by_path = options.where.path is not None
        # $HOME or / refused before opening (a watch of all of $HOME is costly too), in the same look at the path
        state = await self.registry.resolve(options.where, checkpoint=named_by_path and not options.force, first_sight=True)
        if not named_by_path and not options.force:
            refuse_broad_folder(state.info.path)
        await state.capture.wait_for_watch()  # a watch starting: where a scan is dear, its one scan waits for it
        return (await self._take_checkpoint(state, options, started)).to_wire()

    async def _take_checkpoint(
        self, state: WorktreeState, options: CheckpointOptions, started: float
    ) -> CheckpointResult:
        """Capture and record under the worktree's lock, sharing the capture with the requests queued for it
        (``batch.py``); a full disk or a denied write gets one sentence. The record is made where the worktree
        is then: a request that found it before it moved may capture and record for one that found it after."""
        result = await take_checkpoint(
            state.lock, state.queue, options, lambda exact, then: self.capture(state, exact=exact, then=then),
            lambda tickets, tree: record_many(state.info, tickets, tree, resident=state.capture.resident),
            functools.partial(trio.to_thread.run_sync, limiter=thread_limiter),
            state.capture.raise_clear_error,  # deleted between the capture and the record
            started,
        )
        self.subscriptions.recorded(state.info.id, result.checkpoint.to_wire())
        return result

    # --- reading checkpoints ---------------------------------------------------

    def _stores(self, preferred: WorktreeState | None) -> list[tuple[str, str]]:
        """(store_dir, worktree id) pairs to search for a checkpoint, preferred first."""
        return reads.stores_to_search(self.records, preferred.info if preferred is not None else None)

    def _find(self, ref: CheckpointRef, preferred: WorktreeState | None) -> tuple[Store, Checkpoint]:
        """The live checkpoint ``ref`` names: ``@`` and ``#N`` in the preferred worktree, an id in its store first."""
        worktree = preferred.info if preferred is not None else None
        return reads.find_checkpoint(ref, [store_dir for store_dir, _ in self._stores(preferred)], worktree)

    async def _list(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        options = reads.ListOptions.from_params(params)
        state = await self.registry.resolve(worktree_param(params))
        return await trio.to_thread.run_sync(
            lambda: reads.list_checkpoints(state.info, options).to_wire(), limiter=thread_limiter
        )

    async def _show(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        ref = ref_param(params)
        preferred = await self.registry.resolve_named(worktree_param(params))
        store, checkpoint = await trio.to_thread.run_sync(self._find, ref, preferred, limiter=thread_limiter)
        return {"checkpoint": await trio.to_thread.run_sync(transfer.remote_wire, store, checkpoint)}

    # --- diff --------------------------------------------------------------------

    async def _tree_of(self, ref: CheckpointRef | str, preferred: WorktreeState | None, name: str,
                       captured: str | None = None) -> reads.DiffSide:
        """A diff's side: the worktree captured now (under its lock) or by an earlier page, or a checkpoint's tree."""
        if isinstance(ref, str):
            if preferred is None:
                raise InvalidParams(f"'{name}' is 'worktree' but no worktree was given; add 'path' or a checkpoint.")
            if captured is not None:
                store_dir = preferred.info.store_dir
                tree = await trio.to_thread.run_sync(reads.captured_tree, store_dir, captured, limiter=thread_limiter)
                return reads.DiffSide(tree, store_dir, None)
            async with preferred.lock:
                result = await self.capture(preferred)
            return reads.DiffSide(result.tree, preferred.info.store_dir, None)
        store, checkpoint = await trio.to_thread.run_sync(self._find, ref, preferred, limiter=thread_limiter)
        return reads.DiffSide(checkpoint.tree, store.repo.path, checkpoint)

    async def _diff(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        options = reads.DiffOptions.from_params(params)
        preferred = await self.registry.resolve_named(worktree_param(params))
        if preferred is None and options.checkpoint_sides:
            store, checkpoint = await trio.to_thread.run_sync(self._find, options.checkpoint_sides[0], None, limiter=thread_limiter)
            preferred = await trio.to_thread.run_sync(self.transfers.owner, store, checkpoint, limiter=thread_limiter)
        old = await self._tree_of(options.source, preferred, "from", options.worktree_tree)
        new = await self._tree_of(options.target, preferred, "to", options.worktree_tree)
        worktree = preferred.info if preferred is not None else None
        return await trio.to_thread.run_sync(  # the wire shape of 20,000 files too: off the loop
            lambda: reads.diff_sides(old, new, options, worktree).to_wire(), limiter=thread_limiter
        )

    # --- restore and revert ------------------------------------------------------

    def _locked(self, state: WorktreeState) -> AbstractAsyncContextManager[Locked]:
        """``state``'s lock held for a block, and its locked view for the restore stage."""
        return locked(state, lambda exact: self.capture(state, exact=exact), self.counters, self.nursery)

    async def _restore(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        paths = optional_path_list(params, "paths")
        dry_run = optional_bool(params, "dry_run")
        allow_other = optional_bool(params, "allow_other_worktree")
        ref = ref_param(params)
        target = await self.registry.resolve_named(worktree_param(params))
        store, checkpoint = await trio.to_thread.run_sync(self._find, ref, target, limiter=thread_limiter)
        await trio.to_thread.run_sync(transfer.refuse_remote_restore, store, checkpoint, target.info.id if target else None, allow_other)
        if target is None:
            target = await self.registry.by_id_in_thread(checkpoint.worktree)
        await trio.to_thread.run_sync(
            refuse_restore_elsewhere, self.registry.records, store, checkpoint, target.info, allow_other,
            limiter=thread_limiter,
        )
        rel_paths = [to_worktree_relative(target.info.path, p) for p in paths] if paths is not None else None
        options = restore_mod.RestoreOptions(checkpoint, rel_paths, dry_run)
        async with self._locked(target) as worktree:
            outcome = await restore_mod.run_restore(worktree, options)
        return self.subscriptions.with_safety_told(target.info.id, outcome.to_wire())

    async def _revert(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        paths = optional_path_list(params, "paths")
        dry_run = optional_bool(params, "dry_run")
        force = optional_bool(params, "force")
        source_ref = ref_param(params, "from")
        target_ref = ref_param(params, "to") if params.get("to") is not None else None
        preferred = await self.registry.resolve_named(worktree_param(params))
        store, source = await trio.to_thread.run_sync(self._find, source_ref, preferred, limiter=thread_limiter)
        if target_ref is not None:
            _, target_cp = await trio.to_thread.run_sync(self._find, target_ref, preferred, limiter=thread_limiter)
        else:
            newest = await trio.to_thread.run_sync(store.head, source.worktree, source.session)
            assert newest is not None
            target_cp = newest
        if target_cp.worktree != source.worktree:
            raise WorktreeMismatch("'from' and 'to' belong to different worktrees.")
        state = preferred or await self.registry.by_id_in_thread(source.worktree)
        await trio.to_thread.run_sync(
            refuse_revert_elsewhere, self.registry.records, source, state.info, limiter=thread_limiter
        )
        rel_paths = [to_worktree_relative(state.info.path, p) for p in paths] if paths is not None else None
        options = restore_mod.RevertOptions(source, target_cp, rel_paths, dry_run, force)
        async with self._locked(state) as worktree:
            outcome = await restore_mod.run_revert(worktree, options)
        return self.subscriptions.with_safety_told(state.info.id, outcome.to_wire())

    # --- delete and gc -----------------------------------------------------------

    async def _delete(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        options = collect.DeleteOptions.from_params(params)
        where = worktree_param(params)
        if options.checkpoints is None:
            state = await self.registry.resolve(where)
            async with state.lock:
                deleted = await trio.to_thread.run_sync(
                    collect.drop_session, state.info, options.session, limiter=thread_limiter
                )
            return deleted.to_wire()
        refs = options.checkpoints
        preferred = await self.registry.resolve_named(where)

        def drop_ids() -> collect.Deleted:
            return collect.drop_checkpoints([self._find(ref, preferred) for ref in refs])

        return (await trio.to_thread.run_sync(drop_ids, limiter=thread_limiter)).to_wire()

    async def _gc(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        """Drop old checkpoints of one worktree (or, with ``all``, of every known one).

        Safety checkpoints (the ones "undo" hints point to) are kept unless
        ``include_safety``; ``dry_run`` reports per worktree and session what
        would go and changes nothing.
        """
        options = collect.GcOptions.from_params(params)
        state = await self.registry.resolve_named(worktree_param(params))
        if (state is None) == (not options.every):
            raise InvalidParams(
                "Give 'path' or 'worktree' for the worktree to collect, or 'all': true for every known worktree."
                if state is None
                else "Give either 'all' or a worktree ('path' or 'worktree'), not both."
            )
        states = [state] if state is not None else await self.registry.known_states()
        total = freed = 0
        would_delete: list[collect.SessionCollection] = []
        for each in states:
            async with each.lock:
                sessions = await trio.to_thread.run_sync(
                    collect.collect_worktree, each.info, options, limiter=thread_limiter
                )
                if options.dry_run:
                    would_delete += sessions
                    continue
                deleted = sum(len(item.checkpoints) for item in sessions)
                total += deleted
                if deleted and each.info.kind == "plain":
                    freed += await self._prune_own_store(each)
        return collect.GcResult(total, freed, would_delete if options.dry_run else None).to_wire()

    async def _prune_own_store(self, state: WorktreeState) -> int:
        """Collect a plain folder's app-owned repository; bytes freed.

        The warm tree and the stat cache name objects the prune may remove: both
        are dropped, so the next capture hashes afresh.
        """
        state.capture.forget_objects()
        freed = await collect.prune_store(state.info.store_dir)
        self.counters["processes"] += 1
        return freed

    # --- repair ------------------------------------------------------------------

    async def _repair(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        path = optional_path(params, "path")
        result = await repair(self.registry, path)
        await self.registry.revisit_vanished()
        gone = [{"worktree": state.info.id, "path": state.info.path} for state in await self.registry.gone()]
        gone += [{"worktree": wire["id"], "path": wire["path"]} for wire in await self.registry.away() if wire["presence"] == GONE]
        return {**result.to_wire(), "gone": gone}

    async def _forget(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        forgotten = await self.registry.forget(optional_str(params, "worktree"), optional_path(params, "path"))
        return {"forgotten": forgotten}

    # --- daemon-level ------------------------------------------------------------

    async def _ping(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        uptime_s = round(time.monotonic() - self.started, 3)
        return {"version": VERSION, "pid": os.getpid(), "pgid": os.getpgrp(), "uptime_s": uptime_s}

    async def _open(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        state = await self.registry.resolve(worktree_param(params), first_sight=True)
        return {"worktree": await self.registry.wire_worktree(state)}

    async def _worktrees(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        return {"worktrees": await self.registry.listed(optional_bool(params, "known"))}

    async def _status(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        counters = dict(self.counters)
        counters["processes_started"] = spawn.spawned_total()
        counters.setdefault("watch_miss", 0)
        states = await self.registry.shown()  # a copy: other requests open worktrees while this one awaits
        for state in states:
            for name, count in watch_counts(state.capture).items():
                counters[name] = counters.get(name, 0) + count
        away = await self.registry.away()
        return {
            "worktrees": [await self.registry.wire_worktree(state, summary=True) for state in states] + away,
            "counters": counters,
            "spawn": {"native": spawn.NATIVE, "error": spawn.NATIVE_ERROR},
            "version": VERSION,
            "pid": os.getpid(),
            "log": log_location(),
            "size_cap": self.size_cap,
            "home": str(self.home),
            "background_push": self.transfers.background.status(),
            "packing": self.packing.stats.to_wire(),
            **facilities.report(),
        }

    async def _shutdown(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        if self._on_shutdown is not None:
            self._on_shutdown()
        return {}
