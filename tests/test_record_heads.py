"""Recording on a kept head (store/heads.py): the checkpoint returned is the one git holds, and a ref moved
by anyone else is read again.

A store given a :class:`HeadCache` (as a worktree's open store is) keeps each session's head pin from one
record to the next. Each test moves the session's ref another way behind its back (another store, ``git
update-ref``, a drop or delete, a fetch) and checks the next checkpoint against what git then holds: its seq
follows the head pin's highest seq, its previous checkpoint is the head pin's, and its pin is chained on the
head pin, as a store that keeps nothing records it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from repo_helpers import commit_all, git

from snapshotd.git.repository import Repository, repository
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.heads import HeadCache
from snapshotd.store.pins import read_pin
from snapshotd.store.refnames import ref_name

WORKTREE = "wt-heads"
NAME = ref_name(WORKTREE, "s")


@pytest.fixture(params=["sha1", "sha256"])
def repo_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / "r"
    path.mkdir()
    git(path, "init", "-q", f"--object-format={request.param}", "-b", "trunk")
    (path / "a.txt").write_text("a\n")
    commit_all(path, "first")
    return path


@pytest.fixture
def repo(repo_path: Path) -> Iterator[Repository]:
    with repository(str(repo_path / ".git")) as opened:
        yield opened


def tree_of(path: Path, content: str) -> str:
    blob = git(path, "hash-object", "-w", "--stdin", input=content.encode())
    return git(path, "mktree", input=f"100644 blob {blob}\ta.txt\n".encode())


def record(store: Store, path: Path, content: str = "a\n", session: str | None = "s", **kw: object) -> Checkpoint:
    return store.record(
        worktree_id=WORKTREE,
        session=session,
        label=kw.get("label", f"saw {content!r}"),  # type: ignore[arg-type]
        tree=tree_of(path, content),
        base=git(path, "rev-parse", "HEAD"),
        agent=kw.get("agent", ()),  # type: ignore[arg-type]
    )


def recorded_on_head(store: Store, path: Path, content: str) -> Checkpoint:
    """Record on whatever the ref names now, and check the checkpoint and its pin against that head."""
    target = store.ref_target(NAME)
    head = None if target is None else read_pin(store.repo, target)
    checkpoint = record(store, path, content)
    assert checkpoint.seq == (head.last_seq if head else 0) + 1
    assert checkpoint.parent == (str(head.checkpoint) if head and head.checkpoint else None)
    pin = read_pin(store.repo, store.ref_target(NAME))  # type: ignore[arg-type]
    assert str(pin.checkpoint) == checkpoint.id
    assert pin.previous == (target if head and head.checkpoint else None)
    assert checkpoint == store.load(checkpoint.id)
    return checkpoint


def chain(store: Store) -> list[tuple[int, str | None]]:
    """The session's checkpoints newest first, as a store that keeps nothing reads them: (seq, label)."""
    return [(cp.seq, cp.label) for cp in Store(store.repo).iter_session(NAME)]


def test_the_checkpoint_returned_is_the_one_git_reads_back_field_by_field(repo: Repository, repo_path: Path) -> None:
    store = Store(repo, HeadCache())
    agent = (("tool", "codex"), ("session", "a:b c"), ("tool_use", "t-1"))
    cases = [
        record(store, repo_path, "a\n", label=None),
        record(store, repo_path, "a\n", label="same tree\nsecond line \u00e9", agent=agent),  # changed false
        record(store, repo_path, "b\n", session=None, label='"quoted" \\ label'),
        # Read back rather than built: a subject that reads as a trailer, a line break inside an agent's id.
        record(store, repo_path, "c\n", label="Snapshotd-Agent-Tool: forged"),
        record(store, repo_path, "d\n", agent=(("turn", "one\u2028two"),)),
    ]
    for checkpoint in cases:
        loaded = store.load(checkpoint.id)
        assert dataclasses.asdict(checkpoint) == dataclasses.asdict(loaded)
        assert checkpoint == loaded
    assert [cp.changed for cp in cases[:2]] == [True, False]
    assert cases[1].agent == agent and cases[1].host and cases[1].base == git(repo_path, "rev-parse", "HEAD")
    assert cases[1].parent == cases[0].id and cases[1].seq == 2
    assert ("tool", "forged") in cases[3].agent  # as git reads that message back
    assert cases[4].agent == (("turn", "one"),)


def test_a_ref_another_store_moved_is_read_again(repo: Repository, repo_path: Path) -> None:
    kept = Store(repo, HeadCache())
    record(kept, repo_path, "1\n")
    record(kept, repo_path, "2\n")
    with repository(str(repo_path / ".git")) as other:
        other_cp = record(Store(other, HeadCache()), repo_path, "3\n")
    after = recorded_on_head(kept, repo_path, "4\n")
    assert after.seq == 4 and after.parent == other_cp.id
    assert [seq for seq, _ in chain(kept)] == [4, 3, 2, 1]


def test_a_ref_moved_by_git_update_ref_is_read_again(repo: Repository, repo_path: Path) -> None:
    kept = Store(repo, HeadCache())
    first = record(kept, repo_path, "1\n")
    first_pin = str(kept.ref_target(NAME))
    record(kept, repo_path, "2\n")
    git(repo_path, "update-ref", NAME, first_pin)
    after = recorded_on_head(kept, repo_path, "3\n")
    assert after.seq == 2 and after.parent == first.id
    assert chain(kept) == [(2, "saw '3\\n'"), (1, "saw '1\\n'")]


def test_a_session_dropped_from_or_deleted_behind_the_store_is_read_again(repo: Repository, repo_path: Path) -> None:
    kept = Store(repo, HeadCache())
    first = record(kept, repo_path, "1\n")
    second = record(kept, repo_path, "2\n")
    with repository(str(repo_path / ".git")) as other:
        assert Store(other).rewrite(NAME, drop={second.id}) == 1  # as `delete` and `gc` drop one
    after = recorded_on_head(kept, repo_path, "3\n")
    assert after.seq == 3 and after.parent == first.id
    assert [seq for seq, _ in chain(kept)] == [3, 1]  # the dropped one stays dropped
    with repository(str(repo_path / ".git")) as other:
        Store(other).rewrite(NAME, keep=[])  # every checkpoint dropped: a floor keeps the seq
    floor = recorded_on_head(kept, repo_path, "4\n")
    assert floor.seq == 4 and floor.parent is None and floor.changed
    git(repo_path, "update-ref", "-d", NAME)  # the session's ref deleted: its history starts anew
    anew = recorded_on_head(kept, repo_path, "5\n")
    assert anew.seq == 1 and anew.parent is None and chain(kept) == [(1, "saw '5\\n'")]


def test_a_ref_a_fetch_updated_is_read_again(repo: Repository, repo_path: Path, tmp_path: Path) -> None:
    kept = Store(repo, HeadCache())
    record(kept, repo_path, "1\n")
    record(kept, repo_path, "2\n")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo_path), str(clone))
    git(clone, "fetch", "-q", "origin", "+refs/snapshotd/*:refs/snapshotd/*")
    with repository(str(clone / ".git")) as theirs:
        there = record(Store(theirs), clone, "3\n")
    git(repo_path, "fetch", "-q", str(clone), "+refs/snapshotd/*:refs/snapshotd/*")
    after = recorded_on_head(kept, repo_path, "4\n")
    assert after.seq == 4 and after.parent == there.id
    assert [seq for seq, _ in chain(kept)] == [4, 3, 2, 1]
