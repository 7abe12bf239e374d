"""Starting processes, measured two ways, in a small and in a 2 GiB process.

* Spawn latency: ``bench/spawn_bench.py`` (each way runs ``git --version``
  in turn, then again after touching 2 GiB), run as it is and its JSON read.
* Loop responsiveness under spawn load (this module): a fresh child
  interpreter, optionally holding 2 GiB of resident ballast, serves a
  line-echo "ping" on a Unix socket from a trio loop while it starts
  ``git --version`` 50 times a second with the way under test; this process
  pings it every 10 ms and records the round trips. A way that blocks the
  loop, or whose start grows with the process size, shows here.

Ways under load: the helper's trio face (``snapshotd.git.spawn.run``: posix_spawn,
pidfd, pipes as trio streams), its blocking face (``run_sync``, called on the
loop), ``subprocess.run`` (vfork in CPython), ``os.posix_spawn`` +
``waitpid``, ``trio.run_process``, and a real fork for reference
(``subprocess`` with a ``preexec_fn``, which makes CPython fork).

Alone: ``python -m bench.spawn_load [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from .common import BENCH_DIR, REPO_ROOT, summarize

WAYS = ["helper-trio", "helper-sync", "subprocess.run", "os.posix_spawn", "trio.run_process", "fork"]
GiB = 1 << 30
LOAD_ARGV = ["git", "--version"]
RATE_PER_S = 50


# --------------------------------------------------------------------------- in the child


def _env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C", "HOME": os.environ.get("HOME", "/")}


def _nothing() -> None:
    pass


async def _spawn(way: str, argv: list[str], git_path: str) -> None:
    import trio

    from snapshotd.git import spawn

    if way == "helper-trio":
        await spawn.run(argv, cwd="/", env=_env())
    elif way == "trio.run_process":
        await trio.run_process(argv, cwd="/", env=_env(), capture_stdout=True, capture_stderr=True, check=False)
    elif way == "helper-sync":
        spawn.run_sync(argv, cwd="/", env=_env())
    elif way == "subprocess.run":
        subprocess.run(argv, cwd="/", env=_env(), capture_output=True, check=False)
    elif way == "os.posix_spawn":
        pid = os.posix_spawn(git_path, argv, _env(),
                             file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])
        os.waitpid(pid, 0)
    elif way == "fork":
        subprocess.run(argv, cwd="/", env=_env(), capture_output=True, check=False, preexec_fn=_nothing)
    else:
        raise ValueError(way)


def child_serve(way: str, socket_path: str, rate: float, ballast_bytes: int) -> None:
    """Serve pings while starting ``git --version`` ``rate`` times a second with ``way``."""
    import psutil
    import trio

    ballast = bytearray(ballast_bytes)
    if ballast_bytes:
        ballast[::4096] = b"\x01" * len(range(0, ballast_bytes, 4096))  # fault in every page
    rss = psutil.Process().memory_info().rss
    git_path = shutil.which("git") or "git"

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            while True:
                data = await stream.receive_some(64)
                if not data:
                    return
                await stream.send_all(data)

    async def spawner(stats: dict[str, float]) -> None:
        if rate <= 0:
            return
        interval = 1 / rate
        deadline = trio.current_time()
        while True:
            deadline += interval
            start = time.perf_counter()
            await _spawn(way, LOAD_ARGV, git_path)
            stats["spawns"] += 1
            stats["spawn_ms"] += (time.perf_counter() - start) * 1000
            await trio.sleep_until(max(deadline, trio.current_time()))

    async def main() -> None:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(socket_path)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        stats = {"spawns": 0.0, "spawn_ms": 0.0}
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, handle, [listener])
            nursery.start_soon(spawner, stats)
            print(json.dumps({"ready": True, "rss": rss}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)  # until the parent closes our stdin
            nursery.cancel_scope.cancel()
        elapsed = time.monotonic() - started
        print(json.dumps({**stats, "elapsed": elapsed}), flush=True)

    trio.run(main)
    del ballast


# --------------------------------------------------------------------------- in the parent


def measure_ping(way: str, rate: float, seconds: float, ballast_bytes: int) -> dict[str, Any]:
    """Ping a child every 10 ms for ``seconds`` while it spawns ``rate``/s with ``way``."""
    folder = tempfile.mkdtemp(prefix="spawn-load-")
    path = os.path.join(folder, "ping.sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.spawn_load", "--child", way, path, str(rate), str(ballast_bytes)],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        ready = json.loads(proc.stdout.readline())
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.settimeout(10)
        rtts = []
        time.sleep(0.3)  # let the spawner settle into its rhythm
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.perf_counter()
            sock.sendall(b"p")
            sock.recv(64)
            rtts.append((time.perf_counter() - start) * 1000)
            time.sleep(0.01)
        sock.close()
        proc.stdin.close()
        tail = json.loads(proc.stdout.readline())
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
    result = summarize(rtts)
    result["child_rss"] = ready["rss"]
    result["spawns_per_s"] = round(tail["spawns"] / max(tail["elapsed"], 1e-9), 1)
    result["spawn_ms_mean"] = round(tail["spawn_ms"] / max(tail["spawns"], 1), 3)
    return result


def spawn_latency(runs: int, warmup: int) -> dict[str, Any]:
    """Run bench/spawn_bench.py as it is and return its JSON."""
    with tempfile.TemporaryDirectory(prefix="spawn-bench-") as folder:
        out = os.path.join(folder, "spawn.json")
        subprocess.run(
            [sys.executable, str(BENCH_DIR / "spawn_bench.py"), "--runs", str(runs), "--warmup", str(warmup),
             "--out", out],
            cwd=REPO_ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        with open(out) as fh:
            return json.load(fh)


def run(quick: bool = False, log: Any = print) -> dict[str, Any]:
    """Both measurements; the result as a JSON-ready dict."""
    runs, warmup = (30, 5) if quick else (300, 20)
    seconds = 1.0 if quick else 5.0
    log(f"  spawn latency (bench/spawn_bench.py, {runs} runs per way and size) ...")
    out: dict[str, Any] = {"latency": spawn_latency(runs, warmup), "ping_under_load": {},
                           "rate_per_s": RATE_PER_S, "load_argv": LOAD_ARGV, "ping_seconds": seconds}
    for label, ballast in {"small": 0, "2GiB": 2 * GiB}.items():
        log(f"  ping while spawning {RATE_PER_S}/s, {label} process ...")
        found = {"idle (no spawns)": measure_ping("helper-trio", 0, seconds, ballast)}
        for way in WAYS:
            found[way] = measure_ping(way, RATE_PER_S, seconds, ballast)
        out["ping_under_load"][label] = found
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.child:
        way, path, rate, ballast = args.child
        child_serve(way, path, float(rate), int(ballast))
        return 0
    print(json.dumps(run(args.quick), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
