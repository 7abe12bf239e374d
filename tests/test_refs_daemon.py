"""References through a real daemon: every socket method and command that names a checkpoint takes them.

Also: the Node package declares exactly the daemon's methods.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import Daemon, assert_json_error, assert_one_error_line, call, child_env, cli
from repo_helpers import git, init_repo, write

from snapshotd.engine.core import Engine
from snapshotd.errors import Ambiguous, InvalidParams, SnapshotdError

NODE_TYPES = Path(__file__).resolve().parent.parent / "clients" / "node" / "index.d.ts"

# Declared in the Node types ahead of the daemon (protocol.md, "New and extended methods").
NOT_SERVED_YET: set[str] = set()


@pytest.fixture
def env(sock: Path) -> dict[str, str]:
    return child_env(sock)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(tmp_path / "repo", ("a.txt", "one\n"), ("b.txt", "b\n"))


def _turns(daemon: Daemon, repo: Path) -> list[dict[str, Any]]:
    """Three checkpoints of session s (a.txt: one, two, three) and one of session t."""
    made = []
    for content in ("one\n", "two\n", "three\n"):
        write(repo / "a.txt", content)
        made.append(call(daemon.socket, "checkpoint", {"path": str(repo), "session": "s"})["checkpoint"])
    call(daemon.socket, "checkpoint", {"path": str(repo), "session": "t", "label": "older t"})
    write(repo / "a.txt", "three\n")
    made.append(call(daemon.socket, "checkpoint", {"path": str(repo), "session": "s"})["checkpoint"])
    return made


def _error(daemon: Daemon, method: str, params: dict[str, Any]) -> SnapshotdError:
    with pytest.raises(SnapshotdError) as caught:
        call(daemon.socket, method, params)
    return caught.value


def test_every_method_that_names_a_checkpoint_takes_a_reference(daemon: Daemon, repo: Path) -> None:
    s1, s2, s3, s4 = _turns(daemon, repo)
    here = {"path": str(repo), "session": "s"}
    assert call(daemon.socket, "resolve", {"checkpoint": "@", **here})["checkpoint"] == s4
    assert call(daemon.socket, "resolve", {"checkpoint": "s@~1", "path": str(repo)})["checkpoint"] == s3
    assert call(daemon.socket, "show", {"checkpoint": "#2", **here})["checkpoint"] == s2
    assert call(daemon.socket, "resolve", {"checkpoint": s1["id"][:8]})["checkpoint"] == s1  # from anywhere
    files = call(daemon.socket, "diff", {"from": "#1", "to": "@~1", **here})["files"]
    assert [(f["path"], f["status"]) for f in files] == [("a.txt", "modified")]
    write(repo / "a.txt", "edited\n")
    restored = call(daemon.socket, "restore", {"checkpoint": "@~2", "dry_run": True, **here})
    assert restored["written"] == ["a.txt"] and (repo / "a.txt").read_text() == "edited\n"
    reverted = call(daemon.socket, "revert", {"from": "#1", "to": "#2", "dry_run": True, **here})
    assert reverted["conflicts"] and reverted["conflicts"][0]["path"] == "a.txt"  # edited since #2
    assert call(daemon.socket, "delete", {"checkpoints": ["s@~1"], "path": str(repo)}) == {"deleted": 1}
    listed = call(daemon.socket, "list", {"path": str(repo), "session": "s"})["checkpoints"]
    assert [cp["id"] for cp in listed] == [s4["id"], s2["id"], s1["id"]]


def test_seq_without_a_session_still_names_the_listed_checkpoint_after_a_restore(daemon: Daemon, repo: Path) -> None:
    here = {"path": str(repo)}
    first = call(daemon.socket, "checkpoint", here)["checkpoint"]
    write(repo / "a.txt", "turn 1\n")
    call(daemon.socket, "checkpoint", here)
    safety = call(daemon.socket, "restore", {"checkpoint": "#1", **here})["safety_checkpoint"]
    assert safety["seq"] == 1 and (repo / "a.txt").read_text() == "one\n"  # the safety session has its own #1
    write(repo / "a.txt", "turn 2\n")
    call(daemon.socket, "restore", {"checkpoint": "#1", **here})  # again: not ambiguous with the safety #1
    assert (repo / "a.txt").read_text() == "one\n"
    assert call(daemon.socket, "resolve", {"checkpoint": "#1", **here})["checkpoint"]["id"] == first["id"]
    safety_ref = {"checkpoint": "#1", "session": safety["session"], **here}
    assert call(daemon.socket, "resolve", safety_ref)["checkpoint"]["id"] == safety["id"]  # named, it is found


def test_reference_errors_over_the_socket(daemon: Daemon, repo: Path) -> None:
    _turns(daemon, repo)
    ambiguous = _error(daemon, "resolve", {"checkpoint": "#1", "path": str(repo)})
    assert isinstance(ambiguous, Ambiguous)
    assert {(c["session"], c["seq"]) for c in ambiguous.data["candidates"]} == {("s", 1), ("t", 1)}
    short = _error(daemon, "show", {"checkpoint": "abc12"})
    assert isinstance(short, InvalidParams) and "at least 7 hex digits" in short.message
    nowhere = _error(daemon, "restore", {"checkpoint": "@"})
    assert isinstance(nowhere, InvalidParams) and "give 'path' or 'worktree'" in nowhere.message
    blob = git(repo, "rev-parse", "HEAD:b.txt").strip()
    assert "No checkpoint matches" in _error(daemon, "show", {"checkpoint": blob[:10]}).message
    assert call(daemon.socket, "ping")["pid"] == daemon.pid


def test_the_command_line_takes_references_where_it_takes_a_checkpoint(
    daemon: Daemon, env: dict[str, str], repo: Path
) -> None:
    s1, _s2, s3, s4 = _turns(daemon, repo)
    assert cli("resolve", "@", "--session", "s", cwd=repo, env=env).stdout.strip() == s4["id"]
    assert cli("show", "--json", "s@~3", cwd=repo / ".", env=env).json()["checkpoint"] == s1
    assert cli("show", "--json", "#3", "--session", "s", cwd=repo, env=env).json()["checkpoint"] == s3
    assert cli("diff", "s@~3", "s@~2", cwd=repo, env=env).stdout.splitlines() == ["M  a.txt"]
    write(repo / "a.txt", "edited\n")
    cli("restore", "s@~3", "--yes", cwd=repo, env=env)
    assert (repo / "a.txt").read_text() == "one\n"
    # revert FROM TO: a reference as TO is told from a path.
    out = cli("revert", "--json", "s#1", "--dry-run", cwd=repo, env=env, code=None)
    assert out.code == 1  # '#' after a session is no form of the grammar
    write(repo / "a.txt", "two\n")
    reverted = cli("revert", "--json", "--session", "s", "#1", "#2", "--dry-run", cwd=repo, env=env).json()
    assert (reverted["written"], reverted["conflicts"]) == (["a.txt"], [])
    assert cli("delete", "--json", "t@", "--yes", cwd=repo, env=env).json() == {"deleted": 1}
    error = assert_json_error(cli("show", "--json", "@", cwd=repo.parent, env=env, code=1), kind="not_found")
    assert f"{repo.parent} is in no worktree" in error["message"]  # a read there makes none
    assert_one_error_line(cli("show", "abc", cwd=repo, env=env, code=1), "at least 7 hex digits")


def _declared_methods() -> set[str]:
    text = NODE_TYPES.read_text()
    start = text.index("export class Snapshotd ")
    body = text[text.index("{", start) : text.index("\n}", start)]
    members = set(re.findall(r"^ {2}(\w+)\(", body, re.M))
    return members - {"call", "close", "destroy", "constructor"}


def test_the_node_types_declare_the_daemons_methods() -> None:
    served = set(Engine()._handlers)
    declared = _declared_methods()
    assert "resolve" in declared and "ping" in declared
    assert declared - NOT_SERVED_YET == served, "index.d.ts and the method table differ"
    assert not NOT_SERVED_YET & served, "a method is served now: take it out of NOT_SERVED_YET"
