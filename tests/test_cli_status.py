"""``status`` for people: a table of worktrees and one health line; counters only when asked.

A real daemon with a git worktree and a plain folder; ``--json`` stays the
method's result.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from daemon_helpers import Daemon, child_env, cli
from repo_helpers import init_repo, write

from snapshotd.cli.health import health_line


@pytest.mark.needs("inotify", "peercred", "syncfs", "proc")
def test_status_is_a_table_with_a_health_line(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    env = child_env(sock)
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    cli("checkpoint", str(repo), env=env)
    write(repo / "a.txt", "beta\n")
    cli("checkpoint", str(repo), env=env)
    plain = tmp_path / "plain"
    write(plain / "notes.txt", "not a git worktree\n")
    cli("checkpoint", str(plain), env=env)

    status = cli("status", "--json", env=env).json()
    assert {"worktrees", "counters", "spawn", "version", "pid"} <= set(status)
    by_path = {wt["path"]: wt for wt in status["worktrees"]}

    lines = cli("status", env=env).stdout.splitlines()
    assert lines[0].startswith("snapshotd ") and f"pid {daemon.pid}" in lines[0]
    assert status["log"] == str(daemon.log) and lines[0].endswith(f"  log {daemon.log}")  # where its errors are told
    assert lines[1].split() == ["ID", "PATH", "KIND", "STATE", "CHECKPOINTS", "LAST", "CAPTURE", "WARNINGS"]
    rows = {line.split()[1]: line for line in lines[2:-1]}
    assert set(rows) == {str(repo), str(plain)}
    assert rows[str(repo)].split()[:5] == [by_path[str(repo)]["id"], str(repo), "git", "watching", "2"]
    assert "just now" in rows[str(repo)]
    assert rows[str(plain)].split()[2:5] == ["plain", "watching", "1"]
    assert lines[-1] == "ok: 2 worktrees, all watched"
    # The counters only with --verbose; the same keys as --json.
    assert not any("processes_started" in line for line in lines)
    verbose = cli("status", "--verbose", env=env).stdout.splitlines()
    assert verbose[1 : len(lines)] == lines[1:]
    assert {line.strip().rsplit(None, 1)[0].strip() for line in verbose[len(lines) :]} >= set(status["counters"])


def test_health_line_names_what_needs_a_look() -> None:
    here = {"id": "a", "path": "/p", "kind": "git", "watching": True, "presence": "here"}
    gone = {**here, "presence": "gone", "problem": "The worktree was deleted."}
    cold = {**here, "watching": False, "watch_error": "no inotify"}
    result = {"worktrees": [here, gone, cold], "spawn": {"native": True}}
    line = health_line(result)
    assert "3 worktrees" in line and "1 worktree not where recorded" in line and "1 captured cold" in line
    assert health_line({"worktrees": [here], "spawn": {"native": True}}).endswith("1 worktree, all watched")


def test_status_counts_from_the_index_without_listing(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    """Each worktree's count and newest time come with ``status``; the table asks for no ``list``."""
    env = child_env(sock)
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    for n, session in enumerate(["one", "one", "two"]):
        write(repo / "a.txt", f"edit {n}\n")
        cli("checkpoint", str(repo), "--session", session, env=env)
    listed = cli("list", str(repo), "--json", env=env).json()["checkpoints"]
    worktree = cli("status", "--json", env=env).json()["worktrees"][0]
    assert worktree["checkpoint_count"] == len(listed) == 3
    assert worktree["last_checkpoint_at"] == max(cp["created_at"] for cp in listed)

    cli("delete", listed[0]["id"], "--yes", env=env)
    lists_before = cli("status", "--json", env=env).json()["counters"].get("calls.list", 0)
    table = cli("status", env=env).stdout.splitlines()
    assert table[2].split()[4] == "2"
    assert cli("status", "--json", env=env).json()["counters"].get("calls.list", 0) == lists_before


@pytest.mark.needs("inotify", "peercred", "syncfs", "proc")
def test_status_under_embedded_says_what_is_true(tmp_path: Path) -> None:
    """No daemon runs: nothing is open or watched, and the line says so rather than "all watched"."""
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    lines = cli("--embedded", "status", cwd=repo).stdout.splitlines()
    assert lines[1:] == ["ok: embedded (no daemon: each command opens its worktree and scans it)"]


def test_status_says_when_background_packing_failed() -> None:
    from click.testing import CliRunner

    from snapshotd.cli.health import print_status

    base = {"version": "x", "pid": 1, "worktrees": [], "counters": {}}
    failed = {"runs": 2, "failures": 1, "last_error": "git repack failed: no space left on device", "last_seconds": 0.4}

    def shown(result: dict) -> str:
        runner = CliRunner()

        @click.command()
        def show() -> None:
            print_status(result, verbose=False)

        return runner.invoke(show).output

    assert "background packing failed: git repack failed: no space left on device" in shown({**base, "packing": failed})
    assert "packing" not in shown({**base, "packing": {**failed, "last_error": None}})


def test_the_health_line_of_a_daemon_with_no_worktree_claims_nothing_of_them() -> None:
    assert click.unstyle(health_line({"worktrees": []})) == "ok: 0 worktrees"


def test_a_long_warning_is_cut_at_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from snapshotd.cli import health

    problem = "The worktree wt_1 is no longer at /some/long/path/of/a/worktree; 'snapshotd repair NEW_PATH' finds it."
    worktree = {"id": "wt_1", "path": "/p", "kind": "git", "presence": "gone", "problem": problem}
    result = {"version": "x", "pid": 1, "worktrees": [worktree], "counters": {}}
    lines: list[str] = []
    monkeypatch.setattr(health.click, "echo", lambda text="", **_: lines.append(str(text)))
    for at_terminal in (False, True):
        lines.clear()
        monkeypatch.setattr(health.sys.stdout, "isatty", lambda at=at_terminal: at)
        health.print_status(result, verbose=False)
        [row] = [line for line in lines if line.startswith("wt_1")]
        assert row.endswith(problem) is not at_terminal and (row.endswith("…") is at_terminal), row
