"""What one request costs a real daemon over its socket, two checkouts alternating, as ratios.

Usage: ``python -m bench.request_cost OLD_CHECKOUT [NEW_CHECKOUT] [--rounds 6] [--requests 300]
[--files 2000] [--work DIR] [--attributes | --crlf] [--strace | --idle-turns N [--idle 8]]``

Each round starts each checkout's daemon (:func:`bench.ours.running_daemon`)
on one synthetic repository of ``--files`` files (built in ``--work``), warms
it with 30 checkpoints, then sends ``--requests`` of each kind on one
connection: ``ping``, a clean checkpoint, a checkpoint after one tracked file
was appended to (one of 40, each in its own folder), one after a new file was
written in one of those folders, one after a new folder of three files (one
in a folder of its own) was, one after writes to files git ignores (a
``.log`` beside them and a file in ``out/``, as tests and builds leave), and
``list`` of the newest one. The figure is the daemon's CPU (user and system) per request: what sets
the rate under 250 sessions once the disk's flushes do not (bench/README.md). The order of the checkouts alternates from round to round;
the report gives the medians and new ÷ old, the same with the CPU of the daemon's git
processes added (``with git``), the client's wait per request (``wall``) and the git
processes started per request (``processes``, exact). ``--attributes`` commits a ``.gitattributes`` of ``* text=auto
eol=lf`` first, as many projects have: git's end-of-line conversion in play. ``--crlf`` commits
``* text=auto eol=crlf`` and gives the edited files CRLF endings on disk, as a Windows project
checked out with its rules has: each edit keeps a CR byte for the conversion to remove.

``--idle-turns N`` instead plays N agent-like turns a pause apart (``--idle``
seconds, past the idle reconciliation's full scan): each writes a new file,
appends to a tracked one and to a log, then checkpoints. Per turn: the git
processes the checkpoint started, those the daemon started in all (the
reconciliation's too), the daemon's CPU with git's over the turn and its pause,
and the client's wait for the checkpoint.

``--strace`` instead counts the daemon's system calls (``strace -c -f``) over
200 one-file checkpoints per checkout: an exact figure, where CPU moves with
the machine.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from .common import REPO_ROOT, git, two_checkouts_parser
from .ours import Daemon, running_daemon

sys.path.insert(0, str(REPO_ROOT / "fixtures" / "repos"))
from make_synthetic import make_synthetic

EDITED = 40  # tracked files appended to in turn, each in a folder of its own
WARM_UP = 30
STRACE_REQUESTS = 200
SERIAL = itertools.count()  # new files' names, unique across rounds


def edited_files(repo: Path) -> list[Path]:
    """One tracked file in each of :data:`EDITED` folders (fewer if the tree has fewer), not a rule file
    (``.gitignore``, ``.gitattributes``: a change of one makes the next capture a full scan)."""
    chosen: dict[str, Path] = {}
    for name in os.fsdecode(git(repo, "ls-files", "-z")).split("\0"):
        folder = os.path.dirname(name)
        if name and folder not in chosen and len(chosen) < EDITED and not os.path.basename(name).startswith(".git"):
            chosen[folder] = repo / name
    return list(chosen.values())


class Workload:
    """The requests of one round, on ``repo``, through ``daemon``."""

    def __init__(self, daemon: Daemon, repo: Path, edited: list[Path]) -> None:
        self.daemon = daemon
        self.repo = repo
        self.where = {"path": str(repo), "session": "bench"}
        self.edited = edited

    async def checkpoint_after_an_edit(self, index: int) -> None:
        with open(self.edited[index % len(self.edited)], "a") as out:
            out.write(f"edit {index}\n")
        await self.daemon.call("checkpoint", self.where)

    async def checkpoint_after_a_new_file(self, index: int) -> None:
        folder = self.edited[index % len(self.edited)].parent
        (folder / f"new-{next(SERIAL)}.txt").write_text(f"new {index}\n")
        await self.daemon.call("checkpoint", self.where)

    async def checkpoint_after_a_new_folder(self, index: int) -> None:
        folder = self.edited[index % len(self.edited)].parent / f"feature-{next(SERIAL)}"
        (folder / "tests").mkdir(parents=True)
        for name in ("__init__.py", "core.py", "tests/test_core.py"):
            (folder / name).write_text(f"# {name} {index}\n")
        await self.daemon.call("checkpoint", self.where)

    async def checkpoint_after_ignored_writes(self, index: int) -> None:
        folder = self.edited[index % len(self.edited)].parent
        with open(folder / "run.log", "a") as log:  # *.log and out/ are ignored (make_synthetic)
            log.write(f"line {index}\n")
        (self.repo / "out").mkdir(exist_ok=True)
        (self.repo / "out" / f"obj-{index % 20}.o").write_text(f"build {index}\n")
        await self.daemon.call("checkpoint", self.where)

    def kinds(self) -> dict[str, Callable[[int], Awaitable[object]]]:
        return {
            "ping": lambda index: self.daemon.call("ping"),
            "clean checkpoint": lambda index: self.daemon.call("checkpoint", self.where),
            "one-file checkpoint": self.checkpoint_after_an_edit,
            "new-file checkpoint": self.checkpoint_after_a_new_file,
            "new-folder checkpoint": self.checkpoint_after_a_new_folder,
            "ignored-writes checkpoint": self.checkpoint_after_ignored_writes,
            "list, newest 1": lambda index: self.daemon.call("list", {**self.where, "limit": 1}),
        }


async def one_round(checkout: Path, repo: Path, edited: list[Path], requests: int) -> dict[str, float]:
    """The daemon's CPU milliseconds per request of each kind, and the wall milliseconds of each (``... wall``)."""
    out: dict[str, float] = {}
    async with running_daemon("request-cost", checkout=str(checkout)) as daemon:
        work = Workload(daemon, repo, edited)
        for index in range(WARM_UP):
            await work.checkpoint_after_an_edit(index)
        for name, request in work.kinds().items():
            started = await daemon.processes_started()
            before, before_all, began = daemon.cpu_seconds(), daemon.cpu_seconds_with_git(), trio.current_time()
            for index in range(requests):
                await request(index)
            out[name] = 1000 * (daemon.cpu_seconds() - before) / requests
            out[f"{name}, with git"] = 1000 * (daemon.cpu_seconds_with_git() - before_all) / requests
            out[f"{name}, wall"] = 1000 * (trio.current_time() - began) / requests
            out[f"{name}, processes"] = (await daemon.processes_started() - started) / requests
    return out


async def idle_turns(checkout: Path, repo: Path, edited: list[Path], turns: int, idle: float) -> dict[str, float]:
    """Per turn of :data:`--idle-turns`: processes (the checkpoint's, and all), CPU with git, the client's wait."""
    async with running_daemon("request-cost", checkout=str(checkout)) as daemon:
        work = Workload(daemon, repo, edited)
        for index in range(WARM_UP):
            await work.checkpoint_after_an_edit(index)
        await trio.sleep(idle)
        started, before = await daemon.processes_started(), daemon.cpu_seconds_with_git()
        own, waits = [], []
        for index in range(turns):
            tracked = edited[index % len(edited)]
            (tracked.parent / f"new-{next(SERIAL)}.txt").write_text(f"new {index}\n")
            with open(tracked, "ab") as out:
                out.write(b"edit\r\n" if b"\r\n" in tracked.read_bytes() else b"edit\n")
            with open(tracked.parent / "run.log", "a") as log:
                log.write(f"line {index}\n")
            began = trio.current_time()
            result = await daemon.call("checkpoint", work.where)
            waits.append(1000 * (trio.current_time() - began))
            own.append(result["stats"]["processes"])
            await trio.sleep(idle)
        return {
            "idle turn: the checkpoint's processes": statistics.mean(own),
            "idle turn: processes in all": (await daemon.processes_started() - started) / turns,
            "idle turn: CPU with git": 1000 * (daemon.cpu_seconds_with_git() - before) / turns,
            "idle turn: checkpoint, wall": statistics.median(waits),
        }


async def count_calls(checkout: Path, repo: Path, edited: list[Path]) -> dict[str, int]:
    """The daemon's system calls, by name, over :data:`STRACE_REQUESTS` one-file checkpoints."""
    summary = Path(tempfile.mkstemp(prefix="request-cost-strace-", suffix=".txt")[1])
    try:
        async with running_daemon("request-cost", checkout=str(checkout)) as daemon:
            work = Workload(daemon, repo, edited)
            for index in range(WARM_UP):
                await work.checkpoint_after_an_edit(index)
            tracer = subprocess.Popen(["strace", "-c", "-f", "-o", str(summary), "-p", str(daemon.pid)],
                                      stderr=subprocess.DEVNULL)
            await trio.sleep(1)
            for index in range(STRACE_REQUESTS):
                await work.checkpoint_after_an_edit(index)
            tracer.send_signal(signal.SIGINT)
            await trio.to_thread.run_sync(tracer.wait)
        calls: dict[str, int] = {}
        for line in summary.read_text().splitlines():
            match = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
            if match and match.group(2) != "total":
                calls[match.group(2)] = int(match.group(1))
        return calls
    finally:
        summary.unlink(missing_ok=True)


async def run(args: argparse.Namespace, repo: Path) -> None:
    edited = edited_files(repo)
    checkouts = [args.old.resolve(), args.new.resolve()]
    if args.strace:
        for checkout in checkouts:
            calls = await count_calls(checkout, repo, edited)
            top = ", ".join(f"{name} {count / STRACE_REQUESTS:.1f}" for name, count in
                            sorted(calls.items(), key=lambda item: -item[1])[:12])
            print(f"{checkout}: {sum(calls.values()) / STRACE_REQUESTS:.1f} system calls per one-file checkpoint ({top})")
        return
    results: dict[Path, dict[str, list[float]]] = {checkout: {} for checkout in checkouts}
    for index in range(args.rounds):
        for checkout in checkouts if index % 2 == 0 else checkouts[::-1]:
            if args.idle_turns:
                measured = await idle_turns(checkout, repo, edited, args.idle_turns, args.idle)
            else:
                measured = await one_round(checkout, repo, edited, args.requests)
            for name, value in measured.items():
                results[checkout].setdefault(name, []).append(value)
    old, new = checkouts
    print(f"daemon CPU per request (ms; wall: the client's wait), medians of {args.rounds} rounds of "
          f"{args.requests}; old {old}, new {new}")
    for name in results[old]:
        before, after = statistics.median(results[old][name]), statistics.median(results[new][name])
        ratio = f"{after / before:.2f}" if before else "-"
        print(f"  {name:37} old {before:6.2f}  new {after:6.2f}  new/old {ratio}")


def main() -> None:
    parser = two_checkouts_parser(__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--attributes", action="store_true",
                        help="commit a .gitattributes of '* text=auto eol=lf' first (git's conversion in play)")
    parser.add_argument("--crlf", action="store_true",
                        help="commit '* text=auto eol=crlf' and give the edited files CRLF endings on disk")
    parser.add_argument("--strace", action="store_true", help="count system calls instead (strace -c)")
    parser.add_argument("--idle-turns", type=int, default=0,
                        help="play this many turns a pause apart instead (each past the idle reconciliation)")
    parser.add_argument("--idle", type=float, default=8.0, help="seconds of pause after each --idle-turns turn")
    args = parser.parse_args()
    if args.strace and shutil.which("strace") is None:
        raise SystemExit("--strace needs strace on the PATH")
    args.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="request-cost-", dir=args.work))
    try:
        make_synthetic(work / "repo", args.files, commit=True)
        git(work / "repo", "repack", "-a", "-d", "-q")  # else the daemon's background packing packs them in a round
        if args.attributes or args.crlf:
            (work / "repo" / ".gitattributes").write_text(f"* text=auto eol={'crlf' if args.crlf else 'lf'}\n")
            git(work / "repo", "add", ".gitattributes")
            git(work / "repo", "commit", "-qm", "attributes")
        if args.crlf:
            for path in edited_files(work / "repo"):
                path.write_bytes(path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
        trio.run(run, args, work / "repo")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
