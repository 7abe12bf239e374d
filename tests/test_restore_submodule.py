"""A restore of a checkpoint holding a submodule, through the command line against a real daemon.

A checkpoint holds a submodule's commit (its gitlink), not its files: a
restore makes a deleted submodule's folder only, and from then on the
worktree matches the checkpoint, as git says (``git add -A`` keeps the
gitlink of a submodule that is not checked out), so a second restore, or
its preview, has nothing to do.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import Daemon, child_env, cli
from oracle import oracle_tree
from repo_helpers import load_fixture, tree_entries

make_odd = load_fixture("make_odd")


@pytest.fixture
def env(sock: Path) -> dict[str, str]:
    return child_env(sock)


def with_submodule(tmp_path: Path) -> Path:
    """A repository with the submodule ``sub`` checked out (its git folder under ``.git/modules``)."""
    source = tmp_path / "source"
    make_odd.init(source)
    make_odd.write(source / "inner.txt", "inside\n")
    make_odd.commit(source, "inner")
    repo = make_odd.base_repo(tmp_path / "repo")
    make_odd.git(repo, "submodule", "add", "-q", str(source), "sub")
    make_odd.commit(repo, "a submodule")
    return repo


def checkpoint(repo: Path, env: dict[str, str]) -> dict[str, Any]:
    taken: dict[str, Any] = cli("checkpoint", "--json", str(repo), env=env).json()["checkpoint"]
    return taken


def test_a_restored_submodule_folder_is_not_planned_again(daemon: Daemon, env: dict[str, str], tmp_path: Path) -> None:
    repo = with_submodule(tmp_path)
    cp = checkpoint(repo, env)
    assert tree_entries(repo, cp["tree"])["sub"][0] == "160000"
    shutil.rmtree(repo / "sub")
    done = cli("restore", cp["id"], "--yes", "--json", cwd=repo, env=env).json()
    assert done["submodules"] == done["written"] == ["sub"]
    assert (repo / "sub").is_dir() and list((repo / "sub").iterdir()) == []

    # git keeps the gitlink of a submodule folder with nothing checked out, and so does the capture.
    assert checkpoint(repo, env)["tree"] == oracle_tree(repo) == cp["tree"]
    preview = cli("restore", cp["id"], "--dry-run", "--json", cwd=repo, env=env).json()
    assert (preview["written"], preview["deleted"], preview.get("submodules"), preview.get("conflicts")) == ([], [], None, None)
    said = cli("restore", cp["id"], "--dry-run", cwd=repo, env=env).stdout.splitlines()
    assert said == ["would write 0 files, would delete 0 files"]
    again = cli("restore", cp["id"], "--yes", "--json", cwd=repo, env=env).json()
    assert (again["written"], again["deleted"], again.get("submodules")) == ([], [], None)
