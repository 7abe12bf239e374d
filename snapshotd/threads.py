"""The one limiter for worker threads: blocking work (pygit2, hashing, file I/O) runs behind it.

Every stage hands its blocking calls to ``trio.to_thread.run_sync(...,
limiter=thread_limiter)``, so the trio loop stays responsive and the threads
stay within the machine's cores (at least two).

The limiter takes turns between clients. The server names the client of
each request's task (:data:`current_caller`); a thread call waiting for a
thread queues under its client, and a freed thread goes to the next client
in turn. So one client's pipeline of a hundred heavy requests holds one
place in the line, not a hundred, and another client's checkpoint waits
behind a few of them. A client may also hold its calls back before they
join the line (:meth:`Requester.ready`: not while its replies lie unread).
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import itertools
import os
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol, cast

import trio


class Requester(Protocol):
    """Whoever a request's thread calls are queued under (a connection)."""

    def ready(self) -> bool:
        """Whether this client's work may use a thread now."""
        ...

    async def wait_ready(self) -> None:
        """Return once :meth:`ready` may be true again."""
        ...


@dataclass(frozen=True)
class Caller:
    """The client of a request and the request's place in that client's pipeline (older ones go first)."""

    client: Requester
    order: int


current_caller: ContextVar[Caller | None] = ContextVar("snapshotd_caller", default=None)
"""The caller of the running task; None for the daemon's own work (watchers, reconciliation)."""


class FairLimiter:
    """A ``CapacityLimiter`` for ``trio.to_thread.run_sync`` that serves the clients waiting in turn.

    It offers the two methods trio's threads ask of a limiter. Within one
    client the oldest request goes first, so a pipeline's replies come one by
    one rather than all at the end (and the client's unread replies can make
    it wait).
    """

    def __init__(self, total_tokens: int) -> None:
        self.total_tokens = total_tokens
        self.borrowed_tokens = 0
        self._queues: dict[Requester | None, list[tuple[int, int, trio.Event]]] = {}  # heaps, in turn order
        self._count = itertools.count()

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        """Wait for a thread, in the client's turn, while the client is ready; a cancelled wait leaves nothing taken.

        A client that stopped being ready while it waited gives the thread on
        when its turn comes, and queues again once it is ready.
        """
        caller = current_caller.get()
        client = caller.client if caller is not None else None
        while True:
            while client is not None and not client.ready():
                await client.wait_ready()
            await self._acquire(client, caller.order if caller is not None else 0, borrower)
            if client is None or client.ready():
                return
            self.release_on_behalf_of(borrower)

    async def _acquire(self, client: Requester | None, order: int, borrower: object) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.borrowed_tokens < self.total_tokens and not self._queues:
            self.borrowed_tokens += 1
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        entry = (order, next(self._count), trio.Event())
        heapq.heappush(self._queues.setdefault(client, []), entry)
        try:
            await entry[2].wait()
        except BaseException:
            if entry[2].is_set():  # handed a thread as the wait was cancelled: it goes to the next in turn
                self.release_on_behalf_of(borrower)
            else:
                queue = self._queues[client]
                queue.remove(entry)
                heapq.heapify(queue)
                if not queue:
                    del self._queues[client]
            raise

    def release_on_behalf_of(self, borrower: object) -> None:
        """Give a thread back; the next client in turn gets it."""
        self.borrowed_tokens -= 1
        while self._queues and self.borrowed_tokens < self.total_tokens:
            client = next(iter(self._queues))
            queue = self._queues.pop(client)
            _, _, granted = heapq.heappop(queue)
            if queue:
                self._queues[client] = queue  # to the back of the turn order
            self.borrowed_tokens += 1
            granted.set()


# Typed as what trio.to_thread.run_sync takes: it asks a limiter for the two methods FairLimiter has.
thread_limiter = cast(trio.CapacityLimiter, FairLimiter(max(2, len(os.sched_getaffinity(0)))))

_M_ARENA_MAX = -8  # glibc's mallopt parameter


def one_malloc_arena() -> bool:
    """Have glibc's malloc keep one arena for every thread of the daemon; False where there is no glibc.

    By default each worker thread that allocates gets an arena of its own,
    and what a capture frees there (an index read, a listing) stays resident
    after ``malloc_trim``: 50,000 tracked files kept 140 bytes a file more
    than the warm state holds (``python -m bench.warm_memory``). The daemon's
    Python runs one thread at a time, so the threads gain little from arenas
    of their own. Called before the first worker thread starts.
    """
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False

full_scans = trio.CapacityLimiter(max(1, thread_limiter.total_tokens - 1))
"""Full scans running at once: one fewer than the threads, so a warm capture always finds one free.

A full scan of a 100,000-file worktree holds a thread for most of a second;
at the start of a fleet, or for worktrees the user's inotify watches cannot
cover, many wait for one, and those worktrees take turns here.
"""


def full_scan_turn(dear: bool = True) -> contextlib.AbstractAsyncContextManager[object]:
    """A full scan's turn behind :data:`full_scans`, or the one its task holds already (the idle
    reconciliation takes its turn before the worktree's lock, and its own capture may scan in full);
    none for a scan that is not ``dear`` (a few thousand files: over before a dear one's turn would come)."""
    if not dear or trio.lowlevel.current_task() in full_scans.statistics().borrowers:
        return contextlib.nullcontext()
    return full_scans
