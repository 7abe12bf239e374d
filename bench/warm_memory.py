"""What the warm state holds per tracked file, by part: libgit2's indexes, Python's objects, the rest.

Usage: ``python -m bench.warm_memory [--files 50000]``

In one process, on a clone of the synthetic tree, after ``malloc_trim`` so
freed memory is not counted: the resident set one ``pygit2.Index`` of the
user's index adds (the warm state keeps two: the last capture's and the
user's as read), then the engine in-process with a watcher after a cold and
a warm checkpoint, with ``tracemalloc`` counting what Python allocated
meanwhile. Each figure is divided by the tracked files.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import shutil
import tracemalloc

import pygit2
import trio

from snapshotd import Engine

from .common import WORK, git
from .trees import synthetic

_LIBC = ctypes.CDLL("libc.so.6")


def rss() -> int:
    """This process's resident set in bytes, after a collection and ``malloc_trim``."""
    gc.collect()
    _LIBC.malloc_trim(0)
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def engine_growth(path: str, home: str) -> tuple[int, int]:
    """Resident growth and Python's own allocations (bytes) of a warm engine on ``path``."""
    async with trio.open_nursery() as nursery:
        tracemalloc.start()
        before = rss()
        engine = Engine(home=home, nursery=nursery)
        for _ in range(2):
            await engine.call("checkpoint", {"path": path, "session": "bench-memory"})
            await trio.sleep(1.0)
        grown = rss() - before
        python = sum(stat.size for stat in tracemalloc.take_snapshot().statistics("filename"))
        tracemalloc.stop()
        await engine.aclose()
        nursery.cancel_scope.cancel()
    return grown, python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=50000)
    args = parser.parse_args()
    tree = synthetic(args.files)
    base = WORK / "warm-memory"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    clone = base / "wt"
    git(base, "clone", "-q", tree.path, str(clone))
    files = tree.files
    before = rss()
    index = pygit2.Index(os.path.join(clone, ".git", "index"))
    one_index = rss() - before
    del index
    grown, python = trio.run(engine_growth, str(clone), str(base / "home"))
    print(f"{files} tracked files, bytes per file:")
    print(f"  one pygit2.Index of the user's index   {one_index / files:6.0f}")
    print(f"  warm engine, resident growth           {grown / files:6.0f}")
    print(f"    of which Python objects (tracemalloc) {python / files:6.0f}")
    print(f"    the rest (libgit2, pack windows, C)   {(grown - python) / files:6.0f}")


if __name__ == "__main__":
    main()
