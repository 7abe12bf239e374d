"""Another user never gets snapshotd to open a store of theirs, or to run git with their config.

A repository snapshotd recorded can be deleted and made again by anyone who
may write where it was (``/tmp``); a lookup by checkpoint id searches every
recorded store, so each is held to git's ownership rule when it is opened.
And git itself is never let fetch or run a program a repository names. The
tests run as root; the other user's files are chowned to uid 65534
(:mod:`test_other_users`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from repo_helpers import git, write
from test_other_users import chown_tree

from snapshotd.engine.core import Engine
from snapshotd.errors import SnapshotdError
from snapshotd.git.process import GitTarget, run_git_sync

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def partial_clone(path: Path, marker: Path, *, object_format: str = "sha256") -> None:
    """A repository whose promisor remote's transport (``core.sshCommand``) writes ``marker``."""
    path.mkdir()
    git(path, "init", "-q", f"--object-format={object_format}", ".")
    script = write(path.parent / f"{path.name}-ssh.sh", f"#!/bin/sh\necho ran >> {marker}\nexit 1\n", mode=0o755)
    git(path, "config", "extensions.partialClone", "origin")
    git(path, "config", "remote.origin.url", "ssh://attacker.invalid/repo.git")
    git(path, "config", "remote.origin.promisor", "true")
    git(path, "config", "core.sshCommand", str(script))


async def test_show_by_full_id_never_opens_a_recorded_store_another_user_made_again(
    engine: Engine, shared: Path, tmp_path: Path
) -> None:
    victim = shared / "v"
    victim.mkdir()
    git(victim, "init", "-q", "--object-format=sha256", ".")
    write(victim / "a.txt", "mine\n")
    checkpoint = (await engine.call("checkpoint", {"path": str(victim)}))["checkpoint"]
    assert len(checkpoint["id"]) == 64
    shutil.rmtree(victim)
    marker = tmp_path / "ssh-ran"
    partial_clone(victim, marker)
    chown_tree(victim)
    with pytest.raises(SnapshotdError) as missing:
        await engine.call("show", {"checkpoint": checkpoint["id"]})
    assert missing.value.kind == "not_found", missing.value
    assert not marker.exists(), "the other user's core.sshCommand ran as this user"


async def test_a_recorded_store_of_another_user_is_passed_over_for_a_prefix_too(
    engine: Engine, shared: Path, tmp_path: Path
) -> None:
    mine = shared / "mine"
    mine.mkdir()
    git(mine, "init", "-q", ".")
    write(mine / "a.txt", "a\n")
    kept = (await engine.call("checkpoint", {"path": str(mine)}))["checkpoint"]
    other = shared / "other"
    other.mkdir()
    git(other, "init", "-q", ".")
    write(other / "b.txt", "b\n")
    lost = (await engine.call("checkpoint", {"path": str(other)}))["checkpoint"]
    chown_tree(other)
    shown = await engine.call("show", {"checkpoint": kept["id"][:12]})
    assert shown["checkpoint"]["id"] == kept["id"]
    with pytest.raises(SnapshotdError) as missing:
        await engine.call("show", {"checkpoint": lost["id"]})
    assert missing.value.kind == "not_found", missing.value


def test_git_never_fetches_for_a_partial_clone_even_of_the_users_own(tmp_path: Path) -> None:
    """The second wall: the git snapshotd runs stops every transport (git < 2.45 ignores GIT_NO_LAZY_FETCH)."""
    marker = tmp_path / "ssh-ran"
    repo = tmp_path / "repo"
    partial_clone(repo, marker)
    absent = "1" * 64
    out = run_git_sync(
        GitTarget(git_dir=str(repo / ".git"), work_tree=str(repo)), ["cat-file", "-e", absent], ok_codes=(0, 1, 128)
    )
    assert out == b""
    assert not marker.exists(), "git's lazy fetch started the repository's core.sshCommand"


def test_git_runs_no_fsmonitor_program(tmp_path: Path) -> None:
    marker = tmp_path / "fsmonitor-ran"
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", ".")
    write(repo / "a.txt", "a\n")
    git(repo, "add", "a.txt")
    script = write(tmp_path / "fsmonitor.sh", f"#!/bin/sh\necho ran >> {marker}\nexit 1\n", mode=0o755)
    git(repo, "config", "core.fsmonitor", str(script))
    run_git_sync(GitTarget(git_dir=str(repo / ".git"), work_tree=str(repo)), ["status", "--porcelain"])
    assert not marker.exists(), "git ran the repository's core.fsmonitor program"



@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
async def test_an_open_worktree_remade_by_another_user_is_refused_by_id(
    engine: Engine, shared: Path, tmp_path: Path, object_format: str
) -> None:
    """The engine keeps the worktree open; a request by its id must not go on in the other user's repository."""
    victim = shared / "v"
    victim.mkdir()
    git(victim, "init", "-q", f"--object-format={object_format}", ".")
    write(victim / "a.txt", "mine\n")
    first = (await engine.call("checkpoint", {"path": str(victim)}))["checkpoint"]
    shutil.rmtree(victim)
    marker = tmp_path / "filter-ran"
    victim.mkdir()
    git(victim, "init", "-q", f"--object-format={object_format}", ".")
    script = write(shared / "clean.sh", f"#!/bin/sh\necho ran >> {marker}\ncat\n", mode=0o755)
    git(victim, "config", "filter.evil.clean", str(script))
    write(victim / ".gitattributes", "* filter=evil\n")
    write(victim / "b.txt", "theirs\n")
    chown_tree(victim)
    with pytest.raises(SnapshotdError) as refused:
        await engine.call("checkpoint", {"worktree": first["worktree"]})
    assert refused.value.kind in ("untrusted", "not_found"), refused.value
    assert not marker.exists(), "the other user's clean filter ran as this user"
