"""A worktree with a big ``node_modules``: watches, the start, an install, two checkouts alternating.

Usage: ``python -m bench.ignored_folders OLD_CHECKOUT [NEW_CHECKOUT] [--rounds 3] [--files 2000]
[--modules 20000] [--install 4000] [--work DIR]``

One synthetic repository of ``--files`` tracked files (its ``.gitignore`` names
``node_modules/``), with ``--modules`` folders of packages in ``node_modules``
(two small files in each). Each round starts each checkout's daemon
(:func:`bench.ours.running_daemon`) on it, in turns, and measures:

- the start: the first checkpoint, then until the worktree is watched, and
  the inotify watches the daemon then holds (``/proc/<pid>/fdinfo``);
- 20 checkpoints after a tracked file's edit: the client's wait, and how many
  were warm (``watch``) and how many full scans;
- an install: ``--install`` new package folders written into ``node_modules``
  while the daemon runs, then one checkpoint: the daemon's CPU from the
  install's start to that checkpoint's end, the checkpoint's wait and kind;
  then 10 edits' checkpoints again.

Past the worktree's ceiling of watched folders (``SNAPSHOTD_WATCH_CEILING``,
50,000) a daemon that watches every folder gives the worktree up, and each of
its captures is a full scan: ``--modules 60000`` shows it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from .common import REPO_ROOT, two_checkouts_parser
from .ours import Daemon, running_daemon
from .request_cost import edited_files

sys.path.insert(0, str(REPO_ROOT / "fixtures" / "repos"))
from make_synthetic import make_synthetic

EDITS = 20
AFTER_INSTALL = 10
WATCHED_TIMEOUT_S = 120.0


def make_packages(folder: Path, count: int, tag: str) -> None:
    """``count`` folders of packages under ``folder``: ``pkg/``, ``pkg/lib/`` and ``pkg/dist/``, two files each."""
    for index in range(0, count, 3):
        package = folder / f"{tag}{index}"
        for inner in ("", "lib", "dist"):
            place = package / inner if inner else package
            place.mkdir(parents=True, exist_ok=True)
            (place / "index.js").write_text(f"module.exports = {index};\n")
            (place / "package.json").write_text('{"name": "p"}\n')


def watches_of(pid: int) -> int:
    """The inotify watches process ``pid`` holds."""
    held = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") == "anon_inode:inotify":
                with open(f"/proc/{pid}/fdinfo/{name}", "rb") as info:
                    held += info.read().count(b"\ninotify wd:")
        except OSError:
            continue
    return held


async def timed_checkpoint(daemon: Daemon, where: dict[str, str]) -> tuple[float, str]:
    began = time.perf_counter()
    result = await daemon.call("checkpoint", where)
    return (time.perf_counter() - began) * 1000, str(result["stats"]["scan"])


async def edits(daemon: Daemon, where: dict[str, str], edited: list[Path], count: int) -> tuple[list[float], list[str]]:
    waits, scans = [], []
    for index in range(count):
        with open(edited[index % len(edited)], "a") as out:
            out.write(f"edit {index}\n")
        wait, scan = await timed_checkpoint(daemon, where)
        waits.append(wait)
        scans.append(scan)
    return waits, scans


async def one_round(checkout: Path, repo: Path, edited: list[Path], install: int, round_: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    where = {"path": str(repo), "session": "bench"}
    async with running_daemon("ignored-folders", checkout=str(checkout)) as daemon:
        began = time.perf_counter()
        out["first checkpoint ms"], _ = await timed_checkpoint(daemon, where)
        deadline = time.monotonic() + WATCHED_TIMEOUT_S
        while time.monotonic() < deadline:
            status = await daemon.call("status")
            if all(worktree["watching"] or worktree.get("watch_error") for worktree in status["worktrees"]):
                break
            await trio.sleep(0.05)
        out["watched after ms"] = (time.perf_counter() - began) * 1000
        out["watches"] = watches_of(daemon.pid)
        out["start CPU s"] = daemon.cpu_seconds()
        waits, scans = await edits(daemon, where, edited, EDITS)
        out["edit ms"] = statistics.median(waits)
        out["edit scans"] = f"{scans.count('watch')} warm, {scans.count('full')} full"
        before = daemon.cpu_seconds()
        began = time.perf_counter()
        await trio.to_thread.run_sync(make_packages, repo / "node_modules" / f"installed{round_}", install, "new")
        out["install checkpoint ms"], out["install checkpoint"] = await timed_checkpoint(daemon, where)
        out["install CPU s"] = daemon.cpu_seconds() - before
        out["install to checkpoint s"] = time.perf_counter() - began
        waits, scans = await edits(daemon, where, edited, AFTER_INSTALL)
        out["edit after install ms"] = statistics.median(waits)
        out["edit after install scans"] = f"{scans.count('watch')} warm, {scans.count('full')} full"
        out["watches after install"] = watches_of(daemon.pid)
    shutil.rmtree(repo / "node_modules" / f"installed{round_}", ignore_errors=True)
    return out


async def run(args: argparse.Namespace, repo: Path) -> None:
    edited = edited_files(repo)
    checkouts = [args.old.resolve(), args.new.resolve()]
    results: dict[Path, list[dict[str, Any]]] = {checkout: [] for checkout in checkouts}
    for index in range(args.rounds):
        for checkout in checkouts if index % 2 == 0 else checkouts[::-1]:
            results[checkout].append(await one_round(checkout, repo, edited, args.install, index))
    old, new = checkouts
    print(f"{args.files} tracked files, {args.modules} folders in node_modules, an install of {args.install}; "
          f"medians of {args.rounds} rounds; old {old}, new {new}")
    for name, first in results[old][0].items():
        if isinstance(first, str):
            print(f"  {name:28} old {first:18} new {results[new][0][name]}")
            continue
        before = statistics.median(float(each[name]) for each in results[old])
        after = statistics.median(float(each[name]) for each in results[new])
        ratio = f"{after / before:.2f}" if before else "-"
        print(f"  {name:28} old {before:10.2f}  new {after:10.2f}  new/old {ratio}")


def main() -> None:
    parser = two_checkouts_parser(__doc__)
    parser.set_defaults(rounds=3)
    parser.add_argument("--modules", type=int, default=20_000, help="folders in node_modules")
    parser.add_argument("--install", type=int, default=4_000, help="folders an install adds while the daemon runs")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ignored-folders-", dir=args.work))
    try:
        make_synthetic(work / "repo", args.files, commit=True)
        make_packages(work / "repo" / "node_modules", args.modules, "pkg")
        trio.run(run, args, work / "repo")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
