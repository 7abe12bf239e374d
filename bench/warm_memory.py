"""What the warm state holds per tracked file, by part: libgit2's indexes, Python's objects, the rest.

Usage: ``python -m bench.warm_memory [--files 50000] [--arenas]``

In one process, on a clone of the synthetic tree, after ``malloc_trim`` so
freed memory is not counted: the resident set one ``pygit2.Index`` of the
user's index adds (the warm state keeps one: the last capture's; the
user's as read is what changed of it, capture/userindex.py), then the engine in-process with a watcher after a cold and
a warm checkpoint, and once more with ``tracemalloc`` counting what Python
allocated meanwhile (its records are resident too, so not in the first
figure), with malloc's arenas set as the daemon sets them
(:func:`snapshotd.threads.one_malloc_arena`; ``--arenas`` leaves glibc's
default). Each figure is divided by the tracked files.
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
from snapshotd.threads import one_malloc_arena

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


async def engine_growth(path: str, home: str, trace: bool) -> tuple[int, int]:
    """Resident growth and (with ``trace``) Python's own allocations, in bytes, of a warm engine on ``path``."""
    async with trio.open_nursery() as nursery:
        if trace:
            tracemalloc.start()
        before = rss()
        engine = Engine(home=home, nursery=nursery)
        for _ in range(2):
            await engine.call("checkpoint", {"path": path, "session": "bench-memory"})
            await trio.sleep(1.0)
        grown = rss() - before
        python = 0
        if trace:
            python = sum(stat.size for stat in tracemalloc.take_snapshot().statistics("filename"))
            tracemalloc.stop()
        await engine.aclose()
        nursery.cancel_scope.cancel()
    return grown, python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=50000)
    parser.add_argument("--arenas", action="store_true", help="glibc's default arenas, not the daemon's one")
    args = parser.parse_args()
    if not args.arenas:
        one_malloc_arena()
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
    # tracemalloc's own records are resident too: the growth is measured in a run without it.
    grown, _ = trio.run(engine_growth, str(clone), str(base / "home"), False)
    _, python = trio.run(engine_growth, str(clone), str(base / "home-traced"), True)
    print(f"{files} tracked files, bytes per file ({'glibc default' if args.arenas else 'one'} malloc arena):")
    print(f"  one pygit2.Index of the user's index   {one_index / files:6.0f}")
    print(f"  warm engine, resident growth           {grown / files:6.0f}")
    print(f"    of which Python objects (tracemalloc) {python / files:6.0f}")
    print(f"    the rest (libgit2, pack windows, C)   {(grown - python) / files:6.0f}")


if __name__ == "__main__":
    main()
