"""snapshotd's own data is never part of a capture, and a home folder or ``/`` is checkpointed only when forced.

A worktree that holds ``$SNAPSHOTD_HOME`` (a plain folder at ``$HOME``, a
dotfiles repository) would otherwise capture the store's new objects at every
checkpoint and never be unchanged. Cold and warm captures alike leave it out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import assert_one_error_line, child_env, cli_process
from oracle import oracle_tree
from repo_helpers import git, init_repo, write

from snapshotd.engine.core import Engine
from snapshotd.errors import NeedsForce, PathOutsideWorktree


def top_names(folder: Path, tree: str) -> set[str]:
    """Names at the top of ``tree`` (read with git from the store of the worktree at ``folder``)."""
    store = next(Path(os.environ["SNAPSHOTD_HOME"], "repos").glob("*.git"))
    return set(git(store, "ls-tree", "--name-only", tree).split("\n"))


@pytest.mark.parametrize("watched", [False, True])
async def test_a_home_folder_holding_the_store_reaches_unchanged(nursery, watched: bool) -> None:
    home = Path(os.environ["HOME"])
    assert Path(os.environ["SNAPSHOTD_HOME"]).parent == home
    write(home / "notes.txt", "mine\n")
    engine = Engine(nursery=nursery if watched else None)
    with pytest.raises(NeedsForce, match=r"home folder.*--force"):
        await engine.call("checkpoint", {"path": str(home)})
    assert not Path(os.environ["SNAPSHOTD_HOME"], "repos").exists()  # refused before anything was opened
    made = [(await engine.call("checkpoint", {"path": str(home), "force": True})) for _ in range(3)]
    assert [m["checkpoint"]["changed"] for m in made] == [True, False, False]
    assert "snapshotd-home" not in top_names(home, made[0]["checkpoint"]["tree"])
    assert {"notes.txt", ".gitconfig"} <= top_names(home, made[0]["checkpoint"]["tree"])
    write(home / "notes.txt", "edited\n")
    edited = await engine.call("checkpoint", {"path": str(home), "force": True})
    assert edited["checkpoint"]["changed"] and "snapshotd-home" not in top_names(home, edited["checkpoint"]["tree"])
    if watched:
        assert edited["stats"]["scan"] == "watch"
    await engine.aclose()


async def test_a_repository_holding_the_store_leaves_it_out(nursery, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    engine = Engine(tmp_path / "repo" / "data" / "snapshotd", nursery=nursery)
    trees = [(await engine.call("checkpoint", {"path": str(repo)}))["checkpoint"] for _ in range(3)]
    assert [cp["changed"] for cp in trees] == [True, False, False]
    write(repo / "data" / "mine.txt", "the user's own file next to it\n")
    after = (await engine.call("checkpoint", {"path": str(repo)}))["checkpoint"]
    await engine.aclose()
    write(repo / ".git" / "info" / "exclude", "/data/snapshotd/\n")
    assert after["tree"] == oracle_tree(repo)
    assert git(repo, "ls-tree", "-r", "--name-only", after["tree"], "data").split() == ["data/mine.txt"]


async def test_the_root_of_the_file_system_needs_force(engine: Engine) -> None:
    with pytest.raises(NeedsForce, match="root of the file system"):
        await engine.call("checkpoint", {"path": "/"})


def test_the_command_line_refuses_home_without_a_terminal_and_asks_at_one() -> None:
    home = Path(os.environ["HOME"])
    env = child_env()
    refused = cli_process("--embedded", "checkpoint", str(home), env=env, code=1)
    assert_one_error_line(refused, "home folder", "--force")
    main, secondary = os.openpty()
    try:
        asked = subprocess.Popen(
            [sys.executable, "-m", "snapshotd", "--embedded", "checkpoint", "--json", str(home)],
            stdin=secondary, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
        )
        os.write(main, b"y\n")
        out, err = asked.communicate(timeout=60)
    finally:
        os.close(main)
        os.close(secondary)
    assert asked.returncode == 0, err
    assert "home folder" in err and "Go ahead anyway?" in err
    assert '"changed": true' in out


@pytest.mark.parametrize("where", [".", "ui"])
async def test_a_checkpoint_of_the_data_folder_itself_is_refused_and_opens_nothing(engine: Engine, where: str) -> None:
    home = Path(os.environ["SNAPSHOTD_HOME"])
    home.mkdir(mode=0o700, exist_ok=True)
    (home / "ui").mkdir(mode=0o700, exist_ok=True)
    (home / "ui" / "1.json").write_text('{"token": "the page\'s secret"}\n')
    with pytest.raises(PathOutsideWorktree, match=r"snapshotd's own data folder .*give a folder of your project"):
        await engine.call("checkpoint", {"path": str(home / where)})
    assert not (home / "repos").exists()  # no store was made for it
    assert (await engine.call("worktrees", {}))["worktrees"] == []
