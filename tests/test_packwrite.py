"""Many new objects of one capture go into one pack that git reads as its own; a few stay loose files."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pygit2
import pytest
from capture_helpers import assert_matches_git, checkpoint
from repo_helpers import git, git_bytes, loose_objects

from snapshotd.git import bodies, loose
from snapshotd.git.packwrite import PackedObject, entry_header, prepare_pack


def make_repo(root: Path) -> Path:
    root.mkdir(parents=True)
    git(root, "init", "-q")
    (root / "a.txt").write_text("a\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


def packs(repo: Path) -> set[str]:
    return {name for name in os.listdir(repo / ".git" / "objects" / "pack") if name.endswith(".pack")}


def object_of(kind: str, body: bytes) -> PackedObject:
    return PackedObject(hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).digest(), kind, body)


@pytest.mark.parametrize("size", [0, 1, 15, 16, 127, 2047, 2048, 70_000, 1_100_000])
def test_an_entry_header_is_read_back_by_git_at_each_size_boundary(tmp_path: Path, size: int) -> None:
    """Sizes around each 4- and 7-bit step of the header, written in a pack git verifies and reads."""
    repo = make_repo(tmp_path / "r")
    body = bytes(index % 251 for index in range(size))
    item = object_of("blob", body)
    prepared = prepare_pack(str(repo / ".git" / "objects" / "pack"), [item])
    prepared.publish()
    git(repo, "verify-pack", prepared.paths[1])
    assert git(repo, "cat-file", "-s", item.raw_id.hex()).strip() == str(size)
    assert git_bytes(repo, "cat-file", "blob", item.raw_id.hex()) == body
    assert len(entry_header("blob", size)) == 1 + max(0, (size.bit_length() - 4 + 6) // 7)


def test_a_pack_of_every_kind_is_git_s_own(tmp_path: Path) -> None:
    """Blobs, a tree naming them and a commit of it: git verifies the pack, fsck finds nothing, libgit2 reads all."""
    repo = make_repo(tmp_path / "r")
    blobs = [object_of("blob", f"file {index}\n".encode()) for index in range(40)]
    tree_body = bodies.tree_body(
        sorted((f"f{index:02}".encode(), 0o100644, blob.raw_id) for index, blob in enumerate(blobs))
    )
    tree = object_of("tree", tree_body)
    commit = object_of("commit", (
        f"tree {tree.raw_id.hex()}\nauthor a <a@b> 1700000000 +0000\ncommitter a <a@b> 1700000000 +0000\n\nm\n"
    ).encode())
    prepared = prepare_pack(str(repo / ".git" / "objects" / "pack"), [commit, *blobs, tree])
    assert not any(os.path.exists(path) for path in prepared.paths)  # nothing in place before publish
    prepared.publish()
    assert not [name for name in os.listdir(repo / ".git" / "objects" / "pack") if name.startswith("tmp_")]
    verified = git(repo, "verify-pack", "-v", prepared.paths[1])
    assert "chain length" not in verified  # every object whole
    git(repo, "fsck", "--strict", "--no-dangling")
    assert git(repo, "ls-tree", "--name-only", commit.raw_id.hex()).split() == [f"f{index:02}" for index in range(40)]
    store = pygit2.Repository(str(repo))
    assert store[pygit2.Oid(raw=blobs[7].raw_id)].data == b"file 7\n"


def test_a_pack_that_cannot_be_written_leaves_nothing_behind(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    folder = repo / ".git" / "objects" / "pack"
    before = set(os.listdir(folder))
    with pytest.raises(KeyError):
        prepare_pack(str(folder), [object_of("blob", b"x"), PackedObject(b"\1" * 20, "no such kind", b"")])
    assert set(os.listdir(folder)) == before


async def test_a_capture_of_many_new_files_writes_one_pack_and_equals_git(watched_engine, tmp_path: Path) -> None:
    """Many new files: one pack, none of their blobs loose; the tree is git's; the store passes fsck; a restore
    of the files from that checkpoint reads them back."""
    repo = make_repo(tmp_path / "r")
    await checkpoint(watched_engine, repo)
    packs_before, loose_before = packs(repo), loose_objects(repo)
    (repo / "generated").mkdir()
    for index in range(loose.PACK_AT_LEAST * 3):
        (repo / "generated" / f"g{index}.txt").write_text(f"generated {index}\n")
    result = await checkpoint(watched_engine, repo)
    assert_matches_git(repo, result)
    assert len(packs(repo) - packs_before) == 1
    blob_ids = {git(repo, "hash-object", str(path)).strip() for path in (repo / "generated").iterdir()}
    assert not blob_ids & loose_objects(repo)
    assert len(loose_objects(repo) - loose_before) <= 4  # the trees, the commit and its pin
    git(repo, "fsck", "--strict", "--no-dangling")
    for path in (repo / "generated").iterdir():
        path.write_text("changed\n")
    await watched_engine.call("restore", {"path": str(repo), "checkpoint": result["checkpoint"]["id"]})
    assert (repo / "generated" / "g5.txt").read_text() == "generated 5\n"


async def test_a_capture_of_a_few_new_files_writes_them_loose(watched_engine, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    await checkpoint(watched_engine, repo)
    packs_before = packs(repo)
    for index in range(3):
        (repo / f"n{index}.txt").write_text(f"new {index}\n")
    result = await checkpoint(watched_engine, repo)
    assert_matches_git(repo, result)
    assert packs(repo) == packs_before
    assert git(repo, "hash-object", str(repo / "n1.txt")).strip() in loose_objects(repo)


async def test_a_capture_holding_more_than_its_limit_writes_a_pack_each_time_it_is_reached(
    watched_engine, tmp_path: Path, monkeypatch
) -> None:
    """Past ``PENDING_BYTES`` of bodies the batch writes what it holds at once; the capture is whole all the same."""
    monkeypatch.setattr(loose, "PENDING_BYTES", 4096)
    repo = make_repo(tmp_path / "r")
    await checkpoint(watched_engine, repo)
    packs_before = packs(repo)
    (repo / "big").mkdir()
    for index in range(60):
        (repo / "big" / f"b{index}.txt").write_text(f"{index}\n" * 100)  # about 300 bytes each
    result = await checkpoint(watched_engine, repo)
    assert_matches_git(repo, result)
    assert len(packs(repo) - packs_before) >= 3
    git(repo, "fsck", "--strict", "--no-dangling")
