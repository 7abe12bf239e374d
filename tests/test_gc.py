"""``gc`` collects the worktree it is given, keeps safety checkpoints, and leaves a store usable.

Over the socket a ``gc`` names its worktree or says ``all``; the command line
means the current worktree unless ``--all``. ``--dry-run`` lists per worktree
and session what would go. After a plain folder's store is pruned, the next
capture (warm, cold or exact, in the daemon or in another process) works and
equals git, and sequence numbers keep growing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import Daemon, call, child_env, cli, quiet_daemon
from oracle import oracle_tree
from repo_helpers import git_ok, init_repo, write

from snapshotd.engine.core import Engine
from snapshotd.errors import InvalidParams
from snapshotd.settings import SAFETY_SESSION


async def cp(engine: Engine, path: Path, **params: Any) -> dict[str, Any]:
    return (await engine.call("checkpoint", {"path": str(path), **params}))["checkpoint"]


async def count(engine: Engine, path: Path) -> int:
    return len((await engine.call("list", {"path": str(path)}))["checkpoints"])


async def test_gc_over_the_socket_names_its_worktree_or_all(engine: Engine, tmp_path: Path) -> None:
    one = init_repo(tmp_path / "one", ("a.txt", "a\n"))
    two = init_repo(tmp_path / "two", ("b.txt", "b\n"))
    for repo in (one, two):
        for turn in range(3):
            write(repo / "a.txt", f"turn {turn}\n")
            await cp(engine, repo)
    for params in ({}, {"keep": 0}, {"all": False, "keep": 0}):
        with pytest.raises(InvalidParams, match="'all'"):
            await engine.call("gc", params)
    with pytest.raises(InvalidParams, match="not both"):
        await engine.call("gc", {"path": str(one), "all": True})
    assert [await count(engine, one), await count(engine, two)] == [3, 3]
    assert (await engine.call("gc", {"path": str(one), "keep": 1}))["deleted"] == 2
    assert [await count(engine, one), await count(engine, two)] == [1, 3]
    assert (await engine.call("gc", {"all": True, "keep": 1}))["deleted"] == 2
    assert [await count(engine, one), await count(engine, two)] == [1, 1]


async def test_gc_keeps_safety_checkpoints_unless_asked(engine: Engine, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    first = await cp(engine, repo, session="s1")
    write(repo / "a.txt", "edited\n")
    await cp(engine, repo, session="s1")
    restored = await engine.call("restore", {"checkpoint": first["id"], "path": str(repo)})
    safety = restored["safety_checkpoint"]["id"]
    dry = await engine.call("gc", {"path": str(repo), "keep": 0, "dry_run": True})
    assert dry["deleted"] == 0
    assert [(item["session"], len(item["checkpoints"])) for item in dry["would_delete"]] == [("s1", 2)]
    assert await count(engine, repo) == 3
    assert (await engine.call("gc", {"path": str(repo), "keep": 0}))["deleted"] == 2
    assert [c["id"] for c in (await engine.call("list", {"path": str(repo)}))["checkpoints"]] == [safety]
    dry = await engine.call("gc", {"path": str(repo), "keep": 0, "dry_run": True, "include_safety": True})
    assert [(item["session"], item["checkpoints"]) for item in dry["would_delete"]] == [(SAFETY_SESSION, [safety])]
    assert (await engine.call("gc", {"path": str(repo), "keep": 0, "include_safety": True}))["deleted"] == 1
    assert await count(engine, repo) == 0


async def test_sequence_numbers_keep_growing_after_gc_and_delete(engine: Engine, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    assert [(await cp(engine, repo, session="s"))["seq"] for _ in range(3)] == [1, 2, 3]
    await engine.call("gc", {"path": str(repo), "keep": 0})
    assert (await cp(engine, repo, session="s"))["seq"] == 4
    newest = await cp(engine, repo, session="s")
    assert newest["seq"] == 5
    await engine.call("delete", {"checkpoints": [newest["id"]]})
    assert (await cp(engine, repo, session="s"))["seq"] == 6
    await engine.call("delete", {"session": "s", "path": str(repo)})
    assert (await cp(engine, repo, session="s"))["seq"] == 7
    assert [c["seq"] for c in (await engine.call("list", {"path": str(repo), "session": "s"}))["checkpoints"]] == [7]
    assert (await cp(engine, repo, session="other"))["seq"] == 1


@pytest.mark.parametrize("exact", [False, True])
async def test_a_plain_folder_after_gc_keep_0(watched_engine: Engine, tmp_path: Path, exact: bool) -> None:
    folder = tmp_path / "plain"
    write(folder / "a.txt", "one\n")
    write(folder / "b.txt", "unchanged\n")
    await cp(watched_engine, folder)
    write(folder / "a.txt", "two\n")
    await cp(watched_engine, folder)
    await watched_engine.call("gc", {"path": str(folder), "keep": 0})
    write(folder / "a.txt", "three\n")
    after = await cp(watched_engine, folder, exact=exact)
    assert after["tree"] == oracle_tree(folder, fresh_index=True)
    assert after["seq"] == 3


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with quiet_daemon(tmp_path) as running:
        yield running


def test_a_prune_by_another_process_leaves_the_daemon_working(daemon: Daemon, tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    write(folder / "a.txt", "one\n")
    write(folder / "b.txt", "kept\n")
    env = child_env(daemon.socket)
    for turn in ("two", "three"):
        write(folder / "a.txt", turn + "\n")
        last = cli("checkpoint", "--json", cwd=folder, env=env).json()["checkpoint"]
    assert cli("--embedded", "gc", "--json", "--keep", "0", "--yes", cwd=folder, env=env).json()["deleted"] == 2
    store = Path(os.environ["SNAPSHOTD_HOME"], "repos", last["worktree"] + ".git")
    assert not git_ok(store, "cat-file", "-e", last["tree"])  # pruned under the daemon's warm state
    write(folder / "a.txt", "four\n")
    after = call(daemon.socket, "checkpoint", {"path": str(folder)})["checkpoint"]
    assert after["tree"] == oracle_tree(folder, fresh_index=True) and after["seq"] == 3


def test_cli_gc_means_here_unless_all(daemon: Daemon, tmp_path: Path) -> None:
    env = child_env(daemon.socket)
    repos = [init_repo(tmp_path / name, ("a.txt", "a\n")) for name in ("one", "two")]
    for repo in repos:
        for session in ("s1", "s1", "s2"):
            write(repo / "a.txt", f"{session} {repo.name} {len(list(repo.iterdir()))}\n")
            write(repo / f"{session}.txt", str(tmp_path))
            cli("checkpoint", "--json", "--session", session, cwd=repo, env=env)
            write(repo / "new.txt", session)
    dry = cli("gc", "--json", "--dry-run", "--keep", "0", cwd=repos[0], env=env).json()
    assert dry["deleted"] == 0
    assert sorted((item["path"], item["session"], len(item["checkpoints"])) for item in dry["would_delete"]) == [
        (str(repos[0]), "s1", 2),
        (str(repos[0]), "s2", 1),
    ]
    human = cli("gc", "--dry-run", "--keep", "0", cwd=repos[0], env=env).stdout
    assert "would delete 2 checkpoints of session s1" in human and str(repos[0]) in human
    assert cli("gc", "--json", "--keep", "0", "--yes", cwd=repos[0], env=env).json()["deleted"] == 3
    assert len(cli("list", "--json", cwd=repos[1], env=env).json()["checkpoints"]) == 3
    cli("gc", "--all", str(repos[1]), env=env, code=2)
    assert cli("gc", "--json", "--all", "--keep", "1", "--yes", cwd=tmp_path, env=env).json()["deleted"] == 1
    assert len(cli("list", "--json", cwd=repos[1], env=env).json()["checkpoints"]) == 2


def test_gc_all_after_a_restart_leaves_every_worktree_it_opened_watched(tmp_path: Path) -> None:
    repos = [init_repo(tmp_path / name, ("a.txt", "a\n")) for name in ("one", "two")]
    with quiet_daemon(tmp_path / "first") as first:
        for repo in repos:
            cli("checkpoint", "--json", cwd=repo, env=child_env(first.socket))
    with quiet_daemon(tmp_path / "second") as second:  # same home: it knows both, opens neither
        env = child_env(second.socket)
        assert cli("status", "--json", env=env).json()["worktrees"] == []
        cli("gc", "--json", "--all", "--dry-run", cwd=tmp_path, env=env)
        shown = cli("status", "--json", env=env).json()["worktrees"]
        assert sorted(wt["path"] for wt in shown) == [str(repo) for repo in repos]
        assert all(wt["watching"] for wt in shown), shown
        assert cli("status", env=env).stdout.splitlines()[-1].startswith("ok: 2 worktrees, all watched")


def test_after_a_restart_worktrees_deleted_or_removed_are_shown_by_status_and_repair(tmp_path: Path) -> None:
    main = init_repo(tmp_path / "main", ("a.txt", "a\n"))
    linked, removed, plain = tmp_path / "linked", tmp_path / "removed", tmp_path / "plain"
    git_ok(main, "worktree", "add", "-q", str(linked), "-b", "l")
    git_ok(main, "worktree", "add", "-q", str(removed), "-b", "r")
    write(plain / "p.txt", "p\n")
    ids = {}
    with quiet_daemon(tmp_path / "first") as first:
        for folder in (main, linked, removed, plain):
            ids[folder] = cli("checkpoint", "--json", cwd=folder, env=child_env(first.socket)).json()["checkpoint"]["worktree"]
    shutil.rmtree(linked)
    shutil.rmtree(plain)
    git_ok(main, "worktree", "remove", "--force", str(removed))
    with quiet_daemon(tmp_path / "second") as second:  # same home: it opens none of them
        env = child_env(second.socket)
        gone = cli("repair", "--json", env=env).json()["gone"]
        assert sorted(item["worktree"] for item in gone) == sorted([ids[linked], ids[plain]])
        shown = {wt["id"]: wt["presence"] for wt in cli("status", "--json", env=env).json()["worktrees"]}
        assert shown == {ids[linked]: "gone", ids[plain]: "gone", ids[removed]: "removed"}
        assert "2 worktrees not where recorded" in cli("status", env=env).stdout
        cli("forget", ids[plain], env=env)
        assert ids[plain] not in {wt["id"] for wt in cli("status", "--json", env=env).json()["worktrees"]}
