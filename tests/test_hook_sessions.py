"""A session's checkpoints stay in the worktree it started in, whatever folder the agent moves to.

Codex passes only ``cwd``, which follows the agent's ``cd``: recorded payloads
whose ``cwd`` moves to another worktree of the same repository mid-turn go
through the real hook program against a real daemon, and every checkpoint of
the turn is in the worktree where the session started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import Daemon, call, child_env, cli
from hook_helpers import RECORDED_CWD, placed, recorded, run_hook
from oracle import oracle_tree
from repo_helpers import git, init_repo, write


@pytest.fixture
def env(sock: Path) -> dict[str, str]:
    return child_env(sock, SNAPSHOTD_HOOK_BUDGET="60")


@pytest.fixture
def worktrees(tmp_path: Path) -> tuple[Path, Path]:
    """A repository and a linked worktree of it."""
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    git(repo, "worktree", "add", "-q", "-b", "other", str(tmp_path / "other"))
    return repo, tmp_path / "other"


def codex(name: str) -> dict[str, Any]:
    [(_, payload)] = [item for item in recorded("codex") if name in item[0]]
    return payload


def hook(payload: dict[str, Any], cwd: Path, env: dict[str, str], **changes: Any) -> None:
    run = run_hook("codex", placed(payload, cwd, **changes), env)
    assert (run.code, run.stdout, run.stderr) == (0, "", ""), run


def labels(worktree: Path, env: dict[str, str], session: str) -> list[str]:
    return [cp["label"] for cp in cli("list", "--json", "--session", session, str(worktree), env=env).json()["checkpoints"][::-1]]


def test_a_cd_into_another_worktree_mid_turn_keeps_the_turn_where_it_started(
    daemon: Daemon, env: dict[str, str], worktrees: tuple[Path, Path]
) -> None:
    repo, other = worktrees
    session = codex("stop")["session_id"]
    hook(codex("user-prompt"), repo, env)
    write(repo / "a.txt", "hello\n")
    write(other / "a.txt", "elsewhere\n")
    hook(codex("post-tool-use-bash"), other, env)  # the agent ran `cd ../other && ...`: cwd follows it
    hook(codex("stop"), other, env)

    assert labels(repo, env, session) == [
        "before: Add a CHANGES file and fix the greeting in a.txt",
        "after Bash: printf 'v1: first release\\n' > CHANGES",
        "after turn",
    ]
    assert labels(other, env, session) == []
    newest = cli("list", "--json", "--session", session, "--limit", "1", str(repo), env=env).json()["checkpoints"][0]
    assert newest["tree"] == oracle_tree(repo)


def test_a_session_resumed_in_another_worktree_records_there_from_then_on(
    daemon: Daemon, env: dict[str, str], worktrees: tuple[Path, Path]
) -> None:
    repo, other = worktrees
    session = codex("stop")["session_id"]
    start = {"hook_event_name": "SessionStart", "source": "startup", "session_id": session, "cwd": RECORDED_CWD}
    hook(start, repo, env)
    hook(codex("user-prompt"), repo, env)
    hook(codex("stop"), repo, env)
    hook(start, other, env, source="resume")  # `codex resume` run from the other worktree
    hook(codex("user-prompt"), other, env)
    hook(codex("stop"), other, env)
    assert labels(repo, env, session) == ["session start (startup)", "before: Add a CHANGES file and fix the greeting in a.txt", "after turn"]
    assert labels(other, env, session) == ["session start (resume)", "before: Add a CHANGES file and fix the greeting in a.txt", "after turn"]


def test_a_session_whose_folder_is_gone_records_where_the_agent_is(
    daemon: Daemon, env: dict[str, str], worktrees: tuple[Path, Path]
) -> None:
    repo, other = worktrees
    session = codex("stop")["session_id"]
    hook(codex("user-prompt"), other, env)
    git(repo, "worktree", "remove", "--force", str(other))
    hook(codex("stop"), repo, env)
    assert labels(repo, env, session) == ["after turn"]


def test_the_next_prompt_knows_the_turn_ended_without_asking_the_daemon(
    daemon: Daemon, sock: Path, env: dict[str, str], worktrees: tuple[Path, Path]
) -> None:
    repo, _ = worktrees
    session = codex("stop")["session_id"]
    hook(codex("user-prompt"), repo, env)  # the session's first: its newest checkpoint is asked for once
    hook(codex("stop"), repo, env)
    listed = call(sock, "status")["counters"].get("calls.list", 0)
    hook(codex("user-prompt"), repo, env, turn_id="second")
    hook(codex("user-prompt"), repo, env, turn_id="third")  # no Stop before it: the second turn is closed first
    assert call(sock, "status")["counters"].get("calls.list", 0) == listed
    assert labels(repo, env, session)[2:] == [
        "before: Add a CHANGES file and fix the greeting in a.txt",
        "after turn (interrupted)",
        "before: Add a CHANGES file and fix the greeting in a.txt",
    ]
