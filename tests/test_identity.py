"""A worktree's identity and the daemon's records are created only where they do not exist.

When ``.git/snapshotd/id`` or ``worktrees.json`` exists but cannot be read (a
folder in its place, no permission, invalid JSON), the request fails with one
sentence naming the file, and neither file is rewritten: a fresh id or a
records file holding only this worktree would orphan checkpoints.
The permission cases run as an unprivileged user (root reads anything).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import child_env
from repo_helpers import git, init_repo, write

from snapshotd.engine.core import Engine
from snapshotd.errors import (
    NotADirectory,
    NotFound,
    PathOutsideWorktree,
    SnapshotdError,
    StateUnreadable,
)
from snapshotd.store.identities import Identities
from snapshotd.store.identity import Records, identify, locate

NOBODY = 65534


def records_file() -> Path:
    return Path(os.environ["SNAPSHOTD_HOME"], "worktrees.json")


async def test_an_id_path_that_is_a_folder_is_an_error_not_a_new_id(engine: Engine, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    await engine.call("checkpoint", {"path": str(repo)})
    id_file = repo / ".git" / "snapshotd" / "id"
    old_id = id_file.read_text()
    records_before = records_file().read_bytes()
    id_file.unlink()
    id_file.mkdir()
    with pytest.raises(StateUnreadable) as caught:
        await Engine().call("checkpoint", {"path": str(repo)})
    assert str(id_file) in caught.value.message and "is a directory" in caught.value.message
    assert id_file.is_dir() and list(id_file.iterdir()) == []
    assert records_file().read_bytes() == records_before
    id_file.rmdir()
    id_file.write_text(old_id)
    again = await Engine().call("open", {"path": str(repo)})
    assert again["worktree"]["id"] == old_id.strip()


async def test_invalid_records_are_an_error_and_are_not_rewritten(engine: Engine, tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    write(folder / "a.txt", "a\n")
    repo = init_repo(tmp_path / "repo", ("b.txt", "b\n"))
    await engine.call("checkpoint", {"path": str(folder)})
    broken = records_file().read_bytes()[:-5]
    records_file().write_bytes(broken)
    for target in (folder, repo):
        with pytest.raises(StateUnreadable) as caught:
            await Engine().call("checkpoint", {"path": str(target)})
        assert str(records_file()) in caught.value.message and "not valid JSON" in caught.value.message
        assert records_file().read_bytes() == broken


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A folder the unprivileged user owns, under a path it can reach (not pytest's 0700 tree)."""
    folder = Path(tempfile.mkdtemp(prefix="snapshotd-nobody-"))
    os.chmod(folder, 0o755)
    os.chown(folder, NOBODY, NOBODY)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def as_nobody(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``snapshotd --embedded --json ARGS`` as the unprivileged user, with its home in ``folder``."""
    env = child_env(HOME=str(folder), SNAPSHOTD_HOME=str(folder / "home"), XDG_CONFIG_HOME=str(folder / ".config"))
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return subprocess.run(
        [*command, sys.executable, "-m", "snapshotd", "--embedded", "--json", *args],
        cwd=folder, env=env, capture_output=True, text=True, timeout=60, check=False,
    )


def state_error(failed: subprocess.CompletedProcess[str]) -> dict:
    """The ``state_unreadable`` error a command printed as JSON, having exited 1."""
    assert failed.returncode == 1, failed.stderr
    error = json.loads(failed.stdout)["error"]
    assert error["data"]["kind"] == "state_unreadable"
    return error


def chown_tree(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), NOBODY, NOBODY)


def test_an_unreadable_id_is_an_error_not_a_new_id(nobody_dir: Path) -> None:
    repo = init_repo(nobody_dir / "repo", ("a.txt", "a\n"))
    chown_tree(nobody_dir)
    first = as_nobody(nobody_dir, "checkpoint", str(repo))
    assert first.returncode == 0, first.stderr
    id_file = repo / ".git" / "snapshotd" / "id"
    old_id = id_file.read_text()
    records = nobody_dir / "home" / "worktrees.json"
    records_before = records.read_bytes()
    os.chmod(id_file, 0o000)
    error = state_error(as_nobody(nobody_dir, "checkpoint", str(repo)))
    assert str(id_file) in error["message"] and "permission denied" in error["message"]
    assert id_file.read_text() == old_id and records.read_bytes() == records_before
    os.chmod(id_file, 0o600)
    listed = as_nobody(nobody_dir, "list", str(repo))
    assert [cp["worktree"] for cp in json.loads(listed.stdout)["checkpoints"]] == [old_id.strip()]


def test_unreadable_records_are_an_error_and_are_not_rewritten(nobody_dir: Path) -> None:
    folder = nobody_dir / "plain"
    write(folder / "a.txt", "a\n")
    chown_tree(nobody_dir)
    assert as_nobody(nobody_dir, "checkpoint", str(folder)).returncode == 0
    records = nobody_dir / "home" / "worktrees.json"
    before = records.read_bytes()
    os.chmod(records, 0o000)
    error = state_error(as_nobody(nobody_dir, "checkpoint", str(folder)))
    assert str(records) in error["message"]
    assert records.read_bytes() == before and os.stat(records).st_mode & 0o777 == 0


def test_two_first_sights_at_once_agree_on_one_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process creates the id between this one's read and its claim: the id is kept, not replaced.

    Replacing it gave two engines meeting a new worktree at once two ids, and the
    checkpoints made under the first one vanished from ``list``.
    """
    from snapshotd.store import identity as worktree

    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    records = worktree.Records(Path(os.environ["SNAPSHOTD_HOME"]))
    first = worktree.identify(worktree.locate(str(repo)), records)
    real_read = worktree.read_id
    stale = [None]  # the other process had not yet written the id when this one looked
    monkeypatch.setattr(worktree, "read_id", lambda fd, folder: stale.pop() if stale else real_read(fd, folder))
    second = worktree.identify(worktree.locate(str(repo)), records)
    assert second.id == first.id
    assert (repo / ".git" / "snapshotd" / "id").read_text().strip() == first.id


# --------------------------------------------------------------------------- locate and identify, directly


def test_locate_finds_the_worktree_as_git_does(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "r", ("sub/a.txt", "a\n"))
    found = locate(str(repo / "sub"))
    assert found.root == git(repo / "sub", "rev-parse", "--show-toplevel")
    assert found.git_dir == found.common_dir == str(repo / ".git")
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "--detach", str(linked))
    found = locate(str(linked))
    assert (found.root, found.git_dir) == (str(linked), git(linked, "rev-parse", "--absolute-git-dir"))
    assert found.common_dir == str(repo / ".git")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert (locate(str(plain)).git_dir, locate(str(plain)).root) == (None, str(plain))
    with pytest.raises(PathOutsideWorktree):
        locate(str(repo / ".git"))
    with pytest.raises(NotADirectory):
        locate(str(repo / "sub" / "a.txt"))


def test_identify_keeps_one_id_per_worktree_and_stores_linked_ones_in_the_common_dir(tmp_path: Path) -> None:
    records = Records(tmp_path / "home")
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "--detach", str(linked))
    main = identify(locate(str(repo)), records)
    assert identify(locate(str(repo)), records).id == main.id
    assert (repo / ".git" / "snapshotd" / "id").read_text().strip() == main.id
    assert (main.kind, main.store_dir) == ("git", str(repo / ".git"))
    side = identify(locate(str(linked)), records)
    assert side.id != main.id and side.store_dir == str(repo / ".git")
    plain = tmp_path / "plain"
    plain.mkdir()
    folder = identify(locate(str(plain)), records)
    assert folder.kind == "plain" and identify(locate(str(plain)), records).id == folder.id
    assert git(folder.store_dir, "rev-parse", "--is-bare-repository") == "true"


async def test_a_bare_repository_is_refused_as_git_refuses_it(engine: Engine, tmp_path: Path) -> None:
    """A bare repository has no worktree: git says so, and nothing of it is captured as a plain folder."""
    source = init_repo(tmp_path / "src", ("a.txt", "a\n"))
    bare = tmp_path / "b.git"
    git(tmp_path, "clone", "-q", "--bare", str(source), str(bare))
    assert git(bare, "rev-parse", "--is-bare-repository") == "true"
    listing_before = sorted(p.relative_to(bare) for p in bare.rglob("*"))
    for inside in (bare, bare / "refs" / "heads"):
        with pytest.raises(PathOutsideWorktree) as caught:
            await engine.call("checkpoint", {"path": str(inside)})
        assert "bare repository" in caught.value.message and str(bare) in caught.value.message
    assert sorted(p.relative_to(bare) for p in bare.rglob("*")) == listing_before
    assert not records_file().exists() or str(bare) not in records_file().read_text()


async def test_a_linked_worktree_whose_repository_moved_says_so_and_points_to_repair(
    engine: Engine, tmp_path: Path
) -> None:
    repo = init_repo(tmp_path / "main", ("a.txt", "a\n"))
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "--detach", str(linked))
    first = await engine.call("checkpoint", {"path": str(linked)})
    os.rename(repo, tmp_path / "main-moved")
    records_before = records_file().read_text()
    with pytest.raises(NotFound) as caught:
        await Engine().call("checkpoint", {"path": str(linked)})
    message = caught.value.message
    assert str(linked) in message and "is gone" in message and "snapshotd repair" in message
    assert records_file().read_text() == records_before  # not taken for a new plain folder
    git(tmp_path / "main-moved", "worktree", "repair", str(linked))  # as the error says
    again = await Engine().call("checkpoint", {"path": str(linked)})
    assert again["checkpoint"]["worktree"] == first["checkpoint"]["worktree"]


def test_an_identity_kept_is_given_again_only_while_nothing_identify_reads_changed(tmp_path: Path) -> None:
    records = Records(tmp_path / "home")
    identities = Identities(records)
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "--detach", str(linked))
    state = Path(git(linked, "rev-parse", "--absolute-git-dir"), "snapshotd")

    def same_as_identify(path: Path) -> str:
        kept = identities.identify(locate(str(path)))
        assert kept == identify(locate(str(path)), records)
        return kept.id

    first = [same_as_identify(path) for path in (repo, linked, repo, linked, repo, linked)]
    assert first == [first[0], first[1]] * 3 and first[0] != first[1]
    # Another id put in place (by rename, as snapshotd writes it): the new one.
    (state / "new-id").write_text("wt_00000000000000aa\n")
    os.replace(state / "new-id", state / "id")
    assert [same_as_identify(linked) for _ in range(3)] == ["wt_00000000000000aa"] * 3
    # The record dropped by another process: written again.
    data = json.loads(records.path.read_text())
    data.pop("wt_00000000000000aa")
    records.path.with_suffix(".new").write_text(json.dumps(data))
    os.replace(records.path.with_suffix(".new"), records.path)
    assert identities.identify(locate(str(linked))).id == "wt_00000000000000aa"
    assert "wt_00000000000000aa" in json.loads(records.path.read_text())
    # Its state folder opened to others: as identify answers it (made private again, or refused).
    state.chmod(0o755)
    try:
        got: object = identities.identify(locate(str(linked)))
    except SnapshotdError as exc:
        got = type(exc)
    try:
        expected: object = identify(locate(str(linked)), records)
    except SnapshotdError as exc:
        expected = type(exc)
    assert got == expected
    state.chmod(0o700)
    same_as_identify(linked)
    # Its id made a folder: refused, as identify refuses it.
    (state / "id").unlink()
    (state / "id").mkdir()
    with pytest.raises(StateUnreadable):
        identities.identify(locate(str(linked)))
