"""A burst of clients waits its turn: each gets its answer, or after its timeout one sentence saying the daemon is busy.

Never a raw ``EAGAIN``. Real daemons on real sockets; a full listen queue is
made by stopping the daemon (SIGSTOP) and connecting until the kernel says
EAGAIN, a full connection cap by holding that many connections open.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from daemon_helpers import Daemon, child_env, cli, running_daemon
from hook_helpers import placed, recorded
from repo_helpers import init_repo

from snapshotd.client.rpc import AsyncClient, Client
from snapshotd.errors import Busy

BURST = 600
BUSY_START = "snapshotd is busy: "


def at_once(count: int, work: Callable[[], Any]) -> list[tuple[str, float]]:
    """Run ``work`` in ``count`` threads released together; each outcome ("ok" or the error) and its seconds."""
    barrier = threading.Barrier(count)
    outcomes: list[tuple[str, float]] = []
    lock = threading.Lock()

    def one() -> None:
        barrier.wait()
        started = time.monotonic()
        try:
            work()
            outcome = "ok"
        except Busy as exc:
            outcome = f"Busy: {exc.message}"
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        with lock:
            outcomes.append((outcome, time.monotonic() - started))

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(outcomes) == count, "some clients never returned"
    return outcomes


def ping_with(path: Path, timeout: float) -> Callable[[], Any]:
    def work() -> None:
        with Client(str(path), timeout=timeout) as client:
            assert client.call("ping")["pid"] > 0

    return work


@contextmanager
def queue_full(daemon: Daemon) -> Iterator[None]:
    """The daemon stopped (SIGSTOP) with its listen queue full; on leaving, the fillers close and it goes on."""
    fillers: list[socket.socket] = []
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        while len(fillers) < 100_000:
            filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            filler.setblocking(False)
            try:
                filler.connect(str(daemon.socket))
            except BlockingIOError:
                filler.close()
                break
            fillers.append(filler)
        yield
    finally:
        for filler in fillers:
            filler.close()
        os.kill(daemon.pid, signal.SIGCONT)


@pytest.fixture
def burst_daemon(tmp_path: Path) -> Iterator[Daemon]:
    with running_daemon(tmp_path / "run" / "s.sock", tmp_path / "daemon.log") as daemon:
        yield daemon


def test_600_clients_connecting_at_once_each_get_their_answer(burst_daemon: Daemon) -> None:
    outcomes = at_once(BURST, ping_with(burst_daemon.socket, timeout=60))
    assert Counter(outcome for outcome, _ in outcomes) == {"ok": BURST}


def test_past_the_connection_cap_clients_wait_for_room_or_say_busy_after_their_timeout(tmp_path: Path) -> None:
    cap = 8
    with running_daemon(tmp_path / "run" / "s.sock", tmp_path / "daemon.log", "--max-connections", str(cap)) as daemon:
        held = [Client(str(daemon.socket), timeout=10) for _ in range(cap)]
        for client in held:
            client.call("ping")
        short = at_once(100, ping_with(daemon.socket, timeout=0.5))
        for outcome, seconds in short:
            assert outcome.startswith(f"Busy: {BUSY_START}it serves its limit of {cap} connections"), outcome
            assert seconds >= 0.45, (outcome, seconds)
        timer = threading.Timer(1.0, lambda: [client.close() for client in held])
        timer.start()
        waited = at_once(200, ping_with(daemon.socket, timeout=30))
        timer.join()
    assert Counter(outcome for outcome, _ in waited) == {"ok": 200}
    assert max(seconds for _, seconds in waited) >= 0.9  # they did wait for the held ones to close


def test_a_full_listen_queue_is_waited_for_then_called_busy(burst_daemon: Daemon) -> None:
    path = burst_daemon.socket
    with queue_full(burst_daemon):
        short = at_once(20, ping_with(path, timeout=0.5))
        for outcome, seconds in short:
            assert outcome.startswith(f"Busy: {BUSY_START}its queue of connections waiting at {path} is full"), outcome
            assert seconds >= 0.45, (outcome, seconds)

        async def async_ping() -> None:
            async with AsyncClient.connect(str(path), connect_timeout=0.5) as client:
                await client.call("ping")

        with pytest.raises(Busy, match=r"its queue of connections waiting at .* is full"):
            trio.run(async_ping)
        waiting: list[list[tuple[str, float]]] = []
        clients = threading.Thread(target=lambda: waiting.append(at_once(50, ping_with(path, timeout=30))))
        clients.start()
        time.sleep(1.0)  # the clients retry while the queue stays full
    clients.join(60)
    assert Counter(outcome for outcome, _ in waiting[0]) == {"ok": 50}

    async def async_after() -> int:
        async with AsyncClient.connect(str(path)) as client:
            return int(client.daemon["pid"])

    assert trio.run(async_after) == burst_daemon.pid


def start_hooks(count: int, repo: Path, env: dict[str, str], budget: float, prefix: str) -> list[subprocess.Popen[bytes]]:
    _, payload = recorded("claude-code")[-1]  # the Stop event: "after turn"
    procs = []
    for n in range(count):
        proc = subprocess.Popen(
            [sys.executable, "-m", "snapshotd", "hook", "claude-code", "--budget", str(budget)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert proc.stdin is not None
        proc.stdin.write(placed(payload, repo, session_id=f"{prefix}-{n}"))
        proc.stdin.close()
        proc.stdin = None  # written whole: communicate() only reads
        procs.append(proc)
    return procs


def finish(procs: list[subprocess.Popen[bytes]]) -> list[tuple[int, str, str]]:
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        results.append((proc.returncode, out.decode(), err.decode()))
    return results


def test_hook_processes_in_a_burst_wait_for_room_or_say_busy(burst_daemon: Daemon, tmp_path: Path) -> None:
    """30 hook processes, not 600: each is a Python start (about 0.2 s of CPU), and 30 take the same path."""
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    path = burst_daemon.socket
    with queue_full(burst_daemon):
        impatient = finish(start_hooks(6, repo, child_env(path, SNAPSHOTD_CONNECT_TIMEOUT="1"), 20, "late"))
        patient = start_hooks(30, repo, child_env(path, SNAPSHOTD_CONNECT_TIMEOUT="60"), 60, "burst")
        time.sleep(2.0)  # they start and find the queue full
    for code, out, err in impatient:
        busy = f"{BUSY_START}its queue of connections waiting at {path} is full"
        assert code == 0, err
        assert err.startswith(f"snapshotd hook: {busy}"), err
        assert out == "" or busy in json.loads(out)["systemMessage"], out  # the user is told at most once
        assert "Errno" not in err + out and "temporarily unavailable" not in err + out
    for code, out, err in finish(patient):
        assert (code, out, err) == (0, "", "")
    env = child_env(path)
    for n in range(30):
        [checkpoint] = cli("list", "--json", "--session", f"burst-{n}", str(repo), env=env).json()["checkpoints"]
        assert checkpoint["label"] == "after turn"
    for n in range(6):
        assert cli("list", "--json", "--session", f"late-{n}", str(repo), env=env).json()["checkpoints"] == []


def test_a_daemon_starting_is_waited_for_and_none_at_all_is_said_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = folder / "s.sock"
    started = time.monotonic()
    with pytest.raises(FileNotFoundError):
        Client(str(path), timeout=5)
    assert time.monotonic() - started < 1  # no lock beside the socket: nobody is starting, nothing to wait for
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600);"
         " fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()", f"{path}.lock"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        [(outcome, seconds)] = at_once(1, ping_with(path, timeout=0.5))
    finally:
        holder.communicate("")
    assert outcome.startswith(f"Busy: {BUSY_START}the daemon at {path} is starting or stopping"), outcome
    assert seconds >= 0.45, seconds
