"""Misbehaving clients and odd files against a real daemon on a real socket.

Nothing a client sends and no file in a worktree may stall the daemon or
make it hold unbounded memory or descriptors; a stop always finishes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import Daemon, child_env, ping, running_daemon, wait_until
from repo_helpers import init_repo, write

from snapshotd.client.rpc import Client
from snapshotd.contract.framing import encode_message
from snapshotd.errors import InvalidParams, NotFound, SnapshotdError

RSS_BOUND_KIB = 300 * 1024
SWAPPER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = (os.fsencode(p) for p in sys.argv[1:3])
while True:
    if libc.renameat2(-100, a, -100, b, 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
        raise OSError(ctypes.get_errno(), "renameat2")
"""


@pytest.fixture
def daemon(sock: Path, tmp_path: Path) -> Iterator[Daemon]:
    with running_daemon(sock, tmp_path / "daemon.log") as running:
        yield running


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LookupError("VmRSS")


def request(method: str, params: dict[str, Any], request_id: int = 1) -> bytes:
    return encode_message({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


@contextlib.contextmanager
def swapping(first: Path, second: Path) -> Iterator[None]:
    """Exchange two names with renameat2(RENAME_EXCHANGE) in a tight loop while the block runs."""
    proc = subprocess.Popen([sys.executable, "-c", SWAPPER, str(first), str(second)])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------
# Odd files: a FIFO swapped with a regular file.


def test_a_fifo_swapped_with_a_file_never_hangs_captures(sock: Path, tmp_path: Path) -> None:
    # Without the watcher: the rename storm is about captures, not about re-watching.
    with running_daemon(sock, tmp_path / "daemon.log", "--no-watch") as daemon:
        _swap_while_capturing(daemon, sock, tmp_path)


def _swap_while_capturing(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repos = []
    for name in ("one", "two"):
        repo = init_repo(tmp_path / name, ("a.txt", "a\n"))
        write(repo / "data.txt", "x" * 100_000)
        os.mkfifo(repo / "pipe")
        repos.append(repo)
    errors: list[BaseException] = []

    def capture(repo: Path) -> None:
        try:
            with Client(str(sock), timeout=30) as client:
                for _ in range(40):
                    stats = client.call("checkpoint", {"path": str(repo), "exact": True})["stats"]
                    assert set(stats["skipped"]) <= {"data.txt", "pipe"}
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    with swapping(repos[0] / "data.txt", repos[0] / "pipe"), swapping(repos[1] / "data.txt", repos[1] / "pipe"):
        threads = [threading.Thread(target=capture, args=(repo,)) for repo in repos]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a capture hung"
    assert errors == []
    for repo in repos:  # the worktree locks were all released
        with Client(str(sock), timeout=30) as client:
            assert client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]
    assert daemon.terminate() == 0


FAN_CLASS_CONTENT = 0x4
FAN_CLOEXEC = 0x1
FAN_MARK_ADD = 0x1
FAN_OPEN_PERM = 0x10000
AT_FDCWD = -100
_EVENT = struct.Struct("IBBHQii")  # struct fanotify_event_metadata


def hold_opens(path: Path) -> int:
    """A fanotify descriptor that holds every open of ``path`` until it is closed.

    A permission event nobody answers is how an open() blocks for good on a
    regular file (as on a stuck network or FUSE mount).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
    fd = libc.fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC, os.O_RDONLY)
    if fd < 0:
        pytest.skip(f"fanotify is not available here (errno {ctypes.get_errno()})")
    if libc.fanotify_mark(fd, FAN_MARK_ADD, FAN_OPEN_PERM, AT_FDCWD, os.fsencode(path)) != 0:
        os.close(fd)
        pytest.skip(f"fanotify permission events are not available here (errno {ctypes.get_errno()})")
    return fd


def test_sigterm_ends_a_daemon_whose_worker_is_stuck_and_removes_the_socket(sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    stuck = write(repo / "stuck.txt", "never read\n")
    with running_daemon(sock, tmp_path / "daemon.log") as daemon:
        holder = hold_opens(stuck)
        try:
            threading.Thread(target=_checkpoint_quietly, args=(sock, repo), daemon=True).start()
            ready, _, _ = select.select([holder], [], [], 60)
            assert ready, "the capture never opened the file"
            event = _EVENT.unpack(os.read(holder, _EVENT.size))  # the daemon's open is now held
            os.close(event[5])
            daemon.proc.send_signal(signal.SIGTERM)
            started = time.monotonic()
            status = daemon.proc.wait(timeout=60)
            assert time.monotonic() - started < 30
            assert status != 0  # it left work behind, and says so
            assert not sock.exists()
            assert "exiting without it" in daemon.log_text()
        finally:
            os.close(holder)  # lets any open still held go on


def _checkpoint_quietly(sock: Path, repo: Path) -> None:
    """A checkpoint whose answer never comes (the daemon stops without it)."""
    with contextlib.suppress(OSError, ConnectionError, SnapshotdError), Client(str(sock), timeout=120) as client:
        client.call("checkpoint", {"path": str(repo)})


# --------------------------------------------------------------------------
# Memory a client controls.


def test_pipelined_big_diffs_without_reading_keep_the_daemon_rss_bounded(
    daemon: Daemon, sock: Path, tmp_path: Path
) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    with Client(str(sock), timeout=60) as client:
        before = client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]
        write(repo / "big.txt", "".join(f"line {n:07d} of a file that makes a big patch\n" for n in range(70_000)))
        after = client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]
        reply = client.call("diff", {"from": before, "to": after, "patch": True})
        assert len(reply["patch"]) > 3_000_000
    line = request("diff", {"from": before, "to": after, "patch": True})
    hogs = []
    for _ in range(4):
        hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        hog.connect(str(sock))
        hog.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            hog.sendall(line * 60)  # as much as the daemon takes; it then stops reading
        hogs.append(hog)
    peak = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        peak = max(peak, vm_rss_kib(daemon.pid))
        time.sleep(0.1)
    assert ping(sock)["pid"] == daemon.pid
    assert peak < RSS_BOUND_KIB, f"the daemon's RSS reached {peak} KiB"
    for hog in hogs:
        hog.close()


def test_diff_patch_over_the_limit_is_too_large_and_pages_by_offset(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    with Client(str(sock), timeout=60) as client:
        before = client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]
        for n in range(5):
            write(repo / f"f{n}.txt", f"file {n}\n" * 200)
        write(repo / "huge.txt", "h" * 50_000 + "\n")
        after = client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]
        whole = client.call("diff", {"from": before, "to": after, "patch": True})
        assert whole["next_offset"] is None
        with pytest.raises(SnapshotdError) as refused:
            client.call("diff", {"from": before, "to": after, "patch": True, "max_patch_bytes": 10_000, "offset": 5})
        assert refused.value.to_dict()["data"]["kind"] == "too_large"
        assert "huge.txt" in refused.value.message and "max_patch_bytes" in refused.value.message
        small = [f"f{n}.txt" for n in range(5)]
        files, patch, offset = [], "", 0
        while offset is not None:
            page = client.call(
                "diff", {"from": before, "to": after, "patch": True, "paths": small, "max_patch_bytes": 3_000, "offset": offset}
            )
            assert page["files"]
            files += page["files"]
            patch += page["patch"]
            offset = page["next_offset"]
        everything = client.call("diff", {"from": before, "to": after, "patch": True, "paths": small})
        assert files == everything["files"] and patch == everything["patch"]
        assert len(files) == 5 and "worktree_tree" not in everything  # neither side is the worktree


def test_pages_of_a_worktree_diff_read_the_tree_the_first_page_captured(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    with Client(str(sock), timeout=60) as client:
        before = client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]
        for n in range(3):
            write(repo / f"f{n}.txt", f"file {n}\n" * 200)
        params = {"from": before, "path": str(repo), "patch": True, "max_patch_bytes": 2_000}
        first = client.call("diff", params)
        captured = client.call("checkpoint", {"path": str(repo)})["checkpoint"]["tree"]
        assert first["worktree_tree"] == captured and first["next_offset"] == 1
        write(repo / "f2.txt", "written between the pages\n")
        rest = client.call("diff", {**params, "offset": 2, "worktree_tree": first["worktree_tree"]})
        assert rest["files"][0]["path"] == "f2.txt" and "+file 2" in rest["patch"] and "written between" not in rest["patch"]
        assert rest["worktree_tree"] == captured
        gone = "0" * len(captured)
        with pytest.raises(NotFound) as refused:
            client.call("diff", {**params, "offset": 1, "worktree_tree": gone})
        assert refused.value.message == (
            f"The worktree's tree {gone} that an earlier page of this diff captured is not in its store; "
            "ask for the diff again from its first page."
        )


# --------------------------------------------------------------------------
# Descriptors a client controls.


def test_connections_beyond_the_cap_are_refused_and_work_still_has_descriptors(sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    log = open(tmp_path / "daemon.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        ["prlimit", "--nofile=256:256", sys.executable, "-m", "snapshotd", "serve", "--socket", str(sock)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=child_env(),
    )
    idle: list[socket.socket] = []
    try:
        wait_until(lambda: sock.exists() and _pings(sock), 15, "the daemon to answer")
        refused = 0
        waiting: list[socket.socket] = []
        for _ in range(400):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(10)
            conn.connect(str(sock))
            waiting.append(conn)
        while waiting:  # a refusal is written at once; what stays quiet 3 s was accepted and served, idle
            readable, _, _ = select.select(waiting, [], [], 3.0)
            if not readable:
                break
            for conn in readable:
                first = conn.recv(4096)
                assert b'"kind":"busy"' in first and b"connections" in first
                refused += 1
                conn.close()
                waiting.remove(conn)
        idle.extend(waiting)
        assert refused >= 150 and len(idle) >= 100
        worker = idle.pop()
        worker.settimeout(60)
        worker.sendall(request("checkpoint", {"path": str(repo)}))
        answer = worker.recv(65536)
        assert b'"result"' in answer and b'"checkpoint"' in answer, answer
        worker.close()
        time.sleep(0.2)
        with Client(str(sock), timeout=60) as client:  # a slot freed: a new connection is served
            assert client.call("checkpoint", {"path": str(repo), "label": "after"})["checkpoint"]["label"] == "after"
    finally:
        for conn in idle:
            conn.close()
        proc.kill()
        proc.wait()
        log.close()


def _pings(sock: Path) -> bool:
    try:
        return bool(ping(sock, timeout=2))
    except (OSError, ConnectionError):
        return False


# --------------------------------------------------------------------------
# Bad params are invalid params, never internal errors.


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("checkpoint", {"path": "{repo}\0x"}),
        ("checkpoint", {"path": "{repo}/\ud800"}),
        ("checkpoint", {"path": "{repo}", "session": "s\udfff"}),
        ("checkpoint", {"path": "{repo}", "label": "before \ud800 turn"}),
        ("checkpoint", {"path": "{repo}", "label": "nul\0label"}),
        ("list", {"path": "{repo}", "session": "a\0b"}),
        ("gc", {"path": "{repo}", "older_than_s": 2**63}),
        ("repair", {"path": "/" + "r" * 5000}),
        ("open", {"path": "/" + "d/" * 3000}),
        ("diff", {"from": "worktree", "path": "{repo}", "paths": ["p" * 5000]}),
        ("diff", {"from": "worktree", "path": "{repo}", "patch": True, "context": 2**40}),
        ("diff", {"from": "worktree", "path": "{repo}", "patch": True, "max_patch_bytes": 0}),
        ("diff", {"from": "worktree", "path": "{repo}", "worktree_tree": "HEAD"}),
        ("diff", {"from": "worktree", "path": "{repo}", "worktree_tree": 7}),
    ],
)
def test_odd_params_are_invalid_params(daemon: Daemon, sock: Path, tmp_path: Path, method: str, params: dict) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    filled = {k: v.replace("{repo}", str(repo)) if isinstance(v, str) else v for k, v in params.items()}
    with Client(str(sock), timeout=60) as client:
        with pytest.raises(InvalidParams) as refused:
            client.call(method, filled)
        assert "failed unexpectedly" not in refused.value.message
        assert client.call("ping")["pid"] == daemon.pid
    assert "Traceback" not in daemon.log_text()
