"""What one push costs with 10 or 10,000 checkpoints already on the remote: bytes each way and time.

Usage: ``python -m bench.push_cost [--sizes 10,10000] [--rounds 7]``

Per size, under ``bench/work/push-N``: a bare remote served by a real
``git daemon --enable=receive-pack`` on 127.0.0.1, reached through a
counting TCP relay in this process (so the bytes are what crossed the
socket), and a clone of it (50 files) whose one session holds N checkpoints,
written by :mod:`bench.history_build` as the daemon writes them and pushed
once (not timed: the remote now holds N). Then each round edits one file,
checkpoints, and times ``push`` (the engine in-process, the daemon's own
code): wall time, bytes the client sent, bytes it received. A push's cost
should grow with what is new, not with what the remote holds. A push that
fails is counted in ``failures`` and taken again (once in a few hundred
pushes through the relay, git was ended by SIGPIPE; never without it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import trio

from .common import RESULTS, WORK, git, machine_info
from .history_build import build_history


class Relay:
    """A TCP relay from a local port to ``target``, counting the bytes of each direction."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.up = self.down = 0
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, "up"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, "down"), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        """Copy until ``source`` ends; once ``sink`` is gone, keep reading and drop it, so nothing is left unread.

        A socket closed with bytes unread sends a reset, which makes its peer
        drop what it had not read yet: git's last report, on the client.
        """
        open_sink = True
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if open_sink:
                    try:
                        sink.sendall(data)
                    except OSError:
                        open_sink = False
                with self.lock:
                    setattr(self, direction, getattr(self, direction) + len(data))
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)  # pass the end on; the other direction may still be talking

    def take(self) -> tuple[int, int]:
        """Bytes up and down since the last call."""
        with self.lock:
            counts, self.up, self.down = (self.up, self.down), 0, 0
        return counts

    def close(self) -> None:
        self.server.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _git_daemon(base: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    proc = subprocess.Popen(
        ["git", "daemon", "--reuseaddr", "--listen=127.0.0.1", f"--port={port}", f"--base-path={base}",
         "--export-all", "--enable=receive-pack", str(base)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("git daemon did not start")


def _prepare(size: int) -> Path:
    """bench/work/push-N: the bare remote and a clone with 50 committed files, fresh each run."""
    folder = WORK / f"push-{size}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    git(folder, "init", "-q", "--bare", "remote.git")
    clone = folder / "clone"
    git(folder, "clone", "-q", str(folder / "remote.git"), str(clone))
    for index in range(50):
        (clone / f"file{index:02d}.txt").write_text(f"file {index}\n" * 20)
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "files")
    git(clone, "push", "-q", "origin", "HEAD:refs/heads/main")
    return folder


async def _measure(size: int, rounds: int, direct: bool = False) -> dict[str, Any]:
    from snapshotd.engine.core import Engine
    from snapshotd.errors import SnapshotdError

    folder = _prepare(size)
    clone = folder / "clone"
    proc, port = _git_daemon(folder)
    relay = Relay(port)
    try:
        git(clone, "remote", "set-url", "origin", f"git://127.0.0.1:{port if direct else relay.port}/remote.git")
        home = folder / "home"
        home.mkdir(mode=0o700)
        engine = Engine(home=home)
        try:
            worktree = (await engine.call("open", {"path": str(clone)}))["worktree"]["id"]
            build_history(clone, worktree, "bench", size)
            started = time.perf_counter()
            await engine.call("push", {"path": str(clone)})
            first_ms = (time.perf_counter() - started) * 1000
            first_up, first_down = relay.take()
            samples: list[dict[str, float]] = []
            failures: list[str] = []
            for turn in range(rounds):
                (clone / "file00.txt").write_text(f"round {turn}\n")
                await engine.call("checkpoint", {"path": str(clone), "session": "bench"})
                relay.take()
                started = time.perf_counter()
                try:
                    result = await engine.call("push", {"path": str(clone)})
                except SnapshotdError as exc:  # counted, and the round taken again from its start
                    failures.append(exc.message)
                    relay.take()
                    started = time.perf_counter()
                    result = await engine.call("push", {"path": str(clone)})
                elapsed = (time.perf_counter() - started) * 1000
                up, down = relay.take()
                assert result["pushed"], result
                samples.append({"ms": elapsed, "up": up, "down": down})
        finally:
            await engine.aclose()
    finally:
        relay.close()
        proc.terminate()
        proc.wait()
    return {
        "size": size,
        "first_push": {"ms": round(first_ms, 1), "up": first_up, "down": first_down},
        "median_ms": round(statistics.median(s["ms"] for s in samples), 1),
        "max_ms": round(max(s["ms"] for s in samples), 1),
        "median_up": statistics.median(s["up"] for s in samples),
        "median_down": statistics.median(s["down"] for s in samples),
        "failures": failures,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,10000")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--name", default="push-cost")
    parser.add_argument("--direct", action="store_true", help="Straight to git daemon, no relay (no byte counts).")
    args = parser.parse_args()
    rows = [trio.run(_measure, int(size), args.rounds, args.direct) for size in args.sizes.split(",")]
    lines = ["| checkpoints on the remote | push ms (median / max) | bytes sent | bytes received | first push (ms, sent) | failed |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        first = row["first_push"]
        lines.append(
            f"| {row['size']:,} | {row['median_ms']} / {row['max_ms']} | {row['median_up']:,.0f} | "
            f"{row['median_down']:,.0f} | {first['ms']}, {first['up']:,} | {len(row['failures'])} |"
        )
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y-%m-%d")
    (RESULTS / f"{stamp}-{args.name}.json").write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=1))
    (RESULTS / f"{stamp}-{args.name}.md").write_text(f"# push cost\n\n`python -m bench.push_cost --sizes {args.sizes} --rounds {args.rounds}`\n\n{table}\n")


if __name__ == "__main__":
    main()
