"""A worktree deleted on purpose: ``repair`` says it is gone and how to forget it; ``forget`` drops it.

A real daemon watches a linked worktree that is then removed with ``rm -rf``:
``status`` needs attention until ``snapshotd forget`` drops the daemon's entry
and the record, and then reads ok.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from daemon_helpers import Daemon, assert_one_error_line, child_env, cli, wait_until
from repo_helpers import git, init_repo, write


def _records() -> dict:
    path = Path(os.environ["SNAPSHOTD_HOME"], "worktrees.json")
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_deleted_worktree_is_forgotten(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    env = child_env(sock)
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    wt3 = tmp_path / "wt3"
    git(repo, "worktree", "add", "-q", str(wt3))
    write(wt3 / "a.txt", "changed\n")
    cli("checkpoint", str(repo), env=env)
    cli("checkpoint", str(wt3), env=env)
    wt3_id = next(wt["id"] for wt in cli("worktrees", "--json", env=env).json()["worktrees"] if wt["path"] == str(wt3))

    shutil.rmtree(wt3)

    def gone() -> bool:
        return any(wt.get("presence") == "gone" for wt in cli("status", "--json", env=env).json()["worktrees"])

    wait_until(gone, 20, "the daemon to find wt3 gone")
    assert cli("status", env=env).stdout.splitlines()[-1].startswith("attention: 2 worktrees; 1 worktree not where")

    repaired = cli("repair", env=env).stdout.splitlines()
    assert repaired[0] == "nothing moved"
    assert repaired[1] == "1 worktree gone (deleted, or moved elsewhere):"
    assert repaired[2].split() == [wt3_id, str(wt3)]
    assert "snapshotd forget PATH|ID" in repaired[3]
    assert cli("repair", "--json", env=env).json()["gone"] == [{"worktree": wt3_id, "path": str(wt3)}]

    # The worktree still there is refused, and nothing changes.
    refused = cli("forget", str(repo), env=env, code=1)
    assert_one_error_line(refused, "is still at", str(repo))

    assert cli("forget", str(wt3), env=env).stdout == f"forgot {wt3_id}  {wt3}\n"
    assert wt3_id not in _records() and len(_records()) == 1
    lines = cli("status", env=env).stdout.splitlines()
    assert lines[-1] == "ok: 1 worktree, all watched"
    assert cli("repair", env=env).stdout == "nothing moved\n"
    # The main worktree's checkpoints (the shared store) are untouched.
    assert len(cli("list", str(repo), "--json", env=env).json()["checkpoints"]) == 1

    again = cli("forget", wt3_id, env=env, code=1)
    assert_one_error_line(again, f"No worktree is recorded with the id {wt3_id}")
