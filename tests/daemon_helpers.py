"""Real daemon processes and real command-line runs for the daemon and CLI tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from snapshotd.cli.main import main as cli_main
from snapshotd.client.rpc import Client
from snapshotd.fsutil import pid_alive

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 15.0
CLI_TIMEOUT_S = 60.0


def child_env(socket_path: str | Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment (isolated by conftest) with the socket set."""
    env = dict(os.environ)
    env.pop("SNAPSHOTD_SOCKET", None)
    if socket_path is not None:
        env["SNAPSHOTD_SOCKET"] = str(socket_path)
    env.update(extra)
    return env


def answers(path: str | Path) -> bool:
    """Whether something accepts connections on the socket ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2)
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def ping(path: str | Path, timeout: float = 10) -> dict[str, Any]:
    with Client(str(path), timeout=timeout) as client:
        return client.call("ping")


def call(path: str | Path, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    with Client(str(path), timeout=60) as client:
        return client.call(method, params or {})


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting to be reaped counts as gone)."""
    return not pid_alive(pid)


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Daemon:
    """A ``snapshotd serve`` subprocess started by a test."""

    proc: subprocess.Popen[bytes]
    socket: Path
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> int:
        return self.proc.wait(timeout=timeout)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=STOP_TIMEOUT_S)


def start_daemon(
    socket_path: str | Path,
    log: str | Path,
    *extra_args: str,
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> Daemon:
    """Run ``python -m snapshotd serve --socket PATH`` and wait until it answers ``ping``."""
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "snapshotd", "serve", "--socket", str(socket_path), *extra_args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env if env is not None else child_env(),
        )
    daemon = Daemon(proc, Path(socket_path), log)
    if wait:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"the daemon exited with {proc.returncode} at start:\n{daemon.log_text()}"
                )
            if answers(socket_path):
                try:
                    if ping(socket_path)["pid"] == proc.pid:
                        break
                except (OSError, ConnectionError):
                    pass
            if time.monotonic() > deadline:
                daemon.kill()
                raise AssertionError(f"the daemon did not answer in time:\n{daemon.log_text()}")
            time.sleep(0.02)
    return daemon


@contextmanager
def running_daemon(socket_path: str | Path, log: str | Path, *extra_args: str) -> Iterator[Daemon]:
    """A daemon for the block; killed at the end if the test did not stop it."""
    daemon = start_daemon(socket_path, log, *extra_args)
    try:
        yield daemon
    finally:
        daemon.kill()


@contextmanager
def quiet_daemon(folder: Path) -> Iterator[Daemon]:
    """A daemon on ``folder``/run/s.sock for the block, whose log must show no error at the end."""
    with running_daemon(folder / "run" / "s.sock", folder / "daemon.log") as running:
        yield running
        problems = log_problems(running.log_text())
    assert not problems, running.log_text()


@dataclass
class CliResult:
    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"snapshotd {' '.join(self.args)} printed no JSON: {self}") from exc

    def __str__(self) -> str:
        return (
            f"exit {self.code}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"
        )


def _command(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "snapshotd", *map(str, args)]


def cli_process(
    *args: str | Path,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    code: int | None = 0,
) -> CliResult:
    """Run ``python -m snapshotd ARGS`` as a process; check the exit status unless ``code`` is None.

    Output is decoded as UTF-8 with surrogate escapes, so a file name that is
    not UTF-8 comes back as ``os.fsdecode`` would give it.
    """
    proc = subprocess.run(
        _command([str(a) for a in args]),
        cwd=cwd,
        env=env if env is not None else child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        encoding="utf-8",
        errors="surrogateescape",
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    result = CliResult(tuple(str(a) for a in args), proc.returncode, proc.stdout, proc.stderr)
    if code is not None:
        assert result.code == code, f"snapshotd {' '.join(result.args)}: expected exit {code}, {result}"
    return result


def cli(
    *args: str | Path,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    code: int | None = 0,
) -> CliResult:
    """Run the command line in this process (click's runner), from ``cwd``.

    The same code as ``snapshotd ARGS`` against the same daemon, without the
    start-up cost of a new interpreter. ``env`` entries override this
    process's environment for the call.
    """
    runner = CliRunner()
    str_args = [str(a) for a in args]
    overrides = {k: v for k, v in (env or {}).items() if os.environ.get(k) != v}
    with contextlib.chdir(cwd or os.getcwd()):
        outcome = runner.invoke(cli_main, str_args, env=overrides, catch_exceptions=False, prog_name="snapshotd")
    result = CliResult(tuple(str_args), outcome.exit_code, outcome.stdout, outcome.stderr)
    if code is not None:
        assert result.code == code, f"snapshotd {' '.join(result.args)}: expected exit {code}, {result}"
    return result


def cli_many(
    runs: Sequence[Sequence[str | Path]],
    *,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
) -> list[CliResult]:
    """Run several independent ``python -m snapshotd`` processes at once; results in order."""
    procs = [
        subprocess.Popen(
            _command([str(a) for a in args]),
            cwd=cwd,
            env=env if env is not None else child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="surrogateescape",
        )
        for args in runs
    ]
    results = []
    for args, proc in zip(runs, procs, strict=True):
        out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
        results.append(CliResult(tuple(str(a) for a in args), proc.returncode, out, err))
    return results


def assert_one_error_line(result: CliResult, *fragments: str) -> str:
    """The command failed with exit 1 and exactly one ``error: ...`` line on stderr."""
    assert result.code == 1, str(result)
    assert result.stdout == "", str(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), str(result)
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], str(result)
    return lines[0]


def assert_json_error(result: CliResult, *, kind: str | None = None, code: int | None = None) -> dict:
    """The command failed with exit 1 and printed ``{"error": {...}}``."""
    assert result.code == 1, str(result)
    body = result.json()
    assert set(body) == {"error"}, str(result)
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"], str(result)
    if kind is not None:
        assert error.get("data", {}).get("kind") == kind, str(result)
    if code is not None:
        assert error["code"] == code, str(result)
    return error


def log_problems(text: str) -> list[str]:
    """Lines of a daemon log that report an error."""
    bad = ("ERROR", "CRITICAL", "Traceback", "Exception")
    return [line for line in text.splitlines() if any(word in line for word in bad)]
