"""The launcher of client/launcher.py, called directly: finding a daemon, starting one, stopping it.

Real sockets and real processes: the daemon a call starts is a real
``snapshotd serve`` in the background, and the lock another daemon holds is
held by another process.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import answers, process_gone, running_daemon, wait_until

import snapshotd
from snapshotd.client import launcher
from snapshotd.client.dialing import daemon_starting
from snapshotd.client.launcher import Runner
from snapshotd.errors import InvalidParams


@pytest.fixture
def started(sock: Path) -> Iterator[list[int]]:
    """Pids of daemons a test started through the launcher; any still running is killed at the end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if not process_gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_call_with_no_daemon_starts_one_and_the_next_call_finds_it(sock: Path, started: list[int]) -> None:
    assert launcher._connect(str(sock)) is None
    first = Runner(str(sock), embedded=False, json_output=True).call("ping", {})
    started.append(first["pid"])
    assert answers(sock)
    assert launcher._listener_pid(str(sock)) == first["pid"]
    log = sock.parent / "snapshotd.log"
    assert stat.S_IMODE(os.lstat(log).st_mode) == 0o600
    again = Runner(str(sock), embedded=False, json_output=True).call("ping", {})
    assert again["pid"] == first["pid"]


def test_a_daemon_started_while_another_answers_is_ended_so_none_takes_the_path_later(
    sock: Path, tmp_path: Path
) -> None:
    """A start race's loser that binds after the winner stops would serve no one: the starter ends it."""
    with running_daemon(sock, tmp_path / "winner.log") as winner:
        client = launcher._start_and_connect(str(sock))
        spare = launcher._STARTED[-1]
        try:
            with client:
                assert client.call("ping")["pid"] == winner.pid != spare.pid
            winner.terminate()  # before the spare, still starting, could have taken the lock
            spare.wait(timeout=20)
        finally:
            if spare.poll() is None:
                spare.kill()
    assert not answers(sock)


def test_shutdown_returns_once_the_daemon_is_gone_and_finds_none_the_second_time(
    sock: Path, started: list[int]
) -> None:
    pid = Runner(str(sock), embedded=False, json_output=True).call("ping", {})["pid"]
    started.append(pid)
    runner = Runner(str(sock), embedded=False, json_output=True)
    runner.call("shutdown", {})
    assert runner.daemon_was_running
    assert process_gone(pid) and not sock.exists()
    second = Runner(str(sock), embedded=False, json_output=True)
    assert second.call("shutdown", {}) == {}
    assert not second.daemon_was_running
    assert not sock.exists()  # stopping a daemon that is not there starts none


def test_a_lock_held_by_another_process_means_a_daemon_is_starting(sock: Path) -> None:
    sock.parent.mkdir(mode=0o700)
    assert not daemon_starting(str(sock))  # no lock file at all
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
         " fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()", f"{sock}.lock"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert daemon_starting(str(sock))
    finally:
        holder.communicate("")
    wait_until(lambda: not daemon_starting(str(sock)), 10, "the lock to be released")


def test_a_daemon_started_from_a_checkout_is_pointed_back_at_the_package() -> None:
    # `python -m snapshotd` run in the folder holding the package finds it only
    # there; the daemon runs from `/`, so its PYTHONPATH must lead back.
    checkout = Path(snapshotd.__file__).resolve().parent.parent
    code = "import snapshotd.client.launcher as l; print(l.daemon_environment().get('PYTHONPATH', ''))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=checkout, capture_output=True, text=True, check=True)
    first = proc.stdout.strip().split(os.pathsep)[0]
    assert first == str(checkout), proc
    assert (Path(first) / "snapshotd" / "__init__.py").is_file()


def test_a_relative_home_is_made_absolute_for_the_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SNAPSHOTD_HOME", "state")
    assert launcher.daemon_environment()["SNAPSHOTD_HOME"] == str(tmp_path / "state")


def test_a_socket_path_naming_a_file_is_refused_and_nothing_is_written_beside_it(sock: Path) -> None:
    sock.parent.mkdir(mode=0o700)
    sock.write_text("a file of the user's\n")
    before = sorted(p.name for p in sock.parent.iterdir())
    with pytest.raises(InvalidParams, match="exists and is not a socket"):
        Runner(str(sock), embedded=False, json_output=True).call("ping", {})
    assert sorted(p.name for p in sock.parent.iterdir()) == before  # no snapshotd.log, no lock
    assert sock.read_text() == "a file of the user's\n"
