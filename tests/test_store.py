"""The checkpoint store (store/checkpoints.py, store/pins.py), called directly on real repositories.

Each test runs on both back-ends (libgit2 on a SHA-1 repository, the git
command on a SHA-256 one) and checks what git itself then holds.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from repo_helpers import commit_all, git

from snapshotd.errors import GitError, RefRaced, StateUnreadable
from snapshotd.git.repository import Repository, open_repository, repository
from snapshotd.store import pins
from snapshotd.store.checkpoints import Store
from snapshotd.store.lookup import by_prefix
from snapshotd.store.pins import read_pin
from snapshotd.store.refnames import ref_name

WORKTREE = "wt-test"


@pytest.fixture(params=["sha1", "sha256"])
def repo_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A repository with one commit, in either object format."""
    path = tmp_path / "r"
    path.mkdir()
    git(path, "init", "-q", f"--object-format={request.param}", "-b", "trunk")
    (path / "a.txt").write_text("a\n")
    commit_all(path, "first")
    return path


@pytest.fixture
def store(repo_path: Path) -> Iterator[Store]:
    with repository(str(repo_path / ".git")) as repo:
        yield Store(repo)


def tree_of(path: Path, content: str) -> str:
    """The id of a tree holding ``a.txt`` with ``content``, written by git."""
    blob = git(path, "hash-object", "-w", "--stdin", input=content.encode())
    return git(path, "mktree", input=f"100644 blob {blob}\ta.txt\n".encode())


def record(store: Store, path: Path, content: str, session: str | None = None, label: str | None = None):
    return store.record(
        worktree_id=WORKTREE,
        session=session,
        label=label,
        tree=tree_of(path, content),
        base=git(path, "rev-parse", "HEAD"),
    )


def test_record_writes_a_commit_git_reads_back(store: Store, repo_path: Path) -> None:
    first = record(store, repo_path, "one\n", label="first")
    second = record(store, repo_path, "one\n")
    third = record(store, repo_path, "two\n", session="s")
    assert (first.seq, second.seq, third.seq) == (1, 2, 1)
    assert first.changed and not second.changed and second.parent == first.id
    assert git(repo_path, "rev-parse", f"{first.id}^{{tree}}") == first.tree
    assert git(repo_path, "rev-parse", f"{first.id}^") == git(repo_path, "rev-parse", "HEAD")
    assert "Snapshotd-Seq: 1" in git(repo_path, "log", "-1", "--format=%B", first.id)
    pin = git(repo_path, "rev-parse", ref_name(WORKTREE, None))
    assert git(repo_path, "rev-parse", f"{pin}^1") == second.id
    assert git(repo_path, "fsck", "--no-dangling") == ""


def test_list_find_and_head(store: Store, repo_path: Path) -> None:
    first = record(store, repo_path, "one\n")
    second = record(store, repo_path, "two\n")
    other = record(store, repo_path, "three\n", session="s")
    assert [cp.id for cp in store.list(WORKTREE, None, None, all_sessions=False)] == [second.id, first.id]
    assert [cp.id for cp in store.list(WORKTREE, None, 1, all_sessions=False)] == [second.id]
    assert {cp.id for cp in store.list(WORKTREE, None, None, all_sessions=True)} == {first.id, second.id, other.id}
    assert store.head(WORKTREE, "s") == other
    assert by_prefix(store, first.id[:10]) == [first]
    assert by_prefix(store, second.id) == [second]
    assert store.session_refs(WORKTREE) == sorted([ref_name(WORKTREE, None), ref_name(WORKTREE, "s")])
    assert by_prefix(store, git(repo_path, "rev-parse", "HEAD")) == []  # a commit, not a checkpoint


def test_a_prefix_two_blobs_share_matches_no_checkpoint(store: Store, repo_path: Path) -> None:
    checkpoint = record(store, repo_path, "one\n")
    seen: dict[str, bytes] = {}
    number = 0
    while True:  # birthday search: two blobs whose ids share 7 hex digits (~16k hashes)
        data = b"blob %d" % number
        prefix = hashlib.new(store.repo.object_format, b"blob %d\0" % len(data) + data).hexdigest()[:7]
        if prefix in seen:
            break
        seen[prefix] = data
        number += 1
    for content in (seen[prefix], data):
        git(repo_path, "hash-object", "-w", "--stdin", input=content)
    assert len(git(repo_path, "rev-parse", f"--disambiguate={prefix}").split()) == 2
    assert by_prefix(store, prefix) == []
    assert by_prefix(store, checkpoint.id[:12]) == [checkpoint]


def test_rewrite_drops_and_keeps_seq_growing(store: Store, repo_path: Path) -> None:
    cps = [record(store, repo_path, f"{n}\n") for n in range(4)]
    name = ref_name(WORKTREE, None)
    assert store.rewrite(name, drop={cps[1].id}) == 1
    assert [cp.id for cp in store.list(WORKTREE, None, None, all_sessions=False)] == [cps[3].id, cps[2].id, cps[0].id]
    assert not store.is_live(cps[1]) and store.is_live(cps[0])
    assert by_prefix(store, cps[3].id) == [cps[3]]  # kept checkpoints keep their ids
    assert by_prefix(store, cps[1].id) == []
    assert store.rewrite(name, keep=[]) == 3
    assert store.list(WORKTREE, None, None, all_sessions=False) == []
    floor = read_pin(store.repo, store.repo.oid(git(repo_path, "rev-parse", name)))
    assert floor.checkpoint is None and floor.last_seq == 4
    assert record(store, repo_path, "again\n").seq == 5


def test_a_swap_from_a_stale_head_is_raced(store: Store, repo_path: Path) -> None:
    record(store, repo_path, "one\n")
    name = ref_name(WORKTREE, None)
    head = store.ref_target(name)
    record(store, repo_path, "two\n")
    with pytest.raises(RefRaced):
        store.swap(name, None, head)
    assert len(list(store.pins(name))) == 2


def _writer(git_dir: str, path: Path, count: int, ids: list[str], errors: list[BaseException]) -> None:
    """Record ``count`` checkpoints in the default session through its own open repository."""
    repo: Repository = open_repository(git_dir)
    try:
        store = Store(repo)
        for number in range(count):
            ids.append(record(store, path, f"{threading.get_ident()} {number}\n").id)
    except BaseException as exc:  # handed to the test, which fails on it
        errors.append(exc)
    finally:
        repo.close()


def test_two_writers_on_one_session_lose_nothing(repo_path: Path) -> None:
    git_dir = str(repo_path / ".git")
    ids: list[str] = []
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_writer, args=(git_dir, repo_path, 12, ids, errors)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with repository(git_dir) as repo:
        listed = Store(repo).list(WORKTREE, None, None, all_sessions=False)
    assert sorted(cp.id for cp in listed) == sorted(ids) and len(ids) == 24
    assert sorted(cp.seq for cp in listed) == list(range(1, 25))


def test_a_session_ref_that_cannot_be_read_is_an_error_not_a_new_history(store: Store, repo_path: Path) -> None:
    """A damaged ref is refused and left as it is: taking it for "no ref" re-pointed it, orphaning the history."""
    first = record(store, repo_path, "one\n", session="s")
    ref_file = repo_path / ".git" / ref_name(WORKTREE, "s")
    pin = ref_file.read_text()
    ref_file.write_text("not an object id\n")
    with pytest.raises(StateUnreadable) as caught:
        record(store, repo_path, "two\n", session="s")
    assert str(ref_file) in caught.value.message
    assert ref_file.read_text() == "not an object id\n"
    with pytest.raises(StateUnreadable):
        store.list(WORKTREE, "s", None, False)
    ref_file.write_text(pin)
    assert [cp.id for cp in store.list(WORKTREE, "s", None, False)] == [first.id]


HOLD_LOCK = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
print("held", flush=True)
sys.stdin.read()
os.unlink(sys.argv[1])
"""


def test_a_ref_lock_another_process_holds_is_refused_naming_the_lock_file(
    store: Store, repo_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the wait the answer says whose lock, which file and what to do (it was libgit2's text, its tail empty)."""
    first = record(store, repo_path, "one\n", session="s")
    name = ref_name(WORKTREE, "s")
    lock = repo_path / ".git" / (name + ".lock")
    monkeypatch.setattr(pins, "LOCK_WAIT_S", 0.2)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, lock], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(GitError) as caught:
            record(store, repo_path, "two\n", session="s")
    finally:
        holder.communicate(b"")
    assert caught.value.message == (
        f"Could not update {name}: another process held its lock file {lock} for 0.2 s; "
        "retry, and if no git or snapshotd process is running, remove that stale lock file."
    )
    assert [cp.id for cp in store.list(WORKTREE, "s", None, False)] == [first.id]
    second = record(store, repo_path, "two\n", session="s")
    assert [cp.id for cp in store.list(WORKTREE, "s", None, False)] == [second.id, first.id]
