"""Ctrl-C during a restore: a real command-line process, a real SIGINT to its process group.

A restore cannot stop half-way; the command says so at once, then prints the
summary and how to undo it when the restore is done, and exits 130.
Through the daemon a second Ctrl-C stops the waiting and says where the
safety checkpoint will be.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_helpers import Daemon, child_env, cli_process, wait_until
from repo_helpers import git, init_repo, write

SMUDGE_S = 3  # how long the smudge filter holds the restore after it starts


def slow_restore_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A worktree whose restore runs a smudge filter that marks its start and then sleeps."""
    marker = tmp_path / "smudge-started"
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"), ("slow.dat", "slow one\n"))
    write(repo / ".gitattributes", "*.dat filter=slow\n")
    git(repo, "config", "filter.slow.clean", "cat")
    git(repo, "config", "filter.slow.smudge", f"touch '{marker}'; sleep {SMUDGE_S}; cat")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "attributes")
    return repo, marker


def start_restore(args: list[str], repo: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "snapshotd", *args],
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job is
    )


def ctrl_c(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGINT)


@pytest.mark.parametrize("embedded", [False, True])
def test_ctrl_c_during_a_restore_says_it_goes_on_then_shows_how_to_undo(
    daemon: Daemon, sock: Path, tmp_path: Path, embedded: bool
) -> None:
    repo, marker = slow_restore_repo(tmp_path)
    env = child_env(sock)
    front = ["--embedded"] if embedded else []
    saved = cli_process(*front, "checkpoint", "--json", cwd=repo, env=env).json()["checkpoint"]["id"]
    write(repo / "slow.dat", "slow two\n")
    write(repo / "a.txt", "a two\n")
    proc = start_restore([*front, "restore", saved, "--yes"], repo, env)
    try:
        wait_until(marker.exists, 30, "the restore to reach the smudge filter")
        ctrl_c(proc)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert "cannot stop half-way, so it goes on to the end" in err
    assert "Aborted!" not in out + err
    assert "undo with: snapshotd restore" in out
    assert "wrote 2 files, deleted 0 files" in out
    assert (repo / "slow.dat").read_text() == "slow one\n"
    assert (repo / "a.txt").read_text() == "a\n"
    safety = cli_process("list", "--session", "snapshotd:safety", "--json", cwd=repo, env=env).json()
    assert safety["checkpoints"], "the restore recorded its safety checkpoint"


def test_a_second_ctrl_c_stops_waiting_and_the_daemon_finishes(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo, marker = slow_restore_repo(tmp_path)
    env = child_env(sock)
    saved = cli_process("checkpoint", "--json", cwd=repo, env=env).json()["checkpoint"]["id"]
    write(repo / "slow.dat", "slow two\n")
    proc = start_restore(["restore", saved, "--yes"], repo, env)
    try:
        wait_until(marker.exists, 30, "the restore to reach the smudge filter")
        ctrl_c(proc)
        time.sleep(0.3)
        ctrl_c(proc)
        out, err = proc.communicate(timeout=SMUDGE_S)  # it does not wait for the restore
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert "Stopped waiting: the restore goes on in the daemon" in err
    assert "snapshotd list --session snapshotd:safety" in err
    wait_until(lambda: (repo / "slow.dat").read_text() == "slow one\n", 30, "the daemon to finish the restore")
