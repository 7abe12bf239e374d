"""The two back-ends of snapshotd.git.repository, called directly on real repositories.

Both back-ends open a SHA-1 repository (libgit2 in-process, and the git command
that serves SHA-256 stores), so the same calls can be made on both and must
give the same answers; git itself is the judge on a SHA-256 repository.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pygit2
import pytest
from repo_helpers import commit_all, git

from snapshotd.errors import GitError, NotFound, RefLocked, RefMoved
from snapshotd.git.command import GitRepository
from snapshotd.git.config import config_value
from snapshotd.git.libgit import LibgitRepository
from snapshotd.git.modes import MODE_FILE
from snapshotd.git.repository import (
    Backend,
    Repository,
    _head_by_git,
    _head_by_libgit2,
    libgit2_opens,
    open_repository,
    read_head,
    repository,
)

REF = "refs/snapshotd/test/x"


def make_repo(path: Path, object_format: str = "sha1") -> tuple[Path, str, str]:
    """A repository with two commits on ``trunk``; its path and the two commit ids."""
    path.mkdir()
    git(path, "init", "-q", f"--object-format={object_format}", "-b", "trunk")
    (path / "a.txt").write_text("a\n")
    (path / "sub").mkdir()
    (path / "sub" / "b.txt").write_text("b\n")
    first = commit_all(path, "first")
    (path / "a.txt").write_text("changed\n")
    second = commit_all(path, "second")
    return path, first, second


def open_back_end(name: str, git_dir: str) -> Repository:
    """The repository at ``git_dir`` opened by the back-end ``name`` ("libgit2" or "git")."""
    if name == "libgit2":
        return LibgitRepository(git_dir, pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
    return GitRepository(git_dir)


@pytest.fixture(params=["libgit2", "git"])
def sha1(request: pytest.FixtureRequest, tmp_path: Path):
    """A SHA-1 repository opened by one back-end, with its two commit ids."""
    path, first, second = make_repo(tmp_path / "r")
    with contextlib.closing(open_back_end(request.param, str(path / ".git"))) as opened:
        yield opened, path, first, second


@pytest.fixture(params=["libgit2-sha1", "git-sha1", "git-sha256"])
def any_repo(request: pytest.FixtureRequest, tmp_path: Path):
    """A repository opened by one back-end (SHA-256 only by git), with its two commit ids."""
    back_end, object_format = request.param.split("-")
    path, first, second = make_repo(tmp_path / "r", object_format)
    with contextlib.closing(open_back_end(back_end, str(path / ".git"))) as opened:
        yield opened, path, first, second


def test_open_repository_chooses_by_object_format(tmp_path: Path) -> None:
    old, _, _ = make_repo(tmp_path / "old")
    new, _, _ = make_repo(tmp_path / "new", "sha256")
    assert libgit2_opens(str(old / ".git")) and not libgit2_opens(str(new / ".git"))
    with repository(str(old / ".git")) as repo:
        assert isinstance(repo, LibgitRepository) and repo.in_process and repo.hex_length == 40
    with repository(str(new / ".git")) as repo:
        assert isinstance(repo, GitRepository) and not repo.in_process and repo.hex_length == 64
        assert repo.object_format == "sha256"


def test_each_back_end_has_every_call_of_the_interface(any_repo) -> None:
    repo = any_repo[0]
    members = set(Backend.__annotations__) | {name for name in vars(Backend) if not name.startswith("_")}
    assert {"swap_ref", "in_process", "oid", "flush"} <= members
    assert [name for name in sorted(members) if not hasattr(repo, name)] == []
    assert repo.path.rstrip("/").endswith(".git")


def test_both_back_ends_read_the_same_objects_and_refs(sha1) -> None:
    repo, path, first, second = sha1
    assert repo.hex_length == 40 and repo.object_format == "sha1"
    assert str(repo.resolve_ref("refs/heads/trunk")) == second
    assert repo.resolve_ref("refs/heads/nothing") is None
    assert "refs/heads/trunk" in repo.ref_names("refs/heads/")
    assert repo.ref_names("refs/snapshotd/") == []
    commit = repo[repo.oid(second)]
    assert [str(parent) for parent in commit.parent_ids] == [first]
    assert str(commit.tree_id) == git(path, "rev-parse", "HEAD^{tree}")
    tree = commit.peel(pygit2.Tree)
    entry = tree["sub/b.txt"]
    assert str(entry.id) == git(path, "rev-parse", "HEAD:sub/b.txt")
    assert entry.filemode == MODE_FILE
    assert repo.odb.read_header(repo.oid(str(entry.id)))[1] == 2
    kind, data = repo.odb.read(str(entry.id))
    assert kind == pygit2.enums.ObjectType.BLOB and data == git(path, "cat-file", "blob", str(entry.id)).encode() + b"\n"
    with pytest.raises(KeyError):
        repo.odb.read("0" * 40)
    assert config_value(repo.config, "core.bare") == "false"
    assert config_value(repo.config, "snapshotd.nothing") is None


def test_both_back_ends_write_the_same_commit_ids(tmp_path: Path) -> None:
    path, first, _ = make_repo(tmp_path / "r")
    git_dir = str(path / ".git")
    signature = pygit2.Signature("snapshotd", "snapshotd@localhost", 1_700_000_000, 0)
    tree = git(path, "rev-parse", "HEAD^{tree}")
    ids = []
    for repo in (LibgitRepository(git_dir), GitRepository(git_dir)):
        with contextlib.closing(repo):
            oid = repo.create_commit(None, signature, signature, "pin 1\n", repo.oid(tree), [repo.oid(first)])
            repo.flush()
            ids.append(str(oid))
    assert ids[0] == ids[1]
    assert git(path, "cat-file", "-t", ids[0]) == "commit"
    assert git(path, "rev-parse", f"{ids[0]}^") == first


def test_ref_updates_are_compare_and_swap(any_repo) -> None:
    repo, path, first, second = any_repo
    one, two = repo.oid(first), repo.oid(second)
    repo.swap_ref(REF, one, None)
    with pytest.raises(RefMoved):
        repo.swap_ref(REF, two, None)  # it exists now
    with pytest.raises(RefMoved):
        repo.swap_ref(REF, two, two)
    repo.swap_ref(REF, two, one)
    assert git(path, "rev-parse", REF) == second
    lock = path / ".git" / "refs" / "snapshotd" / "test" / "x.lock"
    lock.write_text("")
    with pytest.raises(RefLocked):
        repo.swap_ref(REF, one, two)
    lock.unlink()
    assert git(path, "rev-parse", REF) == second
    with pytest.raises(RefMoved):
        repo.swap_ref(REF, None, one)
    repo.swap_ref(REF, None, two)
    assert repo.resolve_ref(REF) is None and repo.references.get(REF) is None
    assert git(path, "for-each-ref", "refs/snapshotd/") == ""


def test_a_git_command_back_end_on_sha256_answers_as_git_does(tmp_path: Path) -> None:
    path, first, second = make_repo(tmp_path / "r", "sha256")
    with repository(str(path / ".git")) as repo:
        assert len(second) == 64 and repo.oid(second) == second
        assert repo.resolve_ref("refs/heads/trunk") == second
        assert repo[second].parent_ids == [first]
        assert repo[second].tree["sub/b.txt"].id == git(path, "rev-parse", "HEAD:sub/b.txt")
        repo.swap_ref(REF, second, None)
        with pytest.raises(RefMoved):
            repo.swap_ref(REF, first, first)
        assert repo.ref_names("refs/snapshotd/") == [REF]
    assert git(path, "rev-parse", REF) == second


def test_opening_something_that_is_not_a_repository_is_a_clear_error(tmp_path: Path) -> None:
    """A folder without HEAD, refs and objects is a store gone (not_found); one git cannot read is a git error."""
    with pytest.raises(NotFound, match="changed while it was being opened"):
        open_repository(str(tmp_path))
    (tmp_path / "HEAD").write_text("not a ref\n")
    (tmp_path / "refs").mkdir()
    (tmp_path / "objects").mkdir()
    (tmp_path / "config").write_text("[extensions]\n\tobjectformat = sha256\n")
    with repository(str(tmp_path)) as repo, pytest.raises(GitError):
        repo.ref_names()


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_head_is_read_alike_by_libgit2_and_by_git(tmp_path: Path, object_format: str) -> None:
    path = tmp_path / "r"
    path.mkdir()
    git(path, "init", "-q", f"--object-format={object_format}", "-b", "trunk")
    git_dir = str(path / ".git")
    readers = [_head_by_git] + ([_head_by_libgit2] if object_format == "sha1" else [])

    def heads() -> set[tuple[str | None, str | None]]:
        answers = {read_head(git_dir, str(path))}
        answers |= {reader(git_dir, str(path)) if reader is _head_by_git else reader(git_dir) for reader in readers}
        return answers

    assert heads() == {(None, "trunk")}
    (path / "a.txt").write_text("a\n")
    head = commit_all(path, "first")
    assert heads() == {(head, "trunk")}
    git(path, "pack-refs", "--all")  # the branch now only in packed-refs
    assert not (path / ".git" / "refs" / "heads" / "trunk").exists()
    assert heads() == {(head, "trunk")}
    git(path, "checkout", "-q", "--detach")
    assert heads() == {(head, None)}
    git(path, "symbolic-ref", "HEAD", "refs/heads/none-yet")
    assert heads() == {(None, "none-yet")}


def test_head_of_a_linked_worktree_is_its_own(tmp_path: Path) -> None:
    path, first, second = make_repo(tmp_path / "r")
    linked = tmp_path / "linked"
    git(path, "worktree", "add", "-q", "-b", "side", str(linked), first)
    git_dir = str(path / ".git" / "worktrees" / "linked")
    assert read_head(git_dir, str(linked), str(path / ".git")) == (first, "side")
    assert _head_by_git(git_dir, str(linked)) == (first, "side")
    assert read_head(str(path / ".git"), str(path)) == (second, "trunk")
