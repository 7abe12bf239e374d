"""What one request costs a real daemon over its socket, two checkouts alternating, as ratios.

Usage: ``python -m bench.request_cost OLD_CHECKOUT [NEW_CHECKOUT] [--rounds 6] [--requests 300]
[--files 2000] [--work DIR] [--strace]``

Each round starts each checkout's daemon (``python -m snapshotd serve`` from the
checkout, with its ``.venv`` if it has one) on one repository of ``--files``
files in 40 folders, warms it with 30 checkpoints, then sends ``--requests`` of
each kind on one connection: ``ping``, a clean checkpoint, a checkpoint after
one file was appended to (a different folder each time), ``list`` of the newest
one. The figure is the daemon's CPU (user and system, ``/proc/<pid>/stat``) per
request: under 250 sessions the daemon's one Python core is what runs out, so
this is the cost that sets the rate. The order of the checkouts alternates
from round to round; the report gives the medians and new ÷ old.

``--strace`` instead counts the daemon's system calls (``strace -c -f``) over
200 one-file checkpoints per checkout: an exact figure, where CPU moves with
the machine.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from snapshotd.client.rpc import Client

from .common import REPO_ROOT

FOLDERS = 40
WARM_UP = 30
STRACE_REQUESTS = 200


def make_repo(path: Path, files: int) -> None:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    for index in range(files):
        folder = path / f"d{index % FOLDERS}"
        folder.mkdir(exist_ok=True)
        (folder / f"f{index}.txt").write_text(f"file {index}\n" * 20)
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(path), "-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-qm", "start"],
        check=True,
    )


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def python_of(checkout: Path) -> str:
    own = checkout / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


class Daemon:
    """One checkout's daemon on a socket of its own, in a home of its own under ``work``."""

    def __init__(self, checkout: Path, work: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(dir=work))
        self.socket = str(self.dir / "s.sock")
        env = {**os.environ, "SNAPSHOTD_HOME": str(self.dir / "home")}
        with open(self.dir / "log", "wb") as log:
            self.proc = subprocess.Popen(
                [python_of(checkout), "-m", "snapshotd", "serve", "--socket", self.socket, "--allow-root"],
                cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while not os.path.exists(self.socket):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the daemon of {checkout} did not start: see {self.dir / 'log'}")
            time.sleep(0.05)

    def stop(self, client: Client) -> None:
        client.call("shutdown")
        self.proc.wait(timeout=20)


def appender(repo: Path) -> Callable[[int], None]:
    def append(index: int) -> None:
        folder = index % FOLDERS
        with open(repo / f"d{folder}" / f"f{folder}.txt", "a") as out:
            out.write(f"edit {index}\n")
    return append


def one_round(checkout: Path, repo: Path, work: Path, requests: int) -> dict[str, float]:
    daemon = Daemon(checkout, work)
    hz = os.sysconf("SC_CLK_TCK")
    where = {"path": str(repo), "session": "bench"}
    append = appender(repo)
    out: dict[str, float] = {}
    with Client(daemon.socket, timeout=60) as client:
        for index in range(WARM_UP):
            append(index)
            client.call("checkpoint", where)

        def measure(name: str, request: Callable[[int], object]) -> None:
            before = cpu_ticks(daemon.proc.pid)
            for index in range(requests):
                request(index)
            out[name] = 1000 * (cpu_ticks(daemon.proc.pid) - before) / hz / requests

        def edited(index: int) -> None:
            append(index)
            client.call("checkpoint", where)

        measure("ping", lambda index: client.call("ping"))
        measure("clean checkpoint", lambda index: client.call("checkpoint", where))
        measure("one-file checkpoint", edited)
        measure("list, newest 1", lambda index: client.call("list", {**where, "limit": 1}))
        daemon.stop(client)
    return out


def count_calls(checkout: Path, repo: Path, work: Path) -> tuple[int, dict[str, int]]:
    daemon = Daemon(checkout, work)
    where = {"path": str(repo), "session": "bench"}
    append = appender(repo)
    summary = daemon.dir / "strace.txt"
    with Client(daemon.socket, timeout=60) as client:
        for index in range(WARM_UP):
            append(index)
            client.call("checkpoint", where)
        tracer = subprocess.Popen(["strace", "-c", "-f", "-o", str(summary), "-p", str(daemon.proc.pid)],
                                  stderr=subprocess.DEVNULL)
        time.sleep(1)
        for index in range(STRACE_REQUESTS):
            append(index)
            client.call("checkpoint", where)
        tracer.send_signal(signal.SIGINT)
        tracer.wait()
        daemon.stop(client)
    calls: dict[str, int] = {}
    for line in summary.read_text().splitlines():
        match = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if match and match.group(2) != "total":
            calls[match.group(2)] = int(match.group(1))
    return sum(calls.values()), calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path, nargs="?", default=REPO_ROOT)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--work", type=Path, help="where the repository and the daemons' homes go (default: a temporary folder)")
    parser.add_argument("--strace", action="store_true", help="count system calls instead (strace -c)")
    args = parser.parse_args()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="request-cost-", dir=args.work))
    try:
        repo = work / "repo"
        make_repo(repo, args.files)
        checkouts = [args.old.resolve(), args.new.resolve()]
        if args.strace:
            if shutil.which("strace") is None:
                raise SystemExit("--strace needs strace on the PATH")
            for checkout in checkouts:
                total, calls = count_calls(checkout, repo, work)
                top = ", ".join(f"{name} {count / STRACE_REQUESTS:.1f}" for name, count in
                                sorted(calls.items(), key=lambda item: -item[1])[:12])
                print(f"{checkout}: {total / STRACE_REQUESTS:.1f} system calls per one-file checkpoint ({top})")
            return
        results: dict[Path, dict[str, list[float]]] = {checkout: {} for checkout in checkouts}
        for index in range(args.rounds):
            for checkout in checkouts if index % 2 == 0 else checkouts[::-1]:
                for name, value in one_round(checkout, repo, work, args.requests).items():
                    results[checkout].setdefault(name, []).append(value)
        old, new = checkouts
        print(f"daemon CPU per request (ms), medians of {args.rounds} rounds of {args.requests}; old {old}, new {new}")
        for name in results[old]:
            before, after = statistics.median(results[old][name]), statistics.median(results[new][name])
            print(f"  {name:22} old {before:6.2f}  new {after:6.2f}  new/old {after / before:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
