"""Reading checkpoints, straight through ``engine/reads.py``: lookup by id across stores, list, diff.

Real repositories and real stores: checkpoints are recorded with
:class:`Store` and looked up by full id, by prefix, and in whichever store
holds them; an ambiguous prefix and a store that cannot be opened behave as
``show`` and ``restore`` rely on.
"""

from __future__ import annotations

from pathlib import Path

import pygit2
import pytest
from repo_helpers import git, init_repo, write

from snapshotd.contract.refs import parse_ref
from snapshotd.engine import reads
from snapshotd.errors import InvalidParams, NotFound, Unsupported
from snapshotd.git.repository import repository
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.identity import Records, WorktreeInfo, identify, locate


def open_worktree(path: Path, records: Records) -> WorktreeInfo:
    return identify(locate(str(path)), records)


def record(info: WorktreeInfo, session: str | None = None, label: str | None = None) -> Checkpoint:
    """A checkpoint of the worktree's committed tree, recorded in its own store."""
    tree = git(info.path, "rev-parse", "HEAD^{tree}").strip()
    with repository(info.store_dir) as repo:
        return Store(repo).record(worktree_id=info.id, session=session, label=label, tree=tree, base=None)


def find(text: str, stores: list[str], worktree: WorktreeInfo | None = None) -> reads.FoundCheckpoint:
    """``find_checkpoint`` of the reference ``text``, parsed as the edge parses it."""
    return reads.find_checkpoint(parse_ref(text), stores, worktree)


def colliding_blobs() -> tuple[str, bytes, bytes]:
    """Two blob contents whose ids share their first 7 hex digits (a birthday search, ~16k hashes)."""
    seen: dict[str, bytes] = {}
    index = 0
    while True:
        data = b"blob %d" % index
        prefix = str(pygit2.hash(data))[:7]
        if prefix in seen:
            return prefix, seen[prefix], data
        seen[prefix] = data
        index += 1


@pytest.fixture
def records(tmp_path: Path) -> Records:
    return Records(tmp_path / "home")


def test_a_checkpoint_is_found_by_full_id_and_by_prefix_in_the_store_that_holds_it(
    tmp_path: Path, records: Records
) -> None:
    one = open_worktree(init_repo(tmp_path / "one", ("a.txt", "a\n")), records)
    two = open_worktree(init_repo(tmp_path / "two", ("b.txt", "b\n")), records)
    first, second = record(one, label="one"), record(two, label="two")
    stores = [store_dir for store_dir, _ in reads.stores_to_search(records, None)]
    for ref in (second.id, second.id[:7], second.id[:12].upper()):
        found = find(ref, stores)
        assert found.checkpoint == second
        assert Path(found.store.repo.path).resolve() == Path(two.store_dir).resolve()
    store, checkpoint = find(first.id[:9], stores)
    assert checkpoint.label == "one" and Path(store.repo.path).resolve() == Path(one.store_dir).resolve()


def test_stores_are_searched_preferred_first_once_each(tmp_path: Path, records: Records) -> None:
    main = init_repo(tmp_path / "main", ("a.txt", "a\n"))
    git(main, "worktree", "add", "-q", str(tmp_path / "linked"))
    first = open_worktree(main, records)
    linked = open_worktree(tmp_path / "linked", records)
    other = open_worktree(init_repo(tmp_path / "other", ("b.txt", "b\n")), records)
    order = reads.stores_to_search(records, other)
    assert order[0] == (other.store_dir, other.id)
    assert sorted(store_dir for store_dir, _ in order) == sorted({first.store_dir, other.store_dir})
    assert linked.store_dir == first.store_dir  # one store, searched once for both worktrees


def test_a_prefix_two_blobs_share_names_no_checkpoint(tmp_path: Path, records: Records) -> None:
    one = open_worktree(init_repo(tmp_path / "one", ("a.txt", "a\n")), records)
    two = open_worktree(init_repo(tmp_path / "two", ("b.txt", "b\n")), records)
    record(one)
    prefix, first, second = colliding_blobs()
    with repository(two.store_dir) as repo:
        repo.create_blob(first)
        repo.create_blob(second)
    # The preferred store has no such object; the other one has two, neither a checkpoint.
    stores = [store_dir for store_dir, _ in reads.stores_to_search(records, one)]
    with pytest.raises(NotFound, match=f"No checkpoint matches '{prefix}'"):
        find(prefix, stores)


def test_missing_ids_and_unusable_stores(tmp_path: Path, records: Records) -> None:
    info = open_worktree(init_repo(tmp_path / "r", ("a.txt", "a\n")), records)
    checkpoint = record(info)
    not_a_repository = tmp_path / "empty"
    not_a_repository.mkdir()
    stores = [str(not_a_repository), info.store_dir]
    assert find(checkpoint.id, stores).checkpoint == checkpoint  # the broken store is passed over
    blob = git(tmp_path / "r", "rev-parse", "HEAD:a.txt").strip()
    for ref in ("0000000", blob, blob[:8]):
        with pytest.raises(NotFound):
            find(ref, stores)
    with pytest.raises(NotFound, match="No checkpoint matches"):
        find(checkpoint.id, [str(not_a_repository)])
    with pytest.raises(InvalidParams, match="'to' must be a checkpoint reference"):
        parse_ref(7, "to")


def test_a_deleted_checkpoint_is_no_longer_found(tmp_path: Path, records: Records) -> None:
    info = open_worktree(init_repo(tmp_path / "r", ("a.txt", "a\n")), records)
    gone, kept = record(info), record(info)
    with repository(info.store_dir) as repo:
        Store(repo).rewrite(f"refs/snapshotd/{info.id}/default", drop={gone.id})
    with pytest.raises(NotFound):
        find(gone.id, [info.store_dir])
    assert find(kept.id, [info.store_dir]).checkpoint == kept


def test_list_options_select_a_session_and_a_limit(tmp_path: Path, records: Records) -> None:
    info = open_worktree(init_repo(tmp_path / "r", ("a.txt", "a\n")), records)
    made = [record(info, session="a" if index % 2 else "b") for index in range(4)]
    every = reads.list_checkpoints(info, reads.ListOptions.from_params({}))
    assert [cp.id for cp in every.checkpoints] == [cp.id for cp in reversed(made)]
    only_a = reads.list_checkpoints(info, reads.ListOptions.from_params({"session": "a", "limit": 1}))
    assert only_a.to_wire() == {"checkpoints": [made[3].to_wire()]}
    with pytest.raises(InvalidParams):
        reads.ListOptions.from_params({"limit": -1})


def test_diff_sides_of_one_store_and_of_two(tmp_path: Path, records: Records) -> None:
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    info = open_worktree(repo, records)
    before = record(info)
    write(repo / "a.txt", "changed\n")
    git(repo, "commit", "-qam", "change")
    after = record(info)
    options = reads.DiffOptions.from_params({"from": before.id, "to": after.id, "paths": [str(repo / "a.txt")]})
    result = reads.diff_sides(
        reads.DiffSide(before.tree, info.store_dir, before), reads.DiffSide(after.tree, info.store_dir, after),
        options, info,
    )
    wire = result.to_wire()
    assert [(f["path"], f["status"]) for f in wire["files"]] == [("a.txt", "modified")]
    assert "cross_worktree" not in wire
    other = open_worktree(init_repo(tmp_path / "other", ("a.txt", "a\n")), records)
    elsewhere = record(other)
    with pytest.raises(Unsupported, match="different repositories"):
        reads.diff_sides(
            reads.DiffSide(before.tree, info.store_dir, before),
            reads.DiffSide(elsewhere.tree, other.store_dir, elsewhere),
            options, info,
        )
    with pytest.raises(InvalidParams, match="'from' is required"):
        reads.DiffOptions.from_params({"to": after.id})


def test_a_diff_between_two_worktrees_of_one_store_says_so(tmp_path: Path, records: Records) -> None:
    main = init_repo(tmp_path / "main", ("a.txt", "a\n"))
    git(main, "worktree", "add", "-q", str(tmp_path / "linked"))
    first = open_worktree(main, records)
    linked = open_worktree(tmp_path / "linked", records)
    write(tmp_path / "linked" / "a.txt", "linked\n")
    git(tmp_path / "linked", "commit", "-qam", "linked")
    ours, theirs = record(first), record(linked)
    options = reads.DiffOptions.from_params({"from": ours.id, "to": theirs.id})
    result = reads.diff_sides(
        reads.DiffSide(ours.tree, first.store_dir, ours), reads.DiffSide(theirs.tree, linked.store_dir, theirs),
        options, first,
    )
    assert result.cross_worktree and result.to_wire()["cross_worktree"] is True
    assert [f["path"] for f in result.to_wire()["files"]] == ["a.txt"]
