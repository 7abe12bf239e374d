"""What the capture by git alone (SHA-256 repositories, split indexes) costs, with another checkout side by side.

Usage: ``python -m bench.fallback_copy [--old CHECKOUT] [--rounds 5]``

git's work tree there is a private copy of the paths it updates, read by
descriptor (capture/mirror.py), where it used to open the worktree's files
itself. Per checkout (this one, and with ``--old`` another with its own
``.venv``), a child process runs the engine in-process (no watcher: such a
repository is always captured cold) on a SHA-256 repository of 5,000 tracked
files of 1 KiB and 20 of 8 MiB, and times ``exact`` checkpoints of

- ``10 of 5000``: 10 small tracked files changed;
- ``2000 new``: 2,000 untracked files of 4 KiB, all touched before each
  capture so that none is taken from the stat cache;
- ``20 x 8 MiB``: the 20 big tracked files changed (160 MiB hashed).

Reported per case: median wall ms and CPU ms (the process's threads and the
git processes it reaped, from ``/proc/self/stat``) over the rounds, which
alternate between the checkouts; the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from .common import REPO_ROOT, WORK, WORKLOAD_CPU, git

_WORKLOAD = (
    r"""
import json, os, sys, time
import trio
from snapshotd import Engine

"""
    + WORKLOAD_CPU
    + r"""

def touch(path, names, mark):
    for name in names:
        with open(os.path.join(path, name), "ab") as handle:
            handle.write(mark)

async def main(path, rounds):
    small = [f"small/{n // 100:02}/{n:05}.txt" for n in range(5000)]
    big = [f"big/{n:02}.bin" for n in range(20)]
    new = [f"new/{n // 100:02}/{n:05}.txt" for n in range(2000)]
    engine = Engine(home=os.environ["SNAPSHOTD_HOME"])
    params = {"path": path, "session": "bench-fallback", "exact": True}
    await engine.call("checkpoint", params)
    out = {"10 of 5000": [], "2000 new": [], "20 x 8 MiB": []}
    for turn in range(rounds):
        for case, names in (("10 of 5000", small[::500]), ("2000 new", new), ("20 x 8 MiB", big)):
            touch(path, names, b"%d\n" % turn)
            wall, cpu = time.perf_counter(), cpu_s()
            result = await engine.call("checkpoint", params)
            out[case].append({"wall_ms": (time.perf_counter() - wall) * 1000, "cpu_ms": (cpu_s() - cpu) * 1000,
                              "hashed": result["stats"]["hashed"]})
    await engine.aclose()
    print(json.dumps(out))

trio.run(main, sys.argv[1], int(sys.argv[2]))
"""
)


def build(dest: Path) -> str:
    """The SHA-256 repository of the workload at ``dest``, made anew."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    git(dest, "init", "-q", "--object-format=sha256")
    for n in range(5000):
        path = dest / "small" / f"{n // 100:02}" / f"{n:05}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"{n}\n".encode() * 200)
    (dest / "big").mkdir()
    for n in range(20):
        (dest / "big" / f"{n:02}.bin").write_bytes(os.urandom(1 << 16) * 128)
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "start")
    for n in range(2000):
        path = dest / "new" / f"{n // 100:02}" / f"{n:05}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 4096)
    return str(dest)


def run_once(checkout: Path, path: str, home: Path, rounds: int) -> dict[str, Any]:
    python = checkout / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{checkout} has no .venv: run ./scripts/setup there first.")
    env = {**os.environ, "SNAPSHOTD_HOME": str(home), "PYTHONPATH": str(checkout)}
    done = subprocess.run([str(python), "-c", _WORKLOAD, path, str(rounds)], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the workload failed in {checkout}:\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _loadavg() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="another checkout (with its .venv) to run side by side")
    parser.add_argument("--rounds", type=int, default=5, help="captures of each case, alternating checkouts")
    args = parser.parse_args()
    sides = {"new": REPO_ROOT, **({"old": args.old} if args.old else {})}
    base = WORK / "fallback-copy"
    trees = {side: build(base / side / "repo") for side in sides}
    print(f"load average at start: {_loadavg()}", flush=True)
    samples: dict[str, dict[str, list[dict[str, float]]]] = {side: {} for side in sides}
    for number in range(args.rounds):
        for side in list(sides) if number % 2 == 0 else list(reversed(sides)):
            home = base / f"home-{side}-{number}"
            for case, figures in run_once(sides[side], trees[side], home, 1).items():
                samples[side].setdefault(case, []).extend(figures)
            shutil.rmtree(home, ignore_errors=True)
    print(f"load average at end: {_loadavg()}; medians over {args.rounds} rounds")
    print(f"{'checkout':<9} {'case':<12} {'wall':>9} {'cpu':>9} {'hashed':>7}")
    for side, cases in samples.items():
        for case, figures in cases.items():
            wall = statistics.median(f["wall_ms"] for f in figures)
            cpu = statistics.median(f["cpu_ms"] for f in figures)
            print(f"{side:<9} {case:<12} {wall:>7.0f}ms {cpu:>7.0f}ms {int(figures[0]['hashed']):>7}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
