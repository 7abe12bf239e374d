"""The engine: every operation of the contract, on real worktrees and stores.

One core, used two ways: the daemon serves it on the socket, and
``snapshotd --embedded`` runs it in the command's own process. Both give the
same results because they share this code and the on-disk state (git refs and
the records file). Blocking work (pygit2, hashing) runs on worker threads
behind a limiter so the trio loop stays responsive.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pygit2
import trio

from snapshotd.capture.checkpoint import CheckpointOptions, CheckpointResult
from snapshotd.capture.state import CaptureResult, StatCache
from snapshotd.capture.worktree import WorktreeCapture
from snapshotd.engine import collect, reads
from snapshotd.engine.repair import repair
from snapshotd.errors import (
    FilesystemError,
    InvalidParams,
    MethodNotFound,
    NeedsForce,
    NotFound,
    SnapshotdError,
    Unsupported,
    WorktreeMismatch,
    filesystem_error,
)
from snapshotd.fsutil import remove_stale_temp_files
from snapshotd.git import spawn
from snapshotd.git.repository import Repository, read_head, repository
from snapshotd.paths import to_worktree_relative
from snapshotd.restore import core as restore_mod
from snapshotd.server.params import (
    optional_bool,
    optional_path,
    optional_path_list,
    optional_str,
)
from snapshotd.settings import SAFETY_SESSION, VERSION, data_home, size_cap as resolve_size_cap
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.identity import Records, WorktreeInfo, identify, locate
from snapshotd.threads import thread_limiter

NOTIFY_DEBOUNCE_S = 0.05
NOTIFY_MAX_PATHS = 1000


@dataclass
class WorktreeState:
    """What the engine keeps for one open worktree: where it is, its lock, its capture and subscriptions."""

    capture: WorktreeCapture
    lock: trio.Lock
    subscriptions: dict[str, Subscription] = field(default_factory=dict)

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


@dataclass
class Subscription:
    """One client's interest in a worktree's changes, sent as debounced notifications."""

    id: str
    worktree: str
    session: Any
    pending: set[str] = field(default_factory=set)
    overflow: bool = False
    wake: trio.Event = field(default_factory=trio.Event)
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)


def _head(info: WorktreeInfo) -> tuple[str | None, str | None]:
    """HEAD commit and branch of a git worktree (None, None for a plain folder)."""
    if info.git_dir is None:
        return None, None
    return read_head(info.git_dir, info.path, info.common_dir)


def refuse_broad_folder(root: str) -> None:
    """Refuse to checkpoint the user's home folder or ``/`` unless forced: it would take every file under it."""
    home = os.path.realpath(os.path.expanduser("~"))
    real = os.path.realpath(root)
    if real in (home, "/"):
        what = "your home folder" if real == home else "the root of the file system"
        raise NeedsForce(
            f"The worktree {real} is {what}, so a checkpoint would copy every file under it; "
            "pass force (snapshotd checkpoint --force) to do it anyway.",
            path=real,
        )


class Engine:
    """Owns the open worktrees and performs every method of the contract."""

    def __init__(
        self,
        home: str | os.PathLike[str] | None = None,
        *,
        size_cap: int | None = None,
        nursery: trio.Nursery | None = None,
        watch: bool = True,
    ) -> None:
        self.home = data_home(home)
        self.nursery = nursery  # with one, worktrees are watched and captures can be warm
        self.watch = watch and nursery is not None
        self.size_cap = resolve_size_cap(size_cap)
        self.records = Records(self.home)
        self.worktrees: dict[str, WorktreeState] = {}
        self.counters: Counter[str] = Counter()
        self.started = time.monotonic()
        self._on_shutdown: Callable[[], None] | None = None
        self._handlers: dict[str, Callable[[dict[str, Any], Any], Awaitable[dict[str, Any]]]] = {
            "ping": self._ping,
            "open": self._open,
            "worktrees": self._worktrees,
            "checkpoint": self._checkpoint,
            "list": self._list,
            "show": self._show,
            "diff": self._diff,
            "restore": self._restore,
            "revert": self._revert,
            "delete": self._delete,
            "gc": self._gc,
            "repair": self._repair,
            "status": self._status,
            "shutdown": self._shutdown,
            "subscribe": self._subscribe,
            "unsubscribe": self._unsubscribe,
            "verify": self._verify,
        }
        self._subscription_ids = iter(range(1, 1 << 62))

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
        return await handler(params, session)

    def on_shutdown(self, callback: Callable[[], None]) -> None:
        self._on_shutdown = callback

    async def aclose(self) -> None:
        for state in self.worktrees.values():
            state.capture.close()
            for subscription in state.subscriptions.values():
                subscription.cancel.cancel()
        self.worktrees.clear()

    # --- worktrees -------------------------------------------------------------

    def open_path(self, path: str) -> WorktreeState:
        """The state of the worktree holding ``path``, opened on first sight.

        A known worktree met at a new place (the folder or repository was
        moved) keeps its id and state; :meth:`_ensure_watch` then replaces
        the watcher of the old place.
        """
        info = identify(locate(path), self.records)
        state = self.worktrees.get(info.id)
        if state is None:
            remove_stale_temp_files(Path(info.state_dir, "tmp"), "index-")
            restore_mod.recover(os.path.join(info.state_dir, "journal"), info.path)
            state = WorktreeState.open(info, self.counters, self.size_cap)
            self.worktrees[info.id] = state
        elif state.info != info:
            state.capture.info = info
        return state

    def _forget_watch(self, state: WorktreeState) -> None:
        """Stop the worktree's watcher and drop the warm tree built from it (it watched another place)."""
        state.capture.forget_watch()

    def _by_id(self, worktree_id: str) -> WorktreeState:
        state = self.worktrees.get(worktree_id)
        if state is not None and os.path.isdir(state.info.path):
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

    async def _resolve(self, params: dict[str, Any], required: bool = True) -> WorktreeState | None:
        path = optional_path(params, "path")
        worktree_id = optional_str(params, "worktree")
        if path is not None:
            state = await trio.to_thread.run_sync(self.open_path, path, limiter=thread_limiter)
            if worktree_id is not None and worktree_id != state.info.id:
                raise WorktreeMismatch(f"The path {path} belongs to worktree {state.info.id}, not {worktree_id}.")
            await self._ensure_watch(state)
            return state
        if worktree_id is not None:
            state = await trio.to_thread.run_sync(self._by_id, worktree_id, limiter=thread_limiter)
            await self._ensure_watch(state)
            return state
        if required:
            raise InvalidParams("Give either 'path' (a folder inside the worktree) or 'worktree' (its id).")
        return None

    async def _wire_worktree(self, state: WorktreeState) -> dict[str, Any]:
        """The worktree as the contract shows it; HEAD is read on a worker thread."""
        head, branch = await trio.to_thread.run_sync(_head, state.info, limiter=thread_limiter)
        wire = state.info.to_wire(head, branch, state.capture.watching)
        wire["watch_error"] = state.capture.watch_error
        return wire

    # --- capture ---------------------------------------------------------------

    async def capture(self, state: WorktreeState, *, exact: bool = False) -> CaptureResult:
        """The worktree's tree now, warm or cold as its capture decides; callers hold ``state.lock``."""
        return await state.capture.take(exact=exact)

    # --- watching ----------------------------------------------------------------

    async def _ensure_watch(self, state: WorktreeState) -> None:
        """Watch the worktree where it is now (again, after it moved), when this engine watches at all."""
        nursery = self.nursery if self.watch else None
        await state.capture.ensure_watch(nursery, lambda paths, overflow: self._changed(state, paths, overflow))

    async def _verify(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        """The warm state against a full scan now; the scan's result becomes the warm state, nothing is recorded."""
        state = await self._resolve(params)
        assert state is not None
        async with state.lock:
            found = await state.capture.verify()
        return found.to_wire()

    def _changed(self, state: WorktreeState, paths: set[str], overflow: bool) -> None:
        """Hand a batch of changed paths to every subscription of the worktree."""
        for subscription in state.subscriptions.values():
            if len(subscription.pending) + len(paths) > NOTIFY_MAX_PATHS:
                subscription.overflow = True
            else:
                subscription.pending |= paths
            subscription.overflow |= overflow
            subscription.wake.set()

    async def _subscribe(self, params: dict[str, Any], session: Any) -> dict[str, Any]:
        if session is None or self.nursery is None:
            raise Unsupported("subscribe needs the daemon: notifications are sent on a connection.")
        state = await self._resolve(params)
        assert state is not None
        subscription = Subscription(id=f"sub_{next(self._subscription_ids)}", worktree=state.info.id, session=session)
        state.subscriptions[subscription.id] = subscription
        session.on_close(subscription.cancel.cancel)
        self.nursery.start_soon(self._notify_loop, state, subscription)
        return {"subscription": subscription.id}

    async def _unsubscribe(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        subscription_id = optional_str(params, "subscription")
        for state in self.worktrees.values():
            subscription = state.subscriptions.get(subscription_id or "")
            if subscription is not None:
                subscription.cancel.cancel()
                return {}
        raise NotFound(f"No subscription {subscription_id} exists.")

    async def _notify_loop(self, state: WorktreeState, subscription: Subscription) -> None:
        """Send the subscription's changes, debounced, until it ends.

        A subscriber too far behind (its connection's notification budget is
        full) is not buffered for: it gets one last ``changed`` with
        ``overflow`` and ``dropped`` true and no paths, and the subscription ends.
        """
        with subscription.cancel:
            try:
                while True:
                    await subscription.wake.wait()
                    await trio.sleep(NOTIFY_DEBOUNCE_S)
                    subscription.wake = trio.Event()
                    paths, overflow = sorted(subscription.pending), subscription.overflow
                    subscription.pending, subscription.overflow = set(), False
                    head = {"subscription": subscription.id, "worktree": state.info.id}
                    sent = await subscription.session.notify(
                        "changed",
                        {**head, "paths": paths, "overflow": overflow},
                        fallback={**head, "paths": [], "overflow": True, "dropped": True},
                    )
                    if not sent:
                        break
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        state.subscriptions.pop(subscription.id, None)

    def _record(self, state: WorktreeState, session: str | None, label: str | None, tree: str) -> Checkpoint:
        base, _ = _head(state.info)
        with repository(state.info.store_dir) as repo:
            return Store(repo).record(worktree_id=state.info.id, session=session, label=label, tree=tree, base=base)

    async def _checkpoint(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        options = CheckpointOptions.from_params(params)
        if options.path is not None and not options.force:  # before opening: a watch of all of $HOME is costly too
            refuse_broad_folder((await trio.to_thread.run_sync(locate, options.path, limiter=thread_limiter)).root)
        state = await self._resolve(params)
        assert state is not None
        if options.path is None and not options.force:
            refuse_broad_folder(state.info.path)
        return (await self._take_checkpoint(state, options)).to_wire()

    async def _take_checkpoint(self, state: WorktreeState, options: CheckpointOptions) -> CheckpointResult:
        """Capture and record under the worktree's lock; a full disk or a denied write gets one sentence."""
        started = time.perf_counter()
        async with state.lock:
            try:
                result = await self.capture(state, exact=options.exact)
                checkpoint = await trio.to_thread.run_sync(
                    self._record, state, options.session, options.label, result.tree, limiter=thread_limiter
                )
            except (OSError, pygit2.GitError) as exc:
                error = filesystem_error(exc, state.info.store_dir, "save the checkpoint in")
                if isinstance(error, FilesystemError):
                    raise error from exc
                raise
        result.stats.ms = (time.perf_counter() - started) * 1000
        return CheckpointResult(checkpoint, result.stats)

    # --- reading checkpoints ---------------------------------------------------

    def _stores(self, preferred: WorktreeState | None) -> list[tuple[str, str]]:
        """(store_dir, worktree id) pairs to search for a checkpoint, preferred first."""
        return reads.stores_to_search(self.records, preferred.info if preferred is not None else None)

    def _find(self, ref: object, preferred: WorktreeState | None, name: str = "checkpoint") -> tuple[Store, Checkpoint]:
        """The live checkpoint ``ref`` (param ``name``) names, searched in the preferred worktree's store first."""
        checkpoint_id = reads.checkpoint_ref(ref, name)
        return reads.find_checkpoint(checkpoint_id, [store_dir for store_dir, _ in self._stores(preferred)])

    async def _list(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        options = reads.ListOptions.from_params(params)
        state = await self._resolve(params)
        assert state is not None
        found = await trio.to_thread.run_sync(reads.list_checkpoints, state.info, options, limiter=thread_limiter)
        return found.to_wire()

    async def _show(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        preferred = await self._resolve(params, required=False)
        _, checkpoint = await trio.to_thread.run_sync(
            self._find, params.get("checkpoint"), preferred, limiter=thread_limiter
        )
        return reads.ShownCheckpoint(checkpoint).to_wire()

    # --- diff --------------------------------------------------------------------

    async def _tree_of(self, ref: object, preferred: WorktreeState | None, name: str) -> reads.DiffSide:
        """One side of a diff: the worktree captured now (under its lock), or a checkpoint's tree."""
        if ref == reads.WORKTREE:
            if preferred is None:
                raise InvalidParams(f"'{name}' is 'worktree' but no worktree was given; add 'path' or a checkpoint.")
            async with preferred.lock:
                result = await self.capture(preferred)
            return reads.DiffSide(result.tree, preferred.info.store_dir, None)
        store, checkpoint = await trio.to_thread.run_sync(self._find, ref, preferred, name, limiter=thread_limiter)
        return reads.DiffSide(checkpoint.tree, store.repo.path, checkpoint)

    async def _diff(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        options = reads.DiffOptions.from_params(params)
        preferred = await self._resolve(params, required=False)
        if preferred is None and options.checkpoint_sides:
            _, checkpoint = await trio.to_thread.run_sync(
                self._find, options.checkpoint_sides[0], None, limiter=thread_limiter
            )
            preferred = await trio.to_thread.run_sync(self._by_id, checkpoint.worktree, limiter=thread_limiter)
        old = await self._tree_of(options.source, preferred, "from")
        new = await self._tree_of(options.target, preferred, "to")
        worktree = preferred.info if preferred is not None else None
        result = await trio.to_thread.run_sync(reads.diff_sides, old, new, options, worktree, limiter=thread_limiter)
        return result.to_wire()

    # --- restore and revert ------------------------------------------------------

    def _safety_hooks(self, state: WorktreeState) -> restore_mod.SafetyHooks:
        """What the restore stage needs from the engine for ``state``'s worktree."""

        def recaptured() -> None:
            self.counters["safety_recaptures"] += 1

        return restore_mod.SafetyHooks(
            capture=lambda exact: self.capture(state, exact=exact),
            record=lambda repo, tree, label: self._record_safety(state, repo, tree, label),
            forget=lambda path: state.cache.forget(path),
            recaptured=recaptured,
        )

    def _record_safety(self, state: WorktreeState, repo: Repository, tree: str, label: str) -> Checkpoint:
        """Record ``tree`` as a safety checkpoint of ``state``'s worktree, on its HEAD."""
        base, _ = _head(state.info)
        return Store(repo).record(worktree_id=state.info.id, session=SAFETY_SESSION, label=label, tree=tree, base=base)

    async def _restore(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        paths = optional_path_list(params, "paths")
        dry_run = optional_bool(params, "dry_run")
        allow_other = optional_bool(params, "allow_other_worktree")
        target = await self._resolve(params, required=False)
        store, checkpoint = await trio.to_thread.run_sync(
            self._find, params.get("checkpoint"), target, limiter=thread_limiter
        )
        if target is None:
            target = await trio.to_thread.run_sync(self._by_id, checkpoint.worktree, limiter=thread_limiter)
        if target.info.id != checkpoint.worktree and not allow_other:
            raise WorktreeMismatch(
                f"Checkpoint {checkpoint.id[:12]} belongs to worktree {checkpoint.worktree}, not {target.info.id}; "
                "pass allow_other_worktree to restore it here."
            )
        if os.path.realpath(store.repo.path) != os.path.realpath(target.info.store_dir):
            raise Unsupported("The checkpoint is stored in another repository than the target worktree's.")
        rel_paths = [to_worktree_relative(target.info.path, p) for p in paths] if paths is not None else None
        options = restore_mod.RestoreOptions(checkpoint, rel_paths, dry_run)
        async with target.lock:
            outcome = await restore_mod.run_restore(target.info, options, self._safety_hooks(target))
        return outcome.to_wire()

    async def _revert(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        paths = optional_path_list(params, "paths")
        dry_run = optional_bool(params, "dry_run")
        force = optional_bool(params, "force")
        if "from" not in params:
            raise InvalidParams("The parameter 'from' is required (a checkpoint id).")
        preferred = await self._resolve(params, required=False)
        store, source = await trio.to_thread.run_sync(self._find, params.get("from"), preferred, "from", limiter=thread_limiter)
        if params.get("to") is not None:
            _, target_cp = await trio.to_thread.run_sync(self._find, params.get("to"), preferred, "to", limiter=thread_limiter)
        else:
            target_cp = await trio.to_thread.run_sync(lambda: store.head(source.worktree, source.session))
            assert target_cp is not None
        if target_cp.worktree != source.worktree:
            raise WorktreeMismatch("'from' and 'to' belong to different worktrees.")
        state = preferred or await trio.to_thread.run_sync(self._by_id, source.worktree, limiter=thread_limiter)
        if state.info.id != source.worktree:
            raise WorktreeMismatch(f"Checkpoint {source.id[:12]} belongs to worktree {source.worktree}, not {state.info.id}.")
        rel_paths = [to_worktree_relative(state.info.path, p) for p in paths] if paths is not None else None
        options = restore_mod.RevertOptions(source, target_cp, rel_paths, dry_run, force)
        async with state.lock:
            outcome = await restore_mod.run_revert(state.info, options, self._safety_hooks(state))
        return outcome.to_wire()

    # --- delete and gc -----------------------------------------------------------

    async def _delete(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        options = collect.DeleteOptions.from_params(params)
        preferred = await self._resolve(params, required=options.checkpoints is None)
        if options.checkpoints is None:
            assert preferred is not None
            async with preferred.lock:
                deleted = await trio.to_thread.run_sync(
                    collect.drop_session, preferred.info, options.session, limiter=thread_limiter
                )
            return deleted.to_wire()
        refs = options.checkpoints

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
        state = await self._resolve(params, required=False)
        if (state is None) == (not options.every):
            raise InvalidParams(
                "Give 'path' or 'worktree' for the worktree to collect, or 'all': true for every known worktree."
                if state is None
                else "Give either 'all' or a worktree ('path' or 'worktree'), not both."
            )
        states = [state] if state is not None else await self._known_states()
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

    async def _known_states(self) -> list[WorktreeState]:
        """Every recorded worktree that is still where the records say."""
        states = []
        for worktree_id, record in self.records.load().items():
            if os.path.isdir(record.get("path", "")):
                try:
                    states.append(await trio.to_thread.run_sync(self._by_id, worktree_id, limiter=thread_limiter))
                except SnapshotdError:
                    continue
        return states

    async def _prune_own_store(self, state: WorktreeState) -> int:
        """Collect a plain folder's app-owned repository; bytes freed.

        The warm tree and the stat cache name objects of that store, which the
        prune may remove: both are dropped, so the next capture hashes afresh.
        """
        state.capture.forget_objects()
        freed = await collect.prune_store(state.info.store_dir)
        self.counters["processes"] += 1
        return freed

    # --- repair ------------------------------------------------------------------

    async def _repair(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        path = optional_path(params, "path")
        return (await repair(self, path)).to_wire()

    # --- daemon-level ------------------------------------------------------------

    async def _ping(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        return {"version": VERSION, "pid": os.getpid(), "uptime_s": round(time.monotonic() - self.started, 3)}

    async def _open(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        state = await self._resolve(params)
        assert state is not None
        return {"worktree": await self._wire_worktree(state)}

    async def _worktrees(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        return {"worktrees": [await self._wire_worktree(state) for state in self.worktrees.values()]}

    async def _status(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        counters = dict(self.counters)
        counters["processes_started"] = spawn.spawned_total()
        counters.setdefault("watch_miss", 0)
        for state in self.worktrees.values():
            for name, count in state.capture.watch_counters().items():
                counters[name] = counters.get(name, 0) + count
        return {
            "worktrees": [await self._wire_worktree(state) for state in self.worktrees.values()],
            "counters": counters,
            "spawn": {"native": spawn.NATIVE, "error": spawn.NATIVE_ERROR},
            "version": VERSION,
            "pid": os.getpid(),
            "size_cap": self.size_cap,
            "home": str(self.home),
        }

    async def _shutdown(self, params: dict[str, Any], _session: Any) -> dict[str, Any]:
        if self._on_shutdown is not None:
            self._on_shutdown()
        return {}
