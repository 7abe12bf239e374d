"""A worktree while the engine holds its lock: the one object a restore or revert works through.

:func:`locked` takes the worktree's lock and yields a :class:`Locked`, which
answers :class:`snapshotd.restore.core.LockedWorktree` for the restore stage:
take the worktree's tree, open its store, record the safety checkpoint,
forget a path the apply wrote. Holding one means holding the lock: it is
made only inside the lock and refuses every call once the lock is let go.
The store it opens is the worktree's resident one (:mod:`snapshotd.capture.resident`):
its back-end decided once, its object cache and pack windows kept, and the
safety checkpoint recorded with the sessions' heads the captures keep.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from snapshotd.capture.state import CaptureResult
from snapshotd.engine.recording import record_one
from snapshotd.engine.registry import WorktreeState
from snapshotd.errors import InternalError
from snapshotd.git.repository import Repository, repository
from snapshotd.settings import SAFETY_SESSION
from snapshotd.store.checkpoints import Checkpoint
from snapshotd.store.identity import WorktreeInfo

__all__ = ["Locked", "locked"]


class Locked:
    """``state``'s worktree under its lock (see the module); ``capture(exact)`` is the engine's capture of it."""

    def __init__(
        self, state: WorktreeState, capture: Callable[[bool], Awaitable[CaptureResult]], counters: Counter[str]
    ) -> None:
        self._state = state
        self._capture = capture
        self._counters = counters
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

    @contextlib.contextmanager
    def store(self) -> Iterator[Repository]:
        """The worktree's store: the resident one where libgit2 opens it, else one of git's for this block."""
        self._check()
        kept = self._state.capture.resident.store(self.info)
        if kept is not None:
            yield kept
            return
        with repository(self.info.store_dir) as repo:
            yield repo

    def record(self, repo: Repository, tree: str, label: str) -> Checkpoint:
        """Record ``tree`` as the safety checkpoint labelled ``label``, in ``repo`` (from :meth:`store`)."""
        self._check()
        return record_one(self.info, SAFETY_SESSION, label, tree, repo, resident=self._state.capture.resident)

    def forget(self, path: str) -> None:
        """Drop ``path`` from the capture's stat cache: the apply wrote or removed it."""
        self._state.cache.forget(path)

    def recaptured(self) -> None:
        """Count a warm capture replaced by an exact one."""
        self._counters["safety_recaptures"] += 1


@contextlib.asynccontextmanager
async def locked(
    state: WorktreeState, capture: Callable[[bool], Awaitable[CaptureResult]], counters: Counter[str]
) -> AsyncIterator[Locked]:
    """Hold ``state``'s lock for the block, and give its locked view."""
    async with state.lock:
        worktree = Locked(state, capture, counters)
        try:
            yield worktree
        finally:
            worktree.held = False
