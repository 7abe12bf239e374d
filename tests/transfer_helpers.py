"""Remotes and "machines" for the push and fetch tests: a real git daemon, clones with daemons of their own."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import CliResult, Daemon, call, child_env, cli, log_problems, start_daemon
from repo_helpers import git

START_TIMEOUT_S = 15.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def git_daemon(base: Path) -> Iterator[str]:
    """``git daemon --enable=receive-pack`` serving the bare repositories under ``base``; yields its URL."""
    exec_path = subprocess.run(["git", "--exec-path"], capture_output=True, text=True, check=True).stdout.strip()
    if not os.access(os.path.join(exec_path, "git-daemon"), os.X_OK):
        pytest.skip(f"git daemon is not installed in {exec_path} (Debian: the git package has it; some builds leave it out)")
    log = base.parent / f"{base.name}-git-daemon.log"
    for _attempt in range(5):
        port = free_port()
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["git", "daemon", "--reuseaddr", "--listen=127.0.0.1", f"--port={port}", f"--base-path={base}",
                 "--export-all", "--enable=receive-pack", "--informative-errors", str(base)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=child_env(),
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while proc.poll() is None and not _listening(port) and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is None and _listening(port):
            break
        proc.kill()
        proc.wait()
    else:
        raise AssertionError(f"git daemon did not start:\n{log.read_text()}")
    try:
        yield f"git://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def remote_refs(url: str, cwd: Path) -> dict[str, str]:
    """``git ls-remote``: every ref of the remote and its id."""
    refs = {}
    for line in git(cwd, "ls-remote", url).splitlines():
        oid, _, name = line.partition("\t")
        refs[name] = oid
    return refs


@dataclass
class Machine:
    """A clone with its own SNAPSHOTD_HOME and its own daemon on its own socket."""

    name: str
    repo: Path
    home: Path
    daemon: Daemon

    @property
    def env(self) -> dict[str, str]:
        return {"SNAPSHOTD_SOCKET": str(self.daemon.socket), "SNAPSHOTD_HOME": str(self.home)}

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        params.setdefault("path", str(self.repo))
        return call(self.daemon.socket, method, params)

    def cli(self, *args: str, code: int | None = 0) -> CliResult:
        return cli(*args, cwd=self.repo, env=self.env, code=code)

    def local_refs(self) -> dict[str, str]:
        out = git(self.repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/snapshotd/")
        return dict(line.split(" ") for line in out.splitlines())


@contextmanager
def machine(folder: Path, name: str, url: str) -> Iterator[Machine]:
    """A clone of ``url`` at ``folder``/``name`` and a daemon for it; its log must show no error at the end."""
    repo = folder / name
    git(folder, "clone", "-q", url, str(repo))
    home = folder / f"{name}-home"
    daemon = start_daemon(folder / f"{name}-run" / "s.sock", folder / f"{name}.log", env=child_env(SNAPSHOTD_HOME=str(home), SNAPSHOTD_HOST=f"machine-{name}"))
    try:
        yield Machine(name, repo, home, daemon)
        problems = log_problems(daemon.log_text())
    finally:
        daemon.kill()
    assert not problems, daemon.log_text()
