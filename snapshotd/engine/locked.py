"""A worktree while the engine holds its lock: the one object a restore or revert works through.

:func:`locked` takes the worktree's lock and yields a :class:`Locked`, which
answers :class:`snapshotd.restore.core.LockedWorktree` for the restore stage:
take the worktree's tree, open its store, record the safety checkpoint,
forget a path the apply wrote. Holding one means holding the lock: it is
made only inside the lock and refuses every call once the lock is let go.
The store it opens is the worktree's resident one (:mod:`snapshotd.capture.resident`):
its back-end decided once, its object cache and pack windows kept, and the
safety checkpoint recorded with the sessions' heads the captures keep.

What a finished restore leaves to do (its renames made durable, its backups,
staged content and journal removed) is done after the answer, in a task of
the engine's nursery that takes the lock again: the next operation on the
worktree waits for it, the answer does not. A daemon stopped first leaves it to the next start's
recovery (:func:`snapshotd.restore.journal.recover`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import trio

from snapshotd.capture.state import CaptureResult
from snapshotd.engine.recording import record_one
from snapshotd.engine.registry import WorktreeState
from snapshotd.errors import InternalError
from snapshotd.git.flush import fsync_ref
from snapshotd.git.repository import Repository
from snapshotd.settings import SAFETY_SESSION
from snapshotd.store.checkpoints import Checkpoint
from snapshotd.store.identity import WorktreeInfo
from snapshotd.store.refnames import ref_name
from snapshotd.threads import thread_limiter

__all__ = ["Locked", "locked"]

log = logging.getLogger(__name__)


class Locked:
    """``state``'s worktree under its lock (see the module); ``capture(exact)`` is the engine's capture of it,
    ``nursery`` the engine's (None: what is left to remove is removed at once)."""

    def __init__(
        self,
        state: WorktreeState,
        capture: Callable[[bool], Awaitable[CaptureResult]],
        counters: Counter[str],
        nursery: trio.Nursery | None,
    ) -> None:
        self._state = state
        self._capture = capture
        self._counters = counters
        self._nursery = nursery
        self.held = True

    def _check(self) -> None:
        if not self.held:
            raise InternalError("A worktree's locked view was used after its lock was let go.")

    @property
    def info(self) -> WorktreeInfo:
        """The worktree as last located (it may have moved while the lock was awaited)."""
        return self._state.info

    async def capture(self, exact: bool) -> CaptureResult:
        """The worktree's tree now: warm, or exact when asked."""
        self._check()
        return await self._capture(exact)

    def store(self) -> contextlib.AbstractContextManager[Repository]:
        """The worktree's store for a block: the resident one where libgit2 opens it, else one of git's."""
        self._check()
        return self._state.capture.resident.opened(self.info)

    def record(self, repo: Repository, tree: str, label: str) -> Checkpoint:
        """Record ``tree`` as the safety checkpoint labelled ``label``, in ``repo`` (from :meth:`store`), its ref
        durable before the restore changes anything."""
        self._check()
        checkpoint = record_one(self.info, SAFETY_SESSION, label, tree, repo, resident=self._state.capture.resident)
        fsync_ref(repo.path, ref_name(self.info.id, SAFETY_SESSION))
        return checkpoint

    def forget(self, path: str) -> None:
        """Drop ``path`` from the capture's stat cache: the apply wrote or removed it."""
        self._check()
        self._state.cache.forget(path)

    def recaptured(self) -> None:
        """Count a warm capture replaced by an exact one."""
        self._check()
        self._counters["safety_recaptures"] += 1

    async def later(self, cleanup: Callable[[], None]) -> None:
        """Run the blocking ``cleanup`` on a worker thread once the lock is let go and taken again (see the module)."""
        self._check()
        if self._nursery is None:
            with trio.CancelScope(shield=True):
                await _run_cleanup(cleanup)
            return
        self._nursery.start_soon(_after, self._state.lock, cleanup)


async def _after(lock: trio.Lock, cleanup: Callable[[], None]) -> None:
    async with lock:
        with trio.CancelScope(shield=True):  # once begun, finished: it lets go of the journal's lock last
            await _run_cleanup(cleanup)


async def _run_cleanup(cleanup: Callable[[], None]) -> None:
    try:
        await trio.to_thread.run_sync(cleanup, limiter=thread_limiter)
    except Exception:  # what is left is removed by the next start's recovery; the daemon stays up
        log.exception("A finished restore's backups or journal could not be removed")


@contextlib.asynccontextmanager
async def locked(
    state: WorktreeState,
    capture: Callable[[bool], Awaitable[CaptureResult]],
    counters: Counter[str],
    nursery: trio.Nursery | None,
) -> AsyncIterator[Locked]:
    """Hold ``state``'s lock for the block, and give its locked view."""
    async with state.lock:
        worktree = Locked(state, capture, counters, nursery)
        try:
            yield worktree
        finally:
            worktree.held = False
