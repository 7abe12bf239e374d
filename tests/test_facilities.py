"""Without inotify, SO_PEERCRED, syncfs or /proc the daemon works (cold), and says so once.

Each facility is switched off by ``SNAPSHOTD_DISABLE`` (the path macOS, the
BSDs or a strict container take), and two fail for real, injected: inotify_init1
and syncfs saying ENOSYS, as under a seccomp profile, take the same path.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pygit2
import pytest
from daemon_helpers import child_env, cli, cli_process, start_daemon
from oracle import oracle_tree
from repo_helpers import git, init_repo, write

from snapshotd import facilities
from snapshotd.capture import inotify as inotify_mod
from snapshotd.engine.core import Engine
from snapshotd.git import flush, loose
from snapshotd.settings import FACILITIES, check_disabled, disabled_facilities

ALL_OFF = "inotify,peercred,syncfs,proc"


@pytest.fixture
def fresh_facilities(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Facilities looked for afresh in this process, and libgit2's fsync put back after."""
    monkeypatch.delenv("SNAPSHOTD_DISABLE", raising=False)
    facilities.forget()
    try:
        yield
    finally:
        facilities.forget()
        if loose._libgit2_fsyncs:
            pygit2.settings.enable_fsync_gitdir(False)
            loose._libgit2_fsyncs = False


class _FailingCall:
    """A C function that fails as a missing system call does: -1, errno ENOSYS."""

    def __call__(self, *args: Any) -> int:
        ctypes.set_errno(errno.ENOSYS)
        return -1


class _LibcWithout:
    """The C library with the named function failing (ENOSYS), every other one real."""

    def __init__(self, real: Any, name: str) -> None:
        self._real, self._name = real, name

    def __getattr__(self, name: str) -> Any:
        return _FailingCall() if name == self._name else getattr(self._real, name)


def test_the_setting_names_facilities_and_refuses_others() -> None:
    assert disabled_facilities("inotify, PROC") == {"inotify", "proc"}
    assert disabled_facilities("all") == set(FACILITIES)
    assert disabled_facilities("") == frozenset()
    check_disabled("syncfs,peercred")
    with pytest.raises(ValueError, match=r"'inotfy', which it cannot switch off; use .*inotify, peercred"):
        check_disabled("inotfy,proc")


def test_without_the_four_the_daemon_captures_cold_restores_and_says_so_once(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"), ("b.txt", "beta\n"))
    sock = tmp_path / "run" / "s.sock"
    env = child_env(sock, SNAPSHOTD_DISABLE=ALL_OFF)
    daemon = start_daemon(sock, tmp_path / "daemon.log", env=env)
    try:
        first = cli("checkpoint", "--json", cwd=repo, env=env).json()
        write(repo / "a.txt", "alpha, edited\n")
        (repo / "b.txt").unlink()
        second = cli("checkpoint", "--json", cwd=repo, env=env).json()
        assert [first["stats"]["scan"], second["stats"]["scan"]] == ["full", "full"]
        assert second["checkpoint"]["tree"] == oracle_tree(repo)
        assert git(repo, "cat-file", "-t", second["checkpoint"]["id"]) == "commit"

        cli("restore", "--yes", first["checkpoint"]["id"], cwd=repo, env=env)
        assert (repo / "a.txt").read_text() == "alpha\n" and (repo / "b.txt").read_text() == "beta\n"
        assert stat.S_IMODE((repo / "b.txt").stat().st_mode) == 0o644  # the umask set at start, without /proc

        status = cli("status", "--json", env=env).json()
        assert status["facilities"] == {
            name: {"available": False, "reason": facilities.SWITCHED_OFF} for name in FACILITIES
        }
        assert [text.split()[0] for text in status["warnings"]] == list(FACILITIES)
        assert all(wt["watching"] is False for wt in status["worktrees"])

        lines = cli("status", env=env).stdout.splitlines()
        warnings = [line for line in lines if line.startswith("warning: ")]
        assert warnings == [f"warning: {text}" for text in status["warnings"]]
        assert "ok: 1 worktree, captured cold (no inotify: see the warning)" in lines
    finally:
        assert daemon.terminate() == 0
    log = daemon.log_text()
    for text in status["warnings"]:
        assert log.count(text) == 1, log


def test_without_peer_credentials_the_socket_folder_must_be_0700(tmp_path: Path) -> None:
    folder = tmp_path / "open-run"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    sock = folder / "s.sock"
    refused = cli_process("serve", "--socket", sock, env=child_env(SNAPSHOTD_DISABLE="peercred"), code=1)
    assert refused.stdout == ""
    assert refused.stderr.strip() == (
        f"error: Refusing the socket folder {folder}: without peer credentials (SO_PEERCRED) its mode is what "
        f"keeps other users out, and it is 0755; run: chmod 700 {folder}."
    )
    assert not sock.exists()

    folder.chmod(0o700)
    daemon = start_daemon(sock, tmp_path / "daemon.log", env=child_env(sock, SNAPSHOTD_DISABLE="peercred"))
    try:
        assert cli("ping", "--json", env=child_env(sock, SNAPSHOTD_DISABLE="peercred")).json()["pid"] == daemon.pid
    finally:
        assert daemon.terminate() == 0


def test_a_setting_naming_an_unknown_facility_starts_nothing(tmp_path: Path) -> None:
    sock = tmp_path / "run" / "s.sock"
    refused = cli_process("serve", "--socket", sock, env=child_env(SNAPSHOTD_DISABLE="inotfy"), code=1)
    assert refused.stderr.count("\n") == 1 and "SNAPSHOTD_DISABLE names 'inotfy'" in refused.stderr
    assert not sock.parent.exists()


@pytest.mark.needs("inotify", "proc")
async def test_inotify_init1_failing_with_enosys_makes_captures_cold_as_the_setting_does(
    tmp_path: Path, nursery: Any, fresh_facilities: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    engine = Engine(tmp_path / "home", nursery=nursery)
    assert engine.watch  # found at start: it fails only when the worktree's watch begins
    real = inotify_mod._libc()
    monkeypatch.setattr(inotify_mod, "_libc", lambda: _LibcWithout(real, "inotify_init1"))
    try:
        await engine.call("checkpoint", {"path": str(repo)})
        write(repo / "a.txt", "alpha, edited\n")
        second = await engine.call("checkpoint", {"path": str(repo)})
        assert second["stats"]["scan"] == "full" and second["checkpoint"]["tree"] == oracle_tree(repo)
        status = await engine.call("status")
    finally:
        await engine.aclose()
    reason = f"inotify_init1: {os.strerror(errno.ENOSYS)}"
    assert status["facilities"]["inotify"] == {"available": False, "reason": reason}
    assert status["warnings"] == [facilities.warning("inotify", reason)]
    assert status["worktrees"][0]["watching"] is False


@pytest.mark.needs("syncfs")
async def test_syncfs_failing_with_enosys_flushes_each_write_instead(
    tmp_path: Path, fresh_facilities: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    real = flush.libc()
    monkeypatch.setattr(flush, "libc", lambda: _LibcWithout(real, "syncfs"))
    engine = Engine(tmp_path / "home")
    try:
        first = await engine.call("checkpoint", {"path": str(repo)})  # its syncfs fails: everything is synced
        write(repo / "a.txt", "alpha, edited\n")
        second = await engine.call("checkpoint", {"path": str(repo)})  # each object fsynced as written
        status = await engine.call("status")
    finally:
        await engine.aclose()
    assert second["checkpoint"]["parent"] == first["checkpoint"]["id"]
    assert second["checkpoint"]["tree"] == oracle_tree(repo)
    reason = f"syncfs: {os.strerror(errno.ENOSYS)}"
    assert status["facilities"]["syncfs"] == {"available": False, "reason": reason}
    assert status["warnings"] == [facilities.warning("syncfs", reason)]
    assert loose._libgit2_fsyncs
