"""Daemon CPU per warm checkpoint, and where it goes: cProfile of the engine in-process.

Usage: ``python -m bench.warm_profile FILES [--captures 200] [--clean] [--capture-only] [--threads]
[--no-profile] [--git-status] [--sort tottime|cumulative] [--top 30] [--dump FILE]``

On a clone of the synthetic tree of FILES files, the engine with a watcher
takes three checkpoints (one cold, then warm), then ``--captures`` more, each
after one tracked file is appended to (or none with ``--clean``). CPU per
checkpoint is this process's from ``/proc/self/stat`` (every thread, user and
system). cProfile sees one thread, so the worker-thread calls run on the
loop's thread meanwhile unless ``--threads`` (then only the loop's part is
profiled); ``--no-profile`` measures CPU without cProfile's cost. ``--capture-only`` takes the
worktree's tree alone (what ``checkpoint`` does under the worktree's lock before its record: the
watcher's sync, the look at the rule files, the changed paths applied), not the checkpoint. Run two
checkouts one after the other, alternating, for a before/after ratio.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from snapshotd import Engine
from snapshotd.threads import one_malloc_arena

from .common import WORK, git, settle_deletions
from .trees import synthetic


def cpu_split() -> tuple[float, float]:
    """This process's CPU time (every thread) from ``/proc``: user and system seconds."""
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds() -> float:
    """This process's CPU time (user and system, every thread) from ``/proc``."""
    return sum(cpu_split())


STATUS_RUNS = 5


def git_status_ms(clone: Path) -> float:
    """The median wall time of ``git status --porcelain`` on ``clone`` (its index refreshed by a first run)."""
    git(clone, "status", "--porcelain")
    times = []
    for _ in range(STATUS_RUNS):
        began = time.perf_counter()
        git(clone, "status", "--porcelain")
        times.append(1000 * (time.perf_counter() - began))
    return statistics.median(times)


async def _inline(fn: Callable[..., Any], *args: Any, **_: Any) -> Any:
    """A worker-thread call run on the loop's thread, so cProfile (one thread) sees it."""
    await trio.lowlevel.checkpoint()
    return fn(*args)


async def run(args: argparse.Namespace) -> None:
    if not args.threads:
        trio.to_thread.run_sync = _inline  # type: ignore[assignment]
    tree = synthetic(args.files, log=False)
    base = WORK / f"warm-profile-{args.files}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    clone = base / "wt"
    git(base, "clone", "-q", tree.path, str(clone))
    settle_deletions()  # the last run's clone, deleted at its end, taxes no file this run makes
    target = next(
        path for path in sorted(clone.rglob("*"))
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(clone).parts)
    )
    profile = cProfile.Profile()
    async with trio.open_nursery() as nursery:
        engine = Engine(home=str(base / "home"), nursery=nursery)
        for _ in range(3):
            await engine.call("checkpoint", {"path": str(clone), "session": "profile"})
        await trio.sleep(0.5)
        scans = set()
        split, wall = cpu_split(), time.perf_counter()
        if not args.no_profile:
            profile.enable()
        (state,) = engine.registry.worktrees.values()
        for index in range(args.captures):
            if not args.clean:
                with open(target, "a") as handle:
                    handle.write(f"{index}\n")
            if args.capture_only:
                async with state.lock:
                    scans.add((await state.capture.take()).stats.scan)
                continue
            result = await engine.call("checkpoint", {"path": str(clone), "session": "profile"})
            scans.add(result["stats"]["scan"])
        profile.disable()
        (user, system), wall = (now - then for now, then in zip(cpu_split(), split, strict=True)), (
            time.perf_counter() - wall)
        cpu = user + system
        await engine.aclose()
        nursery.cancel_scope.cancel()
    status_ms = git_status_ms(clone) if args.git_status else None
    shutil.rmtree(base, ignore_errors=True)
    what = ("clean" if args.clean else "1 file changed") + (", the capture alone" if args.capture_only else "")
    print(
        f"{args.files} files, {what}, {args.captures} {'captures' if args.capture_only else 'checkpoints'} ({', '.join(sorted(scans))}): "
        f"CPU {1000 * cpu / args.captures:.2f} ms (system {1000 * system / args.captures:.2f}), wall {1000 * wall / args.captures:.2f} ms each"
        f"{'' if args.no_profile else ' (profiled)'}, load {os.getloadavg()[0]:.1f}"
    )
    if status_ms is not None:
        print(f"git status on the same tree: {status_ms:.1f} ms (median of {STATUS_RUNS}), "
              f"{status_ms / (1000 * wall / args.captures):.0f}x the wall time of one")
    if args.no_profile:
        return
    if args.dump:
        profile.dump_stats(args.dump)
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats(args.sort).print_stats(args.top)
    print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("files", type=int)
    parser.add_argument("--captures", type=int, default=200)
    parser.add_argument("--clean", action="store_true", help="change nothing between checkpoints")
    parser.add_argument("--capture-only", action="store_true", help="take the tree alone, without the record")
    parser.add_argument("--git-status", action="store_true", help="time git status on the same tree, for the ratio")
    parser.add_argument("--threads", action="store_true", help="keep worker threads (cProfile sees the loop only)")
    parser.add_argument("--no-profile", action="store_true", help="CPU per checkpoint only")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--dump", help="write the profile's stats to this file (pstats)")
    args = parser.parse_args()
    one_malloc_arena()
    trio.run(run, args)


if __name__ == "__main__":
    main()
