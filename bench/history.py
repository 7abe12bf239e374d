"""History-flat reads and writes: 10 to 100,000 checkpoints in one store, as ratios against 10.

Usage: ``python -m bench.history [--sizes 10,1000,20000] [--old CHECKOUT] [--rounds 3] [--repeat 5]``

Each size is its own worktree (a 50-file repository) whose one session holds
that many checkpoints, written by :mod:`bench.history_build` as the daemon
writes them, and kept under ``bench/work/history-N`` between runs. Per round
and checkout (``--old`` adds a second checkout, run with its own ``.venv``;
the rounds alternate the order) a child process runs the engine in-process
(``Engine(home=..., nursery=...)``, the daemon's own code) in a fresh home and
times, as the median wall time and the mean CPU per call (the process's
threads and reaped git processes, from ``/proc/self/stat``): the first
``show`` of the oldest checkpoint (whatever the process must read once), then
``checkpoint`` after a one-file edit, ``list`` of the newest 20 and of all
(what the ``status`` table read per worktree before the counts came with
``status``), ``status``, ``show`` and
``diff`` (oldest to newest) of the oldest, ``restore`` of the oldest, ``gc``
with nothing to drop, a dry-run ``gc`` that would drop the 10 oldest, and
``delete`` of the newest checkpoint. The store is left as it was built, up to
the safety checkpoints restore takes.
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

from .common import REPO_ROOT, WORK, WORKLOAD_CPU

SESSION = "bench"

_WORKLOAD = (
    r"""
import json, os, statistics, sys, time
import trio
from snapshotd import Engine

"""
    + WORKLOAD_CPU
    + r"""

async def main(path, ids_file, repeat):
    ids = json.load(open(ids_file))
    oldest, newest = ids[0], ids[-1]
    out = {}
    async with trio.open_nursery() as nursery:
        engine = Engine(home=os.environ["SNAPSHOTD_HOME"], nursery=nursery, watch=False)

        async def timed(name, method, params, before=None, count=repeat):
            walls, cpu = [], cpu_s()
            for n in range(count):
                if before is not None:
                    await before(n)
                wall = time.perf_counter()
                await engine.call(method, params() if callable(params) else params)
                walls.append((time.perf_counter() - wall) * 1000)
            out[name] = {"wall_ms": statistics.median(walls), "cpu_ms": (cpu_s() - cpu) * 1000 / count}

        await engine.call("open", {"path": path})
        await timed("first show", "show", {"checkpoint": oldest}, count=1)
        edited = os.path.join(path, "turn.txt")
        made = []

        async def edit(n):
            with open(edited, "w") as fh:
                fh.write(f"{time.time()} {n}\n")

        async def checkpoint():
            wall = time.perf_counter()
            made.append((await engine.call("checkpoint", {"path": path, "session": "bench"}))["checkpoint"]["id"])
            return (time.perf_counter() - wall) * 1000

        walls, cpu = [], cpu_s()
        for n in range(repeat):
            await edit(n)
            walls.append(await checkpoint())
        out["checkpoint"] = {"wall_ms": statistics.median(walls), "cpu_ms": (cpu_s() - cpu) * 1000 / repeat}
        await timed("list 20", "list", {"path": path, "session": "bench", "limit": 20})
        await timed("list all", "list", {"path": path})
        await timed("status", "status", {})
        await timed("show oldest", "show", {"checkpoint": oldest})
        await timed("diff oldest", "diff", {"from": oldest, "to": newest})
        await timed("restore oldest", "restore", {"checkpoint": oldest, "path": path})
        await timed("gc, none to drop", "gc", {"path": path, "keep": 10**9})
        total = len(ids) + len(made)
        await timed("gc dry, 10 oldest", "gc", {"path": path, "keep": total - 10, "dry_run": True})
        walls, cpu = [], cpu_s()
        for checkpoint_id in reversed(made):
            wall = time.perf_counter()
            await engine.call("delete", {"checkpoints": [checkpoint_id]})
            walls.append((time.perf_counter() - wall) * 1000)
        out["delete newest"] = {"wall_ms": statistics.median(walls), "cpu_ms": (cpu_s() - cpu) * 1000 / len(made)}
        await engine.call("restore", {"checkpoint": newest, "path": path})
        await engine.aclose()
        nursery.cancel_scope.cancel()
    print(json.dumps(out))

trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
"""
)


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def store_of(count: int) -> tuple[Path, Path]:
    """The worktree holding ``count`` checkpoints and the JSON list of their ids (built once)."""
    root = WORK / f"history-{count}"
    path, ids_file = root / "tree", root / "ids.json"
    if ids_file.exists():
        return path, ids_file
    shutil.rmtree(root, ignore_errors=True)
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    for i in range(50):
        Path(path, "src").mkdir(exist_ok=True)
        Path(path, "src", f"f{i}.txt").write_text(f"file {i}\n" * 20)
    Path(path, "turn.txt").write_text("turn 0\n")
    _git(path, "add", "-A")
    _git(path, "-c", "user.name=Bench", "-c", "user.email=bench@example.invalid", "commit", "-q", "-m", "base")
    home = root / "home"
    opened = subprocess.run(
        [sys.executable, "-m", "snapshotd", "--embedded", "--json", "open", str(path)],
        env={**os.environ, "SNAPSHOTD_HOME": str(home)}, check=True, capture_output=True, text=True,
    )
    worktree_id = json.loads(opened.stdout)["worktree"]["id"]
    from .history_build import build_history

    ids = build_history(path, worktree_id, SESSION, count)
    ids_file.write_text(json.dumps(ids))
    return path, ids_file


def run_once(checkout: Path, path: Path, ids_file: Path, repeat: int, home: Path) -> dict[str, dict[str, float]]:
    python = checkout / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{checkout} has no .venv: run ./scripts/setup there first.")
    env = {**os.environ, "SNAPSHOTD_HOME": str(home), "PYTHONPATH": str(checkout)}
    done = subprocess.run([str(python), "-c", _WORKLOAD, str(path), str(ids_file), str(repeat)],
                          env=env, cwd=checkout, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the workload failed in {checkout}:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,1000,20000")
    parser.add_argument("--old", type=Path, help="another checkout to run side by side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    sides = {"new": REPO_ROOT} | ({"old": args.old} if args.old else {})
    stores = {size: store_of(size) for size in sizes}
    homes = Path(os.environ.get("TMPDIR", "/tmp"), f"snapshotd-history-{os.getpid()}")
    rounds: dict[tuple[str, int], list[dict[str, dict[str, float]]]] = {}
    for number in range(args.rounds):
        order = list(sides) if number % 2 == 0 else list(reversed(sides))
        for size in sizes:
            for side in order:
                home = homes / f"{side}-{size}-{number}"
                rounds.setdefault((side, size), []).append(
                    run_once(sides[side], *stores[size], args.repeat, home))
    shutil.rmtree(homes, ignore_errors=True)
    print(f"{args.rounds} rounds, {args.repeat} calls each; median wall ms (ratio to {sizes[0]}) / mean CPU ms")
    for side in sides:
        print(f"\n{side}: {sides[side]}")
        print(f"{'operation':<20}" + "".join(f"{size:>24,}" for size in sizes))
        for operation in rounds[side, sizes[0]][0]:
            cells = []
            base = None
            for size in sizes:
                wall = statistics.median(r[operation]["wall_ms"] for r in rounds[side, size])
                cpu = statistics.median(r[operation]["cpu_ms"] for r in rounds[side, size])
                base = wall if base is None else base
                cells.append(f"{wall:8.1f} (x{wall / base:5.1f}) {cpu:6.1f}")
            print(f"{operation:<20}" + "".join(f"{cell:>24}" for cell in cells))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
