"""What the watcher's lost-watch check costs a warm capture.

Usage: ``python -m bench.watch_check [--files 5000] [--captures 200]``

On a synthetic tree (``bench.trees.synthetic``) with a watching engine, it
takes clean warm captures and prints their processes (must be 0), their
median time, and the median time of the check alone (reading the kernel's
count of the watcher's watches from ``/proc/self/fdinfo``), which a capture
pays only after a burst of events and before a full scan, with the number of
watches.
"""

from __future__ import annotations

import argparse
import statistics
import time

import trio

from snapshotd.engine.core import Engine

from .trees import synthetic


async def measure(path: str, captures: int) -> dict[str, float]:
    """Clean warm captures of ``path``: processes, capture and check times (ms), watches."""
    async with trio.open_nursery() as nursery:
        engine = Engine(nursery=nursery)
        await engine.call("checkpoint", {"path": path})
        state = next(iter(engine.worktrees.values()))
        watcher = state.capture.watcher
        processes, capture_ms, check_ms = 0, [], []
        for _ in range(captures):
            started = time.perf_counter()
            async with state.lock:
                result = await engine.capture(state)
            capture_ms.append((time.perf_counter() - started) * 1000)
            assert result.stats.scan == "watch", result.stats
            processes += result.stats.processes
            started = time.perf_counter()
            watcher.check(always=True)
            check_ms.append((time.perf_counter() - started) * 1000)
        watches = watcher._inotify.kernel_watch_count()
        await engine.aclose()
        nursery.cancel_scope.cancel()
    return {
        "processes": processes,
        "capture_ms": statistics.median(capture_ms),
        "check_ms": statistics.median(check_ms),
        "watches": watches,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--captures", type=int, default=200)
    args = parser.parse_args()
    tree = synthetic(args.files)
    figures = trio.run(measure, tree.path, args.captures)
    print(
        f"{args.files} files, {figures['watches']} watches: {args.captures} clean warm captures, "
        f"{figures['processes']} processes in all; median capture {figures['capture_ms']:.3f} ms "
        f"(sync included; no check: no event came), lost-watch check {figures['check_ms']:.3f} ms "
        "(run after a burst and before a full scan)"
    )


if __name__ == "__main__":
    main()
