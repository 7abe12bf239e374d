"""Before means before: a hook before a prompt returns only once its checkpoint is recorded, and a
session's checkpoints are recorded in the order of its events, whatever runs in the background.

The repository is new to the daemon and holds 9,000 untracked files, so its
first capture takes well over the half-second an "after" hook waits. The
hooks run with the default budgets, against a real daemon.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import Daemon, child_env, cli, wait_until
from hook_helpers import placed, recorded, run_hook
from oracle import oracle_tree
from repo_helpers import init_repo

FILES = 9000
SESSION = "order-session"


@pytest.fixture
def big_repo(tmp_path: Path) -> Path:
    repo = init_repo(tmp_path / "big", ("README", "big\n"))
    for i in range(FILES):
        folder = repo / f"gen{i // 300}"
        folder.mkdir(exist_ok=True)
        (folder / f"f{i}.txt").write_text(f"before {i}\n")
    return repo


def _expected(repo: Path, tmp_path: Path) -> str:
    """The oracle's tree of ``repo`` now, computed on a copy (the oracle's objects would make the daemon's first capture cheap)."""
    copy = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(repo, copy, symlinks=True, ignore=shutil.ignore_patterns("tmp_*"))  # objects the daemon is writing
    return oracle_tree(copy)


def _payload(kind: str, repo: Path, **changes: Any) -> bytes:
    [(_, payload)] = [item for item in recorded("claude-code") if kind in item[0]]
    return placed(payload, repo, session_id=SESSION, **changes)


def _agent_edits(repo: Path) -> None:
    """What the agent's first tool does the moment the hook lets it go: rewrite every file."""
    for i in range(FILES):
        (repo / f"gen{i // 300}" / f"f{i}.txt").write_text(f"after {i}\n")


def _checkpoints(repo: Path, env: dict[str, str], count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        found[:] = cli("list", "--json", "--session", SESSION, str(repo), env=env).json()["checkpoints"][::-1]
        return len(found) >= count

    wait_until(enough, 120, f"{count} checkpoints of the session")
    return found


def test_the_before_checkpoint_of_a_large_first_capture_holds_none_of_the_turn(
    daemon: Daemon, sock: Path, big_repo: Path, tmp_path: Path
) -> None:
    env = child_env(sock)  # the default budgets, as an agent runs the hook
    before = _expected(big_repo, tmp_path)
    run = run_hook("claude-code", _payload("user-prompt", big_repo, prompt="rewrite every file"), env)
    _agent_edits(big_repo)

    [checkpoint] = _checkpoints(big_repo, env, 1)
    assert checkpoint["label"] == "before: rewrite every file"
    assert checkpoint["tree"] == before
    assert (run.code, run.stdout, run.stderr) == (0, "", ""), run


def test_an_after_that_starts_the_daemon_is_recorded_before_the_next_before(tmp_path: Path, big_repo: Path) -> None:
    # No daemon runs: the "after" hook's background checkpoint must start one, and the
    # next "before" must not overtake it while it does.
    env = child_env(tmp_path / "auto" / "s.sock")
    try:
        stop = run_hook("claude-code", _payload("stop", big_repo), env)
        assert (stop.code, stop.stdout, stop.stderr) == (0, "", ""), stop  # handed off at once
        prompt = run_hook("claude-code", _payload("user-prompt", big_repo, prompt="second turn"), env)
        assert prompt.code == 0, prompt
        after_turn, second = _checkpoints(big_repo, env, 2)
        assert (after_turn["label"], second["label"]) == ("after turn", "before: second turn")
    finally:
        cli("stop", env=env)


def test_a_session_leaves_no_order_folder_behind(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "small", ("a.txt", "alpha\n"))
    env = child_env(sock)
    for kind in ("user-prompt", "stop"):
        assert run_hook("claude-code", _payload(kind, repo), env).code == 0
    _checkpoints(repo, env, 2)
    order = Path(env["SNAPSHOTD_HOME"]) / "hooks" / "order"
    wait_until(lambda: not any(order.iterdir()), 30, "the session's order folder to go")
