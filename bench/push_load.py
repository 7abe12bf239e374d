"""Capture latency with and without background push: many worktrees pushing to one local remote.

Usage: ``python -m bench.push_load [--worktrees 50] [--sessions 250] [--captures 4] [--rounds 2]``

Under ``bench/work/push-load``: one bare remote (``file://``) and W clones of
it (20 files each), one daemon (``python -m snapshotd serve``). S sessions,
spread evenly over the clones and over 25 connections, each edit their own
file and ``checkpoint``, C times, with 0-40 ms of thinking between. A run
"off" has background push off in every clone; a run "on" turns it on
(``push`` with ``background``) first; the runs alternate (off on, on off, ...), ``--rounds`` of
each, in one daemon, and each run's figures are kept: on a shared machine the
load moves more between runs than a setting does, so compare neighbours. Each capture's latency is what the client waited.
After an "on" run the daemon's pushes are waited for and every clone's
refs are compared with the remote's: nothing may be missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import trio

from snapshotd.client.rpc import AsyncClient

from .common import RESULTS, WORK, git, machine_info, summarize
from .ours import running_daemon

CONNECTIONS = 25


def _prepare(worktrees: int) -> tuple[Path, list[Path]]:
    folder = WORK / "push-load"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    bare = folder / "remote.git"
    git(folder, "init", "-q", "--bare", str(bare))
    seed = folder / "seed"
    git(folder, "clone", "-q", bare.as_uri(), str(seed))
    for index in range(20):
        (seed / f"f{index:02d}.txt").write_text(f"file {index}\n" * 10)
    git(seed, "add", "-A")
    git(seed, "commit", "-q", "-m", "files")
    git(seed, "push", "-q", "origin", "HEAD:refs/heads/main")
    clones = []
    for index in range(worktrees):
        clone = folder / f"wt{index:02d}"
        git(folder, "clone", "-q", bare.as_uri(), str(clone))
        clones.append(clone)
    return bare, clones


def _refs(cwd: Path, *args: str) -> dict[str, str]:
    out = git(cwd, *args).decode()
    return {name: oid for oid, name in (line.split("\t") for line in out.splitlines()) if name.startswith("refs/snapshotd/")}


async def _session(client: AsyncClient, clone: Path, name: str, captures: int, latencies: list[float]) -> None:
    for turn in range(captures):
        (clone / f"{name}.txt").write_text(f"{name} {turn}\n")
        started = time.perf_counter()
        await client.call("checkpoint", {"path": str(clone), "session": name})
        latencies.append((time.perf_counter() - started) * 1000)
        await trio.sleep(random.uniform(0, 0.04))


async def _run(socket_path: str, clones: list[Path], sessions: int, captures: int) -> list[float]:
    latencies: list[float] = []
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(AsyncClient.connect(socket_path)) for _ in range(CONNECTIONS)]
        async with trio.open_nursery() as nursery:
            for index in range(sessions):
                client = clients[index % CONNECTIONS]
                nursery.start_soon(_session, client, clones[index % len(clones)], f"s{index}", captures, latencies)
    return latencies


async def _settle(daemon: Any, clones: list[Path], bare: Path) -> dict[str, Any]:
    """Wait for the background pushes to finish; compare every clone's refs with the remote's."""
    started = time.perf_counter()
    while True:
        pushes = (await daemon.call("status"))["background_push"]
        if all(not p["pending"] and not p["in_flight"] for p in pushes.values()):
            break
        await trio.sleep(0.2)
    settle_s = time.perf_counter() - started
    remote = _refs(bare, "for-each-ref", "--format=%(objectname)\t%(refname)")
    local: dict[str, str] = {}
    for clone in clones:
        local |= _refs(clone, "for-each-ref", "--format=%(objectname)\t%(refname)", "refs/snapshotd/")
    missing = sorted(name for name, oid in local.items() if remote.get(name) != oid)
    return {
        "settle_s": round(settle_s, 2),
        "pushes": sum(p["pushes"] for p in pushes.values()),
        "errors": [p["last_error"] for p in pushes.values() if p["last_error"]],
        "refs": len(local),
        "missing": missing,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    bare, clones = _prepare(args.worktrees)
    results: dict[str, Any] = {"off": [], "on": [], "checks": [], "runs": []}
    async with running_daemon("push-load") as daemon:
        for clone in clones:  # open every worktree first: the first capture of each is a cold one
            await daemon.call("checkpoint", {"path": str(clone), "session": "warm-up"})
        for round_index in range(args.rounds):
            for mode in ("off", "on") if round_index % 2 == 0 else ("on", "off"):
                for clone in clones:
                    await daemon.call("push", {"path": str(clone), "background": mode == "on"})
                latencies = await _run(daemon.socket_path, clones, args.sessions, args.captures)
                results[mode] += latencies
                results["runs"].append({"mode": mode, **summarize(latencies)})
                if mode == "on":
                    results["checks"].append(await _settle(daemon, clones, bare))
                print(mode, summarize(latencies), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worktrees", type=int, default=50)
    parser.add_argument("--sessions", type=int, default=250)
    parser.add_argument("--captures", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--name", default="push-load")
    args = parser.parse_args()
    results = trio.run(main_async, args)
    off, on = summarize(results["off"]), summarize(results["on"])
    lines = [
        "| background push | captures | median ms | p90 ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *(f"| {mode} | {s['n']} | {s['median']} | {s['p90']} | {s['p99']} | {s['max']} |" for mode, s in (("off", off), ("on", on))),
    ]
    lines += ["", "| run | background push | median ms | p99 ms |", "| ---: | --- | ---: | ---: |"]
    lines += [f"| {n + 1} | {run['mode']} | {run['median']} | {run['p99']} |" for n, run in enumerate(results["runs"])]
    checks = results["checks"]
    summary = (
        f"pushes after the 'on' runs: {[c['pushes'] for c in checks]} (cumulative), settled in {[c['settle_s'] for c in checks]} s, "
        f"refs missing on the remote: {sum(len(c['missing']) for c in checks)} of {[c['refs'] for c in checks]}, "
        f"push errors: {sum(len(c['errors']) for c in checks)}"
    )
    print("\n".join(lines) + "\n\n" + summary)
    stamp = time.strftime("%Y-%m-%d")
    RESULTS.mkdir(exist_ok=True)
    command = f"python -m bench.push_load --worktrees {args.worktrees} --sessions {args.sessions} --captures {args.captures} --rounds {args.rounds}"
    (RESULTS / f"{stamp}-{args.name}.json").write_text(json.dumps({"machine": machine_info(), "args": vars(args), **results}, indent=1))
    (RESULTS / f"{stamp}-{args.name}.md").write_text(f"# capture latency with background push\n\n`{command}`\n\n" + "\n".join(lines) + f"\n\n{summary}\n")


if __name__ == "__main__":
    main()
