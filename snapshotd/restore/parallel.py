"""A few threads for a big restore's file system calls, which wait on the disk, not the CPU.

Creating a file's temporary copy and removing a backup each may wait for the
disk's journal (and syncing each copy did, before a big restore synced them
all at once: :mod:`.barrier`); on ext4 one thread doing 4,500 of them in turn
waits for each, where eight threads share the waits. So a restore of many files runs those calls on
:data:`WORKERS` threads, at most :data:`WINDOW_BYTES` of content in flight,
and a small one (fewer than :data:`PARALLEL_FROM` files) runs them in turn,
as it always did. Only calls on descriptors and names already checked are
handed over: every decision (what to write, whether a path still holds what
was recorded, the rename) stays on the caller's thread, in the plan's order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

WORKERS = 8
PARALLEL_FROM = 32
WINDOW_BYTES = 64 * 1024 * 1024

T = TypeVar("T")


class Ahead:
    """Runs jobs ahead of the caller, in submission order, a bounded number of bytes at a time.

    :meth:`submit` starts a job (on a thread, or at once when serial), and
    :meth:`wait` returns the result of the oldest, re-raising its error.
    :meth:`drain` waits for every job still running, ignoring their errors, so
    that nothing is still writing when the caller cleans up.
    """

    def __init__(self, count: int) -> None:
        self._pool = ThreadPoolExecutor(WORKERS, "snapshotd-restore") if count >= PARALLEL_FROM else None
        self._pending: deque[tuple[Future[object], int]] = deque()
        self._bytes = 0

    @property
    def serial(self) -> bool:
        """Whether jobs run on the caller's thread (a small restore)."""
        return self._pool is None

    def room(self) -> bool:
        """Whether another job may start now: nothing in flight, or less than the window."""
        return not self._pending or (self._pool is not None and self._bytes < WINDOW_BYTES)

    def submit(self, job: Callable[[], object], size: int) -> None:
        """Start ``job``, which holds ``size`` bytes until it ends."""
        future: Future[object]
        if self._pool is None:
            future = Future()
            try:
                future.set_result(job())
            except Exception as exc:  # re-raised by wait, in order
                future.set_exception(exc)
        else:
            future = self._pool.submit(job)
        self._pending.append((future, size))
        self._bytes += size

    def wait(self) -> object:
        """The oldest job's result (its error raised)."""
        future, size = self._pending.popleft()
        self._bytes -= size
        return future.result()

    def drain(self) -> None:
        """Wait for every job still pending, whatever it returns or raises."""
        while self._pending:
            future, size = self._pending.popleft()
            self._bytes -= size
            future.exception()

    def close(self) -> None:
        """Wait for everything and stop the threads."""
        self.drain()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def run_each(call: Callable[[T], object], items: Iterable[T]) -> None:
    """Call ``call`` on every item, on :data:`WORKERS` threads when there are many; the first error is raised."""
    items = list(items)
    if len(items) < PARALLEL_FROM:
        for item in items:
            call(item)
        return
    with ThreadPoolExecutor(WORKERS, "snapshotd-restore") as pool:
        for _ in pool.map(call, items):
            pass
