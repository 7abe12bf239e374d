"""Shell completion: click's protocol, with references and sessions from a running daemon only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from daemon_helpers import Daemon, child_env, cli, cli_process
from repo_helpers import init_repo, write


def complete(words: str, cwd: Path, env: dict[str, str]) -> list[str]:
    """What bash's completion would be offered for the last of ``words`` (click's bash protocol)."""
    parts = words.split(" ")
    proc = subprocess.run(
        [sys.executable, "-m", "snapshotd"],
        env={**env, "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1), "_SNAPSHOTD_COMPLETE": "bash_complete"},
        cwd=cwd, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [line.partition(",")[2] for line in proc.stdout.splitlines()]


def test_references_and_sessions_complete_from_the_worktree_here(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    env = child_env(sock)
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    for n, session in enumerate(["beta", "alpha", "alpha"]):
        write(repo / "a.txt", f"edit {n}\n")
        cli("checkpoint", str(repo), "--session", session, "-m", f"edit {n}", env=env)
    newest = cli("list", str(repo), "--json", env=env).json()["checkpoints"][0]

    assert complete("snapshotd show ", repo, env) == ["@", "@~1", "#2", "#1", "alpha@", "beta@"]
    assert complete("snapshotd diff @", repo, env) == ["@", "@~1"]
    assert complete("snapshotd revert --session ", repo, env) == ["alpha", "beta"]
    assert complete("snapshotd list --session a", repo, env) == ["alpha"]
    assert complete(f"snapshotd restore {newest['id'][:8]}", repo, env) == [newest["id"][:12]]
    assert "worktree" in complete("snapshotd diff w", repo, env)


def test_completion_starts_no_daemon_and_prints_each_shell_s_script(tmp_path: Path) -> None:
    sock = tmp_path / "none.sock"
    env = child_env(sock)
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    assert complete("snapshotd show ", repo, env) == ["@", "@~1"]
    assert not sock.exists()
    for shell, marker in (("bash", "complete -o nosort -F"), ("zsh", "#compdef snapshotd"), ("fish", "complete --no-files")):
        script = cli_process("completion", shell, env=env).stdout
        assert marker in script and "_SNAPSHOTD_COMPLETE" in script, shell
    assert "'tcsh' is not one of" in cli_process("completion", "tcsh", env=env, code=2).stderr
