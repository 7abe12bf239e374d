"""A repository or folder moved under a running daemon keeps its id, its checkpoints and its watch.

``mv repo repo2`` while the daemon watches ``repo``: the next checkpoint at
``repo2`` works with the same worktree id, lists the old checkpoints, and the
watcher follows (warm captures at the new place see new edits). ``repair``
reports the move.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import Daemon, call, child_env, cli, quiet_daemon
from oracle import oracle_tree
from repo_helpers import init_repo, write


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with quiet_daemon(tmp_path) as running:
        yield running


@pytest.mark.parametrize("after_move", ["checkpoint", "repair"])
@pytest.mark.parametrize("kind", ["git", "plain"])
def test_a_worktree_moved_under_the_daemon_keeps_working(daemon: Daemon, tmp_path: Path, kind: str, after_move: str) -> None:
    old = tmp_path / "repo"
    if kind == "git":
        init_repo(old, ("a.txt", "a\n"))
    else:
        write(old / "a.txt", "a\n")
    env = child_env(daemon.socket)
    first = cli("checkpoint", "--json", "-m", "before the move", cwd=old, env=env).json()["checkpoint"]
    write(old / "a.txt", "edited before the move\n")
    second = cli("checkpoint", "--json", cwd=old, env=env).json()["checkpoint"]
    new = tmp_path / "repo2"
    old.rename(new)
    write(new / "a.txt", "edited after the move\n")
    write(new / "b.txt", "new after the move\n")
    if after_move == "repair":
        repaired = cli("repair", "--json", ".", cwd=new, env=env).json()
        assert repaired["moved"] == [{"worktree": second["worktree"], "from": str(old), "to": str(new)}]
    moved = cli("checkpoint", "--json", cwd=new, env=env).json()["checkpoint"]
    fresh = kind == "plain"
    assert moved["worktree"] == first["worktree"]
    assert moved["tree"] == oracle_tree(new, fresh_index=fresh) and moved["seq"] == 3
    listed = cli("list", "--json", cwd=new, env=env).json()["checkpoints"]
    assert [cp["id"] for cp in listed] == [moved["id"], second["id"], first["id"]]
    diff = cli("diff", "--json", first["id"], cwd=new, env=env).json()
    assert sorted(change["path"] for change in diff["files"]) == ["a.txt", "b.txt"]
    # The watch follows: edits at the new place reach a warm capture.
    write(new / "a.txt", "edited again\n")
    again = call(daemon.socket, "checkpoint", {"path": str(new)})
    assert again["checkpoint"]["tree"] == oracle_tree(new, fresh_index=fresh)
    assert again["stats"]["scan"] == "watch"
    opened = call(daemon.socket, "open", {"worktree": first["worktree"]})["worktree"]
    assert opened["path"] == str(new) and opened["watching"]
