"""The daemon as a real process: start-up, shutdown, crashes, load and misbehaving clients."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from daemon_helpers import (
    Daemon,
    answers,
    assert_one_error_line,
    call,
    child_env,
    cli_many,
    cli_process,
    log_problems,
    ping,
    running_daemon,
    start_daemon,
    wait_until,
)
from oracle import oracle_tree
from repo_helpers import git, init_repo, load_fixture, write

from snapshotd.client.rpc import AsyncClient
from snapshotd.errors import NotFound

SESSIONS = 6
PER_SESSION = 4


@pytest.fixture
def daemon(sock: Path, tmp_path: Path) -> Iterator[Daemon]:
    with running_daemon(sock, tmp_path / "daemon.log") as running:
        yield running


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(
        tmp_path / "repo",
        ("a.txt", "alpha\n"),
        ("src/b.py", "print('b')\n"),
        (".gitignore", "*.log\n"),
    )


def request_line(method: str, params: dict[str, Any], request_id: int = 1) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return json.dumps(message).encode() + b"\n"


# --------------------------------------------------------------------------
# Start-up and shutdown.


def test_serve_listens_privately_answers_ping_and_stops_on_sigterm(daemon: Daemon, sock: Path) -> None:
    folder = sock.parent
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    info = os.lstat(sock)
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600

    result = ping(sock)
    assert result["pid"] == daemon.pid
    assert isinstance(result["version"], str) and result["uptime_s"] >= 0

    assert daemon.terminate() == 0, daemon.log_text()
    assert not sock.exists(), "the socket file outlived the daemon"
    assert not answers(sock)
    assert "stopping on SIGTERM" in daemon.log_text()
    assert not log_problems(daemon.log_text()), daemon.log_text()


def test_stop_command_shuts_the_daemon_down(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    result = cli_process("--socket", sock, "stop", "--json")
    assert result.json() == {"stopped": True, "socket": str(sock)}
    # `stop` returns once the daemon no longer listens.
    assert not answers(sock)
    assert cli_process("--socket", sock, "stop", "--json").json() == {"stopped": False, "socket": str(sock)}
    assert daemon.wait() == 0, daemon.log_text()
    assert not sock.exists()
    assert not log_problems(daemon.log_text()), daemon.log_text()

    again = cli_process("--socket", sock, "stop")
    assert again.stdout.strip() == f"no daemon was running on {sock}"
    assert not sock.exists(), "stop must not start a daemon"


def test_kill_9_then_restart_replaces_the_stale_socket_and_keeps_checkpoints(
    daemon: Daemon, sock: Path, repo: Path, tmp_path: Path
) -> None:
    first = call(sock, "checkpoint", {"path": str(repo), "session": "s1", "label": "before crash"})
    worktree_id = first["checkpoint"]["worktree"]

    os.kill(daemon.pid, signal.SIGKILL)
    assert daemon.wait() == -signal.SIGKILL
    assert stat.S_ISSOCK(os.lstat(sock).st_mode), "a killed daemon leaves its socket file"
    assert not answers(sock)

    with running_daemon(sock, tmp_path / "daemon2.log") as second:
        assert ping(sock)["pid"] == second.pid
        assert "removing stale socket" in second.log_text()
        listed = call(sock, "list", {"path": str(repo)})["checkpoints"]
        assert [cp["id"] for cp in listed] == [first["checkpoint"]["id"]]
        assert listed[0]["worktree"] == worktree_id
        assert listed[0]["label"] == "before crash"
        assert call(sock, "open", {"path": str(repo)})["worktree"]["id"] == worktree_id
        assert call(sock, "list", {"worktree": worktree_id})["checkpoints"] == listed
        assert second.terminate() == 0


def test_second_serve_on_a_live_socket_fails_with_one_sentence(daemon: Daemon, sock: Path) -> None:
    before = os.lstat(sock)
    result = cli_process("serve", "--socket", sock, code=1)
    line = assert_one_error_line(result, "already serving", str(sock))
    assert line.endswith("."), line
    after = os.lstat(sock)
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
    assert ping(sock)["pid"] == daemon.pid


def test_serve_refuses_bad_socket_places_without_a_traceback(tmp_path: Path) -> None:
    a_file = write(tmp_path / "plain-file", "x")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    not_a_folder, in_the_way, unsafe, too_long = cli_many(
        [
            ["serve", "--socket", a_file / "s.sock"],
            ["serve", "--socket", a_file],
            ["serve", "--socket", shared / "s.sock"],
            ["serve", "--socket", tmp_path / ("x" * 120) / "s.sock"],
        ]
    )
    assert_one_error_line(not_a_folder, "not a folder")
    assert_one_error_line(in_the_way, "not a socket")
    assert a_file.read_text() == "x"
    assert_one_error_line(unsafe, "other users may write")
    assert not (shared / "s.sock").exists()
    assert_one_error_line(too_long, "too long")


# --------------------------------------------------------------------------
# Many clients at once.


async def test_24_concurrent_checkpoints_pipelined_and_over_6_connections(
    daemon: Daemon, sock: Path, repo: Path
) -> None:
    path = str(repo)
    want_tree = oracle_tree(repo)

    async def one(client: AsyncClient, session: str, results: list[dict]) -> None:
        results.append(await client.call("checkpoint", path=path, session=session))

    pipelined: list[dict] = []
    with trio.fail_after(60):
        async with AsyncClient.connect(str(sock)) as client, trio.open_nursery() as nursery:
            for round_ in range(PER_SESSION):
                for s in range(SESSIONS):
                    nursery.start_soon(one, client, f"pipe{s}", pipelined, name=f"{s}/{round_}")

    spread: list[dict] = []

    async def connection(s: int) -> None:
        async with AsyncClient.connect(str(sock)) as client, trio.open_nursery() as nursery:
            for _ in range(PER_SESSION):
                nursery.start_soon(one, client, f"conn{s}", spread)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for s in range(SESSIONS):
                nursery.start_soon(connection, s)

    for results, prefix in ((pipelined, "pipe"), (spread, "conn")):
        assert len(results) == SESSIONS * PER_SESSION
        ids = {r["checkpoint"]["id"] for r in results}
        assert len(ids) == SESSIONS * PER_SESSION, "two checkpoints got the same id"
        assert {r["checkpoint"]["tree"] for r in results} == {want_tree}
        async with AsyncClient.connect(str(sock)) as client:
            listed = (await client.call("list", path=path))["checkpoints"]
            listed_ids = {cp["id"] for cp in listed}
            assert ids <= listed_ids, f"lost checkpoints: {sorted(ids - listed_ids)}"
            for s in range(SESSIONS):
                session = f"{prefix}{s}"
                chain = (await client.call("list", path=path, session=session))["checkpoints"]
                assert [cp["seq"] for cp in chain] == [4, 3, 2, 1], session
                for newer, older in itertools.pairwise(chain):
                    assert newer["parent"] == older["id"], f"{session}: broken parent chain"
                assert {cp["id"] for cp in chain} == {
                    r["checkpoint"]["id"] for r in results if r["checkpoint"]["session"] == session
                }
    assert ping(sock)["pid"] == daemon.pid
    assert not log_problems(daemon.log_text()), daemon.log_text()


# --------------------------------------------------------------------------
# Subscriptions.


async def _watching(client: AsyncClient, repo: Path) -> str:
    """Wait until the daemon's watch of ``repo`` is live (slow on a busy machine); its id."""
    with trio.fail_after(30):
        while True:
            worktree = (await client.call("open", path=str(repo)))["worktree"]
            if worktree["watching"]:
                return worktree["id"]
            await trio.sleep(0.1)


@pytest.mark.needs("inotify")
async def test_subscribe_notifies_changes_and_ends_with_the_connection(
    daemon: Daemon, sock: Path, repo: Path
) -> None:
    async with AsyncClient.connect(str(sock)) as client:
        subscription = (await client.call("subscribe", path=str(repo)))["subscription"]
        worktree_id = await _watching(client, repo)
        write(repo / "src" / "fresh.txt", "new content\n")
        seen: list[dict] = []
        with trio.fail_after(10):
            async for note in client.notifications():
                seen.append(note)
                params = note["params"]
                if note["method"] == "changed" and "src/fresh.txt" in params["paths"]:
                    break
        assert params["subscription"] == subscription
        assert params["worktree"] == worktree_id
        assert isinstance(params["overflow"], bool)
        assert client.dropped_notifications == 0

    # The connection is closed: its subscription goes with it.
    await trio.sleep(0.3)
    async with AsyncClient.connect(str(sock)) as client:
        with pytest.raises(NotFound):
            await client.call("unsubscribe", subscription=subscription)
        write(repo / "after-close.txt", "nobody listens\n")
        await trio.sleep(0.3)
        status = await client.call("status")
        assert [wt["id"] for wt in status["worktrees"]] == [worktree_id]
        assert status["worktrees"][0]["watching"] is True
        listed = await client.call("worktrees")
        assert [wt["path"] for wt in listed["worktrees"]] == [str(repo)]
        assert (await client.call("checkpoint", path=str(repo)))["checkpoint"]["tree"] == oracle_tree(repo)
    assert not log_problems(daemon.log_text()), daemon.log_text()


@pytest.mark.needs("inotify")
async def test_one_new_file_is_not_reported_as_overflow(daemon: Daemon, sock: Path, repo: Path) -> None:
    async with AsyncClient.connect(str(sock)) as client:
        await client.call("subscribe", path=str(repo))
        await _watching(client, repo)
        write(repo / "one.txt", "1\n")
        with trio.fail_after(10):
            async for note in client.notifications():
                if "one.txt" in note["params"]["paths"]:
                    break
        assert note["params"]["overflow"] is False


async def test_a_subscription_with_checkpoints_hears_each_checkpoint_and_safety_checkpoint(
    daemon: Daemon, sock: Path, repo: Path
) -> None:
    async with AsyncClient.connect(str(sock)) as client, AsyncClient.connect(str(sock)) as plain:
        subscription = (await client.call("subscribe", path=str(repo), checkpoints=True))["subscription"]
        await plain.call("subscribe", path=str(repo))
        first = (await client.call("checkpoint", path=str(repo), session="s1", label="one"))["checkpoint"]
        write(repo / "later.txt", "later\n")
        second = (await client.call("checkpoint", path=str(repo), session="s1"))["checkpoint"]
        safety = (await client.call("restore", checkpoint=first["id"]))["safety_checkpoint"]
        heard: list[dict] = []
        with trio.fail_after(10):
            async for note in client.notifications():
                if note["method"] == "checkpoint":
                    heard.append(note["params"])
                if len(heard) == 3:
                    break
        assert [n["checkpoint"]["id"] for n in heard] == [first["id"], second["id"], safety["id"]]
        assert {n["subscription"] for n in heard} == {subscription}
        assert heard[2]["checkpoint"]["session"] == "snapshotd:safety"
        await trio.sleep(0.3)
        methods = set()
        while True:
            try:
                methods.add(plain.notifications().receive_nowait()["method"])
            except trio.WouldBlock:
                break
        assert "checkpoint" not in methods  # only those who ask hear of checkpoints


# --------------------------------------------------------------------------
# Load and misbehaving clients.


def _synthetic(dest: Path, files: int, seed: int = 7) -> Path:
    make = load_fixture("make_synthetic").make_synthetic
    made = make(dest, files, seed=seed, commit=False)
    return Path(made.worktree)


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


@pytest.mark.slow
async def test_ping_is_answered_while_4_clients_capture_5000_files(
    daemon: Daemon, sock: Path, tmp_path: Path
) -> None:
    big = _synthetic(tmp_path / "big", 5000)
    latencies: list[float] = []
    captures: list[dict] = []
    failures: list[BaseException] = []
    pings_done = trio.Event()

    async def capturer(index: int) -> None:
        async with AsyncClient.connect(str(sock)) as client:
            first = True
            while first or not pings_done.is_set():
                first = False
                try:
                    captures.append(
                        await client.call(
                            "checkpoint", path=str(big), session=f"load{index}", exact=True
                        )
                    )
                except Exception as exc:
                    failures.append(exc)
                    return

    async def pinger() -> None:
        try:
            async with AsyncClient.connect(str(sock)) as client:
                for _ in range(50):
                    started = time.perf_counter()
                    try:
                        result = await client.call("ping")
                    except Exception as exc:
                        failures.append(exc)
                        continue
                    latencies.append(time.perf_counter() - started)
                    assert result["pid"] == daemon.pid
                    await trio.sleep(0.02)
        finally:
            pings_done.set()

    with trio.fail_after(80):
        async with trio.open_nursery() as nursery:
            for index in range(4):
                nursery.start_soon(capturer, index)
            await trio.sleep(0.05)  # the first captures are under way
            nursery.start_soon(pinger)

    p99_ms = _p99(latencies) * 1000 if latencies else float("nan")
    report = (
        f"ping p99 {p99_ms:.1f} ms, max {max(latencies, default=0) * 1000:.1f} ms over "
        f"{len(latencies)} pings during {len(captures)} captures of 5000 files"
    )
    print(report)  # shown with -s or -rP
    assert not failures, f"{report}; failures: {failures!r}"
    assert len(latencies) == 50, report
    assert len(captures) >= 4, report
    want = oracle_tree(big)
    assert {c["checkpoint"]["tree"] for c in captures} == {want}, report
    assert all(c["stats"]["scan"] == "full" for c in captures), report
    assert not log_problems(daemon.log_text()), daemon.log_text()


def test_client_that_hangs_up_mid_request_leaves_the_daemon_healthy(
    daemon: Daemon, sock: Path, tmp_path: Path
) -> None:
    worktree = _synthetic(tmp_path / "wt", 2000, seed=3)
    git(worktree, "add", "-A")  # tracked and untracked files both go through a temp index
    write(worktree / "extra" / "untracked.txt", "u\n")
    tmp_dir = worktree / ".git" / "snapshotd" / "tmp"

    for delay in (0.0, 0.001, 0.01, 0.03, 0.1):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(sock))
        conn.sendall(request_line("checkpoint", {"path": str(worktree), "exact": True, "session": "gone"}))
        time.sleep(delay)
        conn.close()

    result = call(sock, "checkpoint", {"path": str(worktree), "session": "after", "exact": True})
    assert result["checkpoint"]["tree"] == oracle_tree(worktree)
    assert ping(sock)["pid"] == daemon.pid

    def no_temp_index() -> bool:
        return not [p.name for p in tmp_dir.iterdir() if p.name.startswith("index-")]

    wait_until(no_temp_index, 10, f"the temp indexes in {tmp_dir} to go: {sorted(os.listdir(tmp_dir))}")
    listed = call(sock, "list", {"path": str(worktree), "session": "after"})["checkpoints"]
    assert [cp["id"] for cp in listed] == [result["checkpoint"]["id"]]
    assert not log_problems(daemon.log_text()), daemon.log_text()


def test_sigterm_during_a_capture_still_exits_cleanly(sock: Path, tmp_path: Path) -> None:
    worktree = _synthetic(tmp_path / "wt", 2000, seed=5)
    daemon = start_daemon(sock, tmp_path / "daemon.log")
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(sock))
        conn.sendall(request_line("checkpoint", {"path": str(worktree), "exact": True}))
        time.sleep(0.05)
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.wait() == 0, daemon.log_text()
        conn.close()
        assert not sock.exists()
        tmp_dir = worktree / ".git" / "snapshotd" / "tmp"
        leftovers = [p.name for p in tmp_dir.iterdir() if p.name.startswith("index-")] if tmp_dir.exists() else []
        assert not leftovers, leftovers
        assert not log_problems(daemon.log_text()), daemon.log_text()
    finally:
        daemon.kill()


# --------------------------------------------------------------------------
# systemd socket activation and the user units.

ROOT = Path(__file__).resolve().parents[1]


def test_socket_activation_serves_the_inherited_socket_and_stop_leaves_it(
    tmp_path: Path, repo: Path
) -> None:
    """What systemd does: it owns and keeps the listening socket; the daemon gets it as fd 3."""
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = folder / "s.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(16)
    log = tmp_path / "activated.log"
    # Put the socket at fd 3, name this pid in LISTEN_PID, then become the daemon (same pid).
    script = (
        "import os, sys; os.dup2(int(sys.argv[1]), 3); "
        "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1'); "
        "os.execv(sys.executable, [sys.executable, '-m', 'snapshotd', 'serve'])"
    )
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", script, str(listener.fileno())],
                pass_fds=(listener.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(),
            )
        daemon = Daemon(proc, path, log)
        try:
            wait_until(lambda: _answers_ping(path, proc.pid), 15, "the activated daemon to answer")
            cp = call(path, "checkpoint", {"path": str(repo)})["checkpoint"]
            assert cp["tree"] == oracle_tree(repo)

            started = time.monotonic()
            assert cli_process("--socket", path, "stop", "--json").json()["stopped"] is True
            assert daemon.wait() == 0, daemon.log_text()
            assert time.monotonic() - started < 8, "stop waited for a socket systemd keeps"
            # The socket belongs to systemd (here: the test): still there, still listening.
            assert stat.S_ISSOCK(os.lstat(path).st_mode)
            assert not log_problems(daemon.log_text()), daemon.log_text()
        finally:
            daemon.kill()
    finally:
        listener.close()


def _answers_ping(path: Path, pid: int) -> bool:
    try:
        return ping(path, timeout=2)["pid"] == pid
    except (OSError, ConnectionError):
        return False


def _unit(name: str) -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for raw in (ROOT / "systemd" / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        else:
            key, _, value = line.partition("=")
            current[key.strip()] = value.strip()
    return sections


def test_systemd_user_units() -> None:
    sock_unit = _unit("snapshotd.socket")
    assert sock_unit["Socket"]["ListenStream"] == "%t/snapshotd/snapshotd.sock"
    assert sock_unit["Socket"]["SocketMode"] == "0600"
    assert sock_unit["Socket"]["DirectoryMode"] == "0700"
    assert sock_unit["Socket"].get("Accept", "no") == "no"
    service = _unit("snapshotd.service")
    exec_start = service["Service"]["ExecStart"].split()
    assert exec_start[-2:] == ["snapshotd", "serve"] and "--socket" not in exec_start
    assert service["Unit"]["Requires"] == "snapshotd.socket"
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        proc = subprocess.run(
            [analyze, "--man=no", "verify", "snapshotd.socket", "snapshotd.service"],
            cwd=ROOT / "systemd",
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr


def test_stop_of_a_daemon_that_stopped_answering_says_so_in_bounded_time(daemon: Daemon, sock: Path) -> None:
    os.kill(daemon.pid, signal.SIGSTOP)  # a `snapshotd serve` stopped by Ctrl-Z: it accepts, and answers nothing
    try:
        started = time.monotonic()
        result = cli_process("--socket", sock, "stop", env=child_env(sock, SNAPSHOTD_CONNECT_TIMEOUT="2"), code=1)
        assert time.monotonic() - started < 15
        # With SO_PEERCRED and /proc the listener is named, found stopped, and how to let it go on is said.
        found_stopped = f"(pid {daemon.pid}) is stopped (Ctrl-Z or SIGSTOP) and cannot answer" in result.stderr
        assert found_stopped or "accepts connections but did not answer within 2 s" in result.stderr, result
        assert f"kill -CONT {daemon.pid}" in result.stderr or "(pid" not in result.stderr, result
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    assert cli_process("--socket", sock, "stop", "--json").json()["stopped"] is True


@pytest.mark.needs("peercred", "proc")
def test_a_command_waiting_on_a_daemon_stopped_by_ctrl_z_says_so_and_how_to_resume_it(
    daemon: Daemon, sock: Path, tmp_path: Path
) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    cli_process("--socket", sock, "checkpoint", repo)
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        for command in (("status",), ("list", repo), ("checkpoint", repo)):
            started = time.monotonic()
            result = cli_process("--socket", sock, *command, code=1)
            assert time.monotonic() - started < 15, command  # not the 30 s of a busy daemon's connect, nor forever
            assert result.stderr.strip() == (
                f"error: The daemon on {sock} (pid {daemon.pid}) is stopped (Ctrl-Z or SIGSTOP) and cannot answer; "
                f"resume it with `kill -CONT {daemon.pid}`."
            ), result
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    assert len(cli_process("--socket", sock, "list", "--json", repo).json()["checkpoints"]) == 1  # nothing was recorded
