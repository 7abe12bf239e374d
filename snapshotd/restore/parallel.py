"""A few threads for a restore's syncs, which wait on the disk, not the CPU.

Syncing many files one by one (where ``syncfs`` is missing: :mod:`.barrier`)
or the folders a restore changed waits for the disk each time; threads share
those waits. Anything that does not wait (creating, renaming or removing a
file) runs on the caller's thread, where it costs less than handing it over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

WORKERS = 8
PARALLEL_FROM = 32

T = TypeVar("T")


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
