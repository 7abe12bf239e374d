"""Restore of 10, 4,500 and 5,000 files against ``git checkout-index`` of the same, side by side, as ratios.

Usage: ``python -m bench.restore_cost [--old CHECKOUT] [--files 5000] [--counts 10,4500,5000]
[--big 50000] [--rounds 3] [--work DIR]``

Per checkout (this one, and with ``--old`` another with its own ``.venv``),
a clone of the synthetic tree of ``--files`` files (and one of ``--big``
files, for the 10-file restore warm at that size) is worked on by a child
process running the engine in-process with a watcher, so captures are warm,
as in the daemon. The clean tree is checkpointed once; then for each count N,
in every round, N tracked files are appended to and

- ``restore``: the engine restores the clean checkpoint (its safety capture
  of the N changed files, the record, the N writes);
- ``checkpoint`` + ``checkout-index``: the same N files changed again are
  checkpointed (what a safety capture and record cost) and written back by
  ``git checkout-index -f -z --stdin`` from the user's index (what writing
  them costs git),

the two in alternating order. Reported per count: median wall ms of each,
restore ÷ checkout-index and restore ÷ (checkpoint + checkout-index), and
CPU ms from ``/proc/self/stat`` (this process's threads and the processes
it reaped: git). A restore's figure is until its answer; ``settled`` is
until its backups and journal are gone too (removed after the answer, under
the worktree's lock, so the next operation waits for them), and the CPU
figure includes that removal. With ``--old`` the rounds alternate between the
checkouts, so a busy machine slows both alike; the load average is printed
at the start and the end.
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
from .trees import synthetic

_WORKLOAD = (
    r"""
import json, os, subprocess, sys, time
import trio
from snapshotd import Engine

"""
    + WORKLOAD_CPU
    + r"""

def change(path, files, mark):
    for rel in files:
        with open(os.path.join(path, rel), "ab") as handle:
            handle.write(mark)

async def settled(path):
    # A daemon removes a restore's backups and journal after its answer, under the worktree's lock: wait for
    # that, so the next step's figure is its own.
    journal = os.path.join(path, ".git", "snapshotd", "journal")
    with trio.fail_after(60):
        while os.path.isdir(journal) and os.listdir(journal):
            await trio.sleep(0.0005)

async def timed(call):
    wall, cpu = time.perf_counter(), cpu_s()
    result = await call()
    return result, (time.perf_counter() - wall) * 1000, (cpu_s() - cpu) * 1000

async def checkout_index(path, files):
    listing = b"".join(os.fsencode(rel) + b"\0" for rel in files)
    await trio.to_thread.run_sync(lambda: subprocess.run(
        ["git", "-C", path, "checkout-index", "-f", "-z", "--stdin"], input=listing, check=True))

async def main(spec, flip):
    out = {}
    async with trio.open_nursery() as nursery:
        engine = Engine(home=os.environ["SNAPSHOTD_HOME"], nursery=nursery)
        for path, counts in spec:
            tracked = sorted(subprocess.run(["git", "-C", path, "ls-files", "-z"], capture_output=True,
                                            check=True).stdout.decode().split("\0"))
            tracked = [rel for rel in tracked if rel and rel != ".gitignore"]
            params = {"path": path, "session": "bench-restore"}
            clean = (await engine.call("checkpoint", params))["checkpoint"]["id"]
            await trio.sleep(0.5)
            await engine.call("checkpoint", params)  # warm from here on
            for count in counts:
                files = tracked[:: max(1, len(tracked) // count)][:count]
                figures = {}
                for side in ("git", "restore") if flip else ("restore", "git"):
                    change(path, files, b"changed for the bench\n")
                    if side == "restore":
                        result, wall, cpu = await timed(lambda: engine.call(
                            "restore", {"checkpoint": clean, "path": path}))
                        assert len(result["written"]) == len(files), (len(result["written"]), len(files))
                        _, after, after_cpu = await timed(lambda: settled(path))
                        figures["restore"] = {"wall_ms": wall, "cpu_ms": cpu, "settled_ms": wall + after,
                                              "settled_cpu_ms": cpu + after_cpu}
                    else:
                        _, wall, cpu = await timed(lambda: engine.call("checkpoint", params))
                        figures["checkpoint"] = {"wall_ms": wall, "cpu_ms": cpu}
                        _, wall, cpu = await timed(lambda: checkout_index(path, files))
                        figures["checkout-index"] = {"wall_ms": wall, "cpu_ms": cpu}
                out[f"{len(tracked)}:{len(files)}"] = figures
        await engine.aclose()
        nursery.cancel_scope.cancel()
    print(json.dumps(out))

trio.run(main, json.loads(sys.argv[1]), sys.argv[2] == "1")
"""
)


def _clone(source: str, dest: Path) -> str:
    """A fresh clone of ``source`` at ``dest`` (its own store and index), checked out."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    git(dest.parent, "clone", "-q", source, str(dest))
    return str(dest)


def run_once(checkout: Path, spec: list[tuple[str, list[int]]], home: Path, flip: bool) -> dict[str, Any]:
    """One round of the workload in ``checkout``'s own interpreter, in a fresh snapshotd home."""
    python = checkout / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{checkout} has no .venv: run ./scripts/setup there first.")
    env = {**os.environ, "SNAPSHOTD_HOME": str(home), "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [str(python), "-c", _WORKLOAD, json.dumps(spec), "1" if flip else "0"],
        env=env, capture_output=True, text=True, check=False,
        cwd=checkout,  # python -c puts its folder first on the path, ahead of PYTHONPATH: run there
    )
    if done.returncode != 0:
        raise SystemExit(f"the workload failed in {checkout}:\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _loadavg() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def _median(rounds: list[dict[str, Any]], key: str, kind: str, figure: str) -> float:
    return statistics.median(r[key][kind][figure] for r in rounds)


def report(rounds: dict[str, list[dict[str, Any]]]) -> None:
    """Print each checkout's medians over the rounds, and the ratios."""
    print(f"{'checkout':<6} {'files:N':<12} {'restore':>9} {'settled':>9} {'ckpt':>8} {'co-index':>9} {'÷co-idx':>7} "
          f"{'÷(ckpt+co)':>10} {'settled ÷':>9}   {'cpu settled':>11} {'cpu ckpt+co':>11}")
    for side, found in rounds.items():
        for key in found[0]:
            restore = _median(found, key, "restore", "wall_ms")
            settled = _median(found, key, "restore", "settled_ms")
            ckpt = _median(found, key, "checkpoint", "wall_ms")
            co = _median(found, key, "checkout-index", "wall_ms")
            cpu = _median(found, key, "restore", "settled_cpu_ms")
            cpu_git = _median(found, key, "checkpoint", "cpu_ms") + _median(found, key, "checkout-index", "cpu_ms")
            print(f"{side:<6} {key:<12} {restore:>7.0f}ms {settled:>7.0f}ms {ckpt:>6.0f}ms {co:>7.0f}ms "
                  f"{restore / co:>7.2f} {restore / (ckpt + co):>10.2f} {settled / (ckpt + co):>9.2f}   "
                  f"{cpu:>9.0f}ms {cpu_git:>9.0f}ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="another checkout (with its .venv) to run side by side")
    parser.add_argument("--files", type=int, default=5000, help="the synthetic tree (its .gitignore is never changed)")
    parser.add_argument("--counts", default="10,4500,5000")
    parser.add_argument("--big", type=int, default=50000, help="a tree this big for the 10-file restore (0: none)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=WORK / "restore-cost",
                        help="where the clones and homes go (/dev/shm/...: a tmpfs, the disk out of the picture)")
    args = parser.parse_args()
    counts = [int(n) for n in args.counts.split(",")]
    trees = [(synthetic(args.files).path, counts)]
    if args.big:
        trees.append((synthetic(args.big).path, [10]))
    sides = {"new": REPO_ROOT, **({"old": args.old} if args.old else {})}
    base = args.work
    spec = {
        side: [(_clone(path, base / side / Path(path).name), sizes) for path, sizes in trees] for side in sides
    }
    print(f"load average at start: {_loadavg()}", flush=True)
    rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for number in range(args.rounds):
        order = list(sides) if number % 2 == 0 else list(reversed(sides))
        for side in order:
            home = base / f"home-{side}-{number}"
            rounds[side].append(run_once(sides[side], spec[side], home, number % 2 == 1))
            shutil.rmtree(home, ignore_errors=True)
    print(f"load average at end: {_loadavg()}; medians over {args.rounds} rounds")
    report(rounds)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
