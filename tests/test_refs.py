"""Checkpoint references: the grammar (contract/refs.py) and what each form names (engine/reads.py).

Real repositories and stores. Two checkpoints whose ids share 7 hex digits,
and a checkpoint whose prefix a blob shares, are made by searching checkpoint
commit texts (and blob contents) for a collision, then writing and pinning
them as the store does.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from repo_helpers import git, init_repo

from snapshotd.contract.refs import (
    IdPrefix,
    SessionChoice,
    SessionHead,
    SessionSeq,
    WorktreeRef,
    parse_ref,
    ref_param,
    worktree_param,
)
from snapshotd.engine import reads
from snapshotd.errors import Ambiguous, InvalidParams, NotFound
from snapshotd.git.repository import repository
from snapshotd.settings import SAFETY_SESSION
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.identity import Records, WorktreeInfo, identify, locate
from snapshotd.store.pins import now_iso
from snapshotd.store.refnames import ref_name

NEWEST = SessionChoice()


# --- the grammar ---------------------------------------------------------------


def test_every_form_of_the_grammar_parses_to_its_type() -> None:
    hex_id = "ab" * 20
    assert parse_ref(hex_id) == IdPrefix(hex_id, hex_id)
    assert parse_ref("ABCDEF1") == IdPrefix("ABCDEF1", "abcdef1")
    assert parse_ref("@") == SessionHead("@", NEWEST, 0)
    assert parse_ref("@~3") == SessionHead("@~3", NEWEST, 3)
    assert parse_ref("@~") == SessionHead("@~", NEWEST, 1)  # as git's HEAD~
    assert parse_ref("#12") == SessionSeq("#12", NEWEST, 12)
    assert parse_ref("node-t1@") == SessionHead("node-t1@", SessionChoice("node-t1", named=True), 0)
    assert parse_ref("a@b@~2") == SessionHead("a@b@~2", SessionChoice("a@b", named=True), 2)
    # The session param chooses for @ and #N; a session named inline wins.
    chosen = ref_param({"checkpoint": "#2", "session": "s"})
    assert chosen == SessionSeq("#2", SessionChoice("s", named=True), 2)
    assert ref_param({"checkpoint": "t@", "session": "s"}).session == SessionChoice("t", named=True)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("abc12", "too short to name a checkpoint: give at least 7 hex digits"),
        ("a" * 65, "longer than any checkpoint id"),
        ("@~x", "is not a checkpoint reference; give an id"),
        ("HEAD", "is not a checkpoint reference"),
        ("", "is not a checkpoint reference"),
        ("#0", "seq numbers start at 1"),
        ("#-1", "is not a checkpoint reference"),
        ("@~9999999999", "too large"),
        ("bad\tsession@", "control characters"),
    ],
)
def test_what_is_not_a_reference_is_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(InvalidParams, match=why):
        parse_ref(text)


def test_a_reference_that_is_not_a_string_or_is_missing_is_refused() -> None:
    with pytest.raises(InvalidParams, match="'to' must be a checkpoint reference"):
        parse_ref(7, "to")
    with pytest.raises(InvalidParams, match="'from' is required"):
        ref_param({}, "from")


def test_a_worktree_is_named_by_path_or_id_and_read_once_into_its_type() -> None:
    assert worktree_param({}) == WorktreeRef() and not WorktreeRef().named
    named = worktree_param({"path": "/src/app", "worktree": "wt_1", "force": True, "session": "s"})
    assert named == WorktreeRef("/src/app", "wt_1", force=True) and named.named
    assert worktree_param({"worktree": "wt_1", "force": "yes"}) == WorktreeRef(None, "wt_1")  # force is true or absent
    with pytest.raises(InvalidParams, match="'worktree' must be a string, not a number"):
        worktree_param({"worktree": 7})
    with pytest.raises(InvalidParams, match="'path' is a path of"):
        worktree_param({"path": "/" + "a" * 5000})


# --- what the references name ----------------------------------------------------


@pytest.fixture
def info(tmp_path: Path) -> WorktreeInfo:
    return identify(locate(str(init_repo(tmp_path / "r", ("a.txt", "a\n")))), Records(tmp_path / "home"))


def record(info: WorktreeInfo, session: str | None, label: str) -> Checkpoint:
    tree = git(info.path, "rev-parse", "HEAD^{tree}").strip()
    with repository(info.store_dir) as repo:
        return Store(repo).record(worktree_id=info.id, session=session, label=label, tree=tree, base=None)


def find(text: str, info: WorktreeInfo | None, session: str | None = None) -> Checkpoint:
    params = {"checkpoint": text, "session": session}
    stores = [info.store_dir] if info is not None else []
    return reads.find_checkpoint(ref_param(params), stores, info).checkpoint


def test_at_counts_back_in_the_newest_session_and_hash_finds_a_seq(info: WorktreeInfo) -> None:
    s1 = [record(info, "s1", f"s1 {n}") for n in range(3)]
    s2 = [record(info, "s2", f"s2 {n}") for n in range(2)]
    record(info, SAFETY_SESSION, "before restore")  # the newest, but never what @ means unnamed
    assert find("@", info) == s2[1]
    assert find("@~1", info) == s2[0]
    assert find("@", info, session="s1") == s1[2]
    assert find("@~2", info, session="s1") == s1[0]
    assert find("s1@", info) == s1[2] and find("s1@~1", info) == s1[1]
    assert find(f"{SAFETY_SESSION}@", info).label == "before restore"
    assert find("#3", info) == s1[2]  # only s1 has a seq 3
    assert find("#1", info, session="s2") == s2[0]
    with pytest.raises(NotFound, match="has 2 checkpoint"):
        find("@~2", info)
    with pytest.raises(NotFound, match="no checkpoint in session 'nobody'"):
        find("nobody@", info)
    with pytest.raises(NotFound, match="No checkpoint has seq 9"):
        find("#9", info)


def test_a_seq_in_several_sessions_is_ambiguous_with_its_candidates(info: WorktreeInfo) -> None:
    one, two = record(info, "s1", "first of s1"), record(info, "s2", "first of s2")
    with pytest.raises(Ambiguous, match="'#1' is in 2 sessions") as caught:
        find("#1", info)
    candidates = caught.value.data["candidates"]
    assert [(c["id"], c["session"], c["seq"], c["label"]) for c in candidates] == [
        (two.id, "s2", 1, "first of s2"),
        (one.id, "s1", 1, "first of s1"),
    ]
    assert "--session" in caught.value.message


def test_a_relative_reference_needs_a_worktree_and_a_deleted_one_is_gone(info: WorktreeInfo) -> None:
    with pytest.raises(InvalidParams, match="give 'path' or 'worktree'"):
        find("@", None)
    with pytest.raises(NotFound, match="no checkpoint in the worktree"):
        find("@", info)
    gone, kept = record(info, None, "gone"), record(info, None, "kept")
    with repository(info.store_dir) as repo:
        Store(repo).rewrite(ref_name(info.id, None), drop={gone.id})
    assert find("@", info) == kept
    with pytest.raises(NotFound):
        find("#1", info)
    assert find("#2", info) == kept


# --- prefixes match checkpoints only ---------------------------------------------


def _object_id(kind: str, data: bytes) -> str:
    return hashlib.sha1(b"%s %d\0" % (kind.encode(), len(data)) + data).hexdigest()


def _checkpoint_text(info: WorktreeInfo, tree: str, seq: int, label: str) -> bytes:
    """A checkpoint commit as the store writes one (the trailers the store reads back)."""
    created = "2026-12-01T00:00:00.000Z"
    body = (
        f"{label}\n\nSnapshotd-Worktree: {info.id}\nSnapshotd-Session: null\nSnapshotd-Label: \"{label}\"\n"
        f"Snapshotd-Seq: {seq}\nSnapshotd-Previous: none\nSnapshotd-Base: none\nSnapshotd-Created: {created}\n"
        "Snapshotd-Changed: true\n"
    )
    who = "snapshotd <snapshotd@localhost> 1700000000 +0000"
    return f"tree {tree}\nauthor {who}\ncommitter {who}\n\n{body}".encode()


def _pin(info: WorktreeInfo, commits: list[bytes]) -> list[str]:
    """Write the commits and pin them, oldest first, as one session's checkpoints."""
    ids = [git(info.path, "hash-object", "-t", "commit", "-w", "--stdin", input=text).strip() for text in commits]
    with repository(info.store_dir) as repo:
        store = Store(repo)
        name = ref_name(info.id, None)
        head = None
        for seq, commit_id in enumerate(ids, start=1):
            pin = store.write_pin(repo.oid(commit_id), head, seq, now_iso(), seq)
            store.swap(name, pin, head)
            head = pin
    return ids


def test_a_prefix_two_checkpoints_share_is_ambiguous_and_lists_both(info: WorktreeInfo) -> None:
    tree = git(info.path, "rev-parse", "HEAD^{tree}").strip()
    seen: dict[str, int] = {}
    number = 0
    while True:  # a birthday search over checkpoint texts (~16k hashes)
        text = _checkpoint_text(info, tree, 1, f"try {number}")
        prefix = _object_id("commit", text)[:7]
        if prefix in seen:
            break
        seen[prefix] = number
        number += 1
    ids = _pin(info, [_checkpoint_text(info, tree, 1, f"try {seen[prefix]}"), text])
    assert all(each.startswith(prefix) for each in ids), (prefix, ids)
    with pytest.raises(Ambiguous, match=f"The prefix '{prefix}' matches 2 checkpoints") as caught:
        find(prefix, info)
    assert sorted(c["id"] for c in caught.value.data["candidates"]) == sorted(ids)
    assert {c["label"] for c in caught.value.data["candidates"]} == {f"try {seen[prefix]}", f"try {number}"}
    assert find(ids[0][:12], info).id == ids[0]


def test_a_checkpoint_is_found_by_a_prefix_a_blob_shares(info: WorktreeInfo) -> None:
    tree = git(info.path, "rev-parse", "HEAD^{tree}").strip()
    commits: dict[str, bytes] = {}
    blobs: dict[str, bytes] = {}
    number = 0
    while True:  # commit texts against blob contents until one 7-digit prefix is in both
        text = _checkpoint_text(info, tree, 1, f"try {number}")
        blob = b"blob %d" % number
        commit_prefix, blob_prefix = _object_id("commit", text)[:7], _object_id("blob", blob)[:7]
        commits[commit_prefix], blobs[blob_prefix] = text, blob
        prefix = commit_prefix if commit_prefix in blobs else blob_prefix if blob_prefix in commits else None
        if prefix is not None:
            break
        number += 1
    (checkpoint_id,) = _pin(info, [commits[prefix]])
    blob_id = git(info.path, "hash-object", "-w", "--stdin", input=blobs[prefix]).strip()
    assert blob_id.startswith(prefix) and checkpoint_id.startswith(prefix)
    assert find(prefix, info).id == checkpoint_id
