"""The same capture workload on two checkouts of snapshotd, side by side, as ratios.

Usage: ``python -m bench.checkouts OLD_CHECKOUT [NEW_CHECKOUT] [--files 5000] [--rounds 5]``

Each checkout runs the workload with its own ``.venv`` (run ``./scripts/setup``
in it first) through the public API only (``Engine(nursery=...)`` and
``engine.call``), so any two versions compare. The rounds alternate between
the checkouts, so a noisy machine slows both alike. Per round and checkout, a
child process times on one worktree: clean warm checkpoints, checkpoints after
one edited file, and exact (full-scan) checkpoints, each as the median wall
time and the mean CPU time per checkpoint of the process and the git
processes it reaped (``/proc/self/stat``). The
report gives both checkouts' medians over the rounds and new ÷ old.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from .common import REPO_ROOT, WORKLOAD_CPU
from .trees import synthetic

_WORKLOAD = (
    r"""
import json, os, statistics, sys, time
import trio
from snapshotd import Engine

"""
    + WORKLOAD_CPU
    + r"""

async def batch(engine, params, count, before=None):  # median wall ms; mean CPU ms (ticks are too coarse for one)
    walls, cpu = [], cpu_s()
    for n in range(count):
        if before is not None:
            before(n)
        wall = time.perf_counter()
        await engine.call("checkpoint", params)
        walls.append((time.perf_counter() - wall) * 1000)
    return {"wall_ms": statistics.median(walls), "cpu_ms": (cpu_s() - cpu) * 1000 / count}

async def main(path, count):
    edited = os.path.join(path, "bench-edited.txt")
    results = {}
    async with trio.open_nursery() as nursery:
        engine = Engine(home=os.environ["SNAPSHOTD_HOME"], nursery=nursery)
        params = {"path": path, "session": "bench"}
        await engine.call("checkpoint", params)
        await trio.sleep(0.5)
        results["clean"] = await batch(engine, params, count)
        results["one edit"] = await batch(engine, params, count, lambda n: open(edited, "w").write(str(n)))
        results["exact"] = await batch(engine, {**params, "exact": True}, max(3, count // 10))
        await engine.aclose()
        nursery.cancel_scope.cancel()
    os.unlink(edited)
    print(json.dumps(results))

trio.run(main, sys.argv[1], int(sys.argv[2]))
"""
)


def run_once(checkout: Path, path: str, count: int, home: Path) -> dict[str, dict[str, float]]:
    """One round of the workload in ``checkout``'s own interpreter, in a fresh snapshotd home."""
    python = checkout / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{checkout} has no .venv: run ./scripts/setup there first.")
    env = {**os.environ, "SNAPSHOTD_HOME": str(home), "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [str(python), "-c", _WORKLOAD, path, str(count)], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"the workload failed in {checkout}:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path, nargs="?", default=REPO_ROOT)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--captures", type=int, default=40)
    args = parser.parse_args()
    tree = synthetic(args.files)
    homes = Path(os.environ.get("TMPDIR", "/tmp"), f"snapshotd-checkouts-{os.getpid()}")
    rounds: dict[str, list[dict[str, dict[str, float]]]] = {"old": [], "new": []}
    for number in range(args.rounds):
        for side in ("old", "new") if number % 2 == 0 else ("new", "old"):
            home = homes / f"{side}-{number}"
            rounds[side].append(run_once(getattr(args, side), tree.path, args.captures, home))
    print(f"{tree.files} files, {args.rounds} rounds of {args.captures} captures; medians over rounds")
    print(f"{'workload':<10} {'old wall':>9} {'new wall':>9} {'ratio':>6}   {'old cpu':>8} {'new cpu':>8} {'ratio':>6}")
    for workload in rounds["old"][0]:
        figures = {
            (side, kind): statistics.median(r[workload][kind] for r in rounds[side])
            for side in rounds
            for kind in ("wall_ms", "cpu_ms")
        }
        wall = figures["new", "wall_ms"] / figures["old", "wall_ms"]
        cpu = figures["new", "cpu_ms"] / figures["old", "cpu_ms"] if figures["old", "cpu_ms"] else float("nan")
        print(
            f"{workload:<10} {figures['old', 'wall_ms']:>7.2f}ms {figures['new', 'wall_ms']:>7.2f}ms {wall:>6.2f}"
            f"   {figures['old', 'cpu_ms']:>6.2f}ms {figures['new', 'cpu_ms']:>6.2f}ms {cpu:>6.2f}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
