"""Objects written from Python are git's own, and a ref names only objects already on disk."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pygit2
import pytest
from repo_helpers import git

from snapshotd.capture.treeedit import edit_tree
from snapshotd.git import bodies, flush, loose
from snapshotd.git.libgit import LibgitRepository
from snapshotd.git.modes import MODE_EXEC, MODE_FILE, MODE_LINK, MODE_TREE
from snapshotd.store.checkpoints import Store


def make_repo(root: Path) -> Path:
    root.mkdir(parents=True)
    git(root, "init", "-q")
    (root / "a").mkdir()
    (root / "a" / "x.txt").write_text("x\n")
    (root / "a-b.txt").write_text("sorts between a and a/\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    os.symlink("a/x.txt", root / "link")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


def test_trees_blobs_and_commits_are_the_ones_git_and_libgit2_write(tmp_path):
    root = make_repo(tmp_path / "r")
    repo = pygit2.Repository(str(root))
    head_tree = repo.head.peel(pygit2.Tree)
    entries = [(entry.raw_name, entry.filemode, entry.id.raw) for entry in head_tree]
    assert {mode for _, mode, _ in entries} == {MODE_TREE, MODE_FILE, MODE_EXEC, MODE_LINK}
    assert loose.write_object(repo.path, "tree", bodies.tree_body(reversed(entries))) == head_tree.id
    blob = loose.write_object(repo.path, "blob", b"new content\n")
    assert str(blob) == git(root, "hash-object", "--stdin", input=b"new content\n").strip()
    assert git(root, "cat-file", "-p", str(blob)).strip() == "new content"

    store = LibgitRepository(repo.path)
    signature = pygit2.Signature("snapshotd", "snapshotd@localhost", 1700000000, 0)
    parents = [repo.head.target]
    ours = store.create_commit(None, signature, signature, "message\n\nbody\n", head_tree.id, parents)
    libgit2 = pygit2.Repository.create_commit(store, None, signature, signature, "message\n\nbody\n", head_tree.id, parents)
    assert ours == libgit2

    edited, written = edit_tree(repo, head_tree.id, {"a/new.txt": (blob, MODE_FILE), "run.sh": None})
    git(root, "read-tree", edited)  # the edit through git's own index, then back to HEAD below
    listed = git(root, "ls-files", "-s")
    git(root, "read-tree", "HEAD")
    assert "a/new.txt" in listed and "run.sh" not in listed and len(written) == 2
    git(root, "fsck", "--strict", "--no-dangling")  # fails the test on any complaint


def test_checkpoints_recorded_together_or_at_once_share_one_flush(tmp_path, monkeypatch):
    root = make_repo(tmp_path / "r")
    flushes: list[float] = []

    real_flush = loose._flush

    def slow_flush():
        flushes.append(time.monotonic())
        time.sleep(0.2)
        real_flush()

    monkeypatch.setattr(loose, "_flush", slow_flush)
    repo = LibgitRepository(str(root / ".git"))
    blob = loose.write_object(repo.path, "blob", b"a turn's edit\n")
    tree, _ = edit_tree(repo, repo.head.peel(pygit2.Tree).id, {"turn.txt": (blob, MODE_FILE)})
    requests = [(f"s{index}", f"label {index}", ()) for index in range(5)]
    made = Store(repo).record_many(worktree_id="w", requests=requests, tree=tree, base=str(repo.head.target))
    assert len(flushes) == 1  # five commits and pins written, one flush, five refs swapped
    assert [(cp.session, cp.label, cp.seq, cp.tree) for cp in made] == [(s, lbl, 1, tree) for s, lbl, _ in requests]

    flushes.clear()
    threads = [threading.Thread(target=loose.make_durable, args=(repo.path,)) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 1 <= len(flushes) <= 2  # the first, then one for all who asked while it ran


def loose_files(git_dir: str) -> set[str]:
    objects = os.path.join(git_dir, "objects")
    return {
        os.path.join(objects, folder, name)
        for folder in os.listdir(objects)
        if len(folder) == 2
        for name in os.listdir(os.path.join(objects, folder))
    }


def reachable(repo: pygit2.Repository, start: pygit2.Oid) -> set[pygit2.Oid]:
    """Every object the commit ``start`` reaches: commits, trees, blobs."""
    seen: set[pygit2.Oid] = set()
    todo = [start]
    while todo:
        oid = todo.pop()
        if oid in seen:
            continue
        seen.add(oid)
        obj = repo[oid]
        if isinstance(obj, pygit2.Commit):
            todo.extend([obj.tree_id, *obj.parent_ids])
        elif isinstance(obj, pygit2.Tree):
            todo.extend(entry.id for entry in obj)
    return seen


@pytest.mark.parametrize("journaled", [False, True], ids=["folders-fsynced", "renames-journaled"])
def test_a_record_fsyncs_each_object_it_wrote_and_its_folder_before_the_ref_names_it(tmp_path, monkeypatch, journaled):
    """Where a file's fsync makes its rename durable too (a journaled ext4, xfs), its folder is not fsynced."""
    monkeypatch.setattr(loose, "fsync_covers_rename", lambda path: journaled)
    monkeypatch.setattr(loose, "_renames_covered", {})
    root = make_repo(tmp_path / "r")
    repo = LibgitRepository(str(root / ".git"))
    events: list[tuple[str, str]] = []
    real_fsync, real_swap, real_writeback = os.fsync, LibgitRepository.swap_ref, flush.start_writeback

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def start_writeback(fd):
        events.append(("writeback", os.readlink(f"/proc/self/fd/{fd}")))
        real_writeback(fd)

    def swap_ref(self, name, new, expected):
        events.append(("ref", name))
        real_swap(self, name, new, expected)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(flush, "start_writeback", start_writeback)
    monkeypatch.setattr(LibgitRepository, "swap_ref", swap_ref)
    monkeypatch.setattr(loose, "sync_filesystem", lambda path: events.append(("syncfs", str(path))))
    before = loose_files(repo.path)
    loose.make_durable(repo.path)  # nothing written yet: nothing flushed
    assert events == []

    blob = loose.write_object(repo.path, "blob", b"a turn's edit\n")
    tree, _ = edit_tree(repo, repo.head.peel(pygit2.Tree).id, {"a/turn.txt": (blob, MODE_FILE)})
    [first] = Store(repo).record_many(worktree_id="w", requests=[("s", "one", ())], tree=tree, base=None)
    ref = next(name for kind, name in events if kind == "ref")
    written = loose_files(repo.path) - before
    named = {os.path.join(repo.path, "objects", str(oid)[:2], str(oid)[2:]) for oid in reachable(repo, repo.resolve_ref(ref))}
    assert written and written <= {os.path.normpath(path) for path in named}  # the ref names all that was written
    swapped = events.index(("ref", ref))
    flushed = {path for kind, path in events[:swapped] if kind == "fsync"}
    assert written <= flushed  # each file, before the ref names it
    folders = {os.path.dirname(path) for path in written}
    if journaled:
        assert not folders & flushed and all(not os.path.isdir(path) for path in flushed)
    else:
        assert folders <= flushed  # and each folder it was renamed into
    first_fsync = next(i for i, (kind, _) in enumerate(events) if kind == "fsync")
    assert written <= {path for kind, path in events[:first_fsync] if kind == "writeback"}  # one commit for all
    assert all(kind != "syncfs" for kind, _ in events)  # the file system is not flushed whole
    assert all(kind != "fsync" or path not in written for kind, path in events[swapped:])

    events.clear()  # a clean checkpoint: its commit and pin, and their folders
    kept = loose_files(repo.path)
    Store(repo).record_many(worktree_id="w", requests=[("s", "two", ())], tree=first.tree, base=None)
    new = loose_files(repo.path) - kept
    fsynced = [path for kind, path in events if kind == "fsync"]
    assert len(new) == 2 and new <= set(fsynced) and len(fsynced) <= (2 if journaled else 2 + 2 + 1)
    assert events[-1][0] == "ref"


def test_objects_libgit2_writes_are_flushed_with_the_file_system_once(tmp_path, monkeypatch):
    root = make_repo(tmp_path / "r")
    repo = LibgitRepository(str(root / ".git"))
    synced: list[str] = []
    monkeypatch.setattr(loose, "sync_filesystem", synced.append)
    with loose.written_elsewhere(repo.path):
        repo.create_blob(b"streamed by libgit2\n")
        loose.make_durable(repo.path)  # a flush while a write elsewhere is under way
        assert len(synced) == 1
    loose.make_durable(repo.path)  # and one after it
    loose.make_durable(repo.path)
    assert synced == [os.path.normpath(repo.path)] * 2


def test_a_store_deleted_after_it_was_written_does_not_stop_the_flushes_of_others(tmp_path, monkeypatch):
    gone = LibgitRepository(str(make_repo(tmp_path / "gone") / ".git"))
    with loose.written_elsewhere(gone.path):
        gone.create_blob(b"libgit2's\n")
    loose.write_object(gone.path, "blob", b"ours\n")
    git(tmp_path, "init", "-q", "kept")
    kept = LibgitRepository(str(tmp_path / "kept" / ".git"))
    import shutil

    shutil.rmtree(tmp_path / "gone")
    blob = loose.write_object(kept.path, "blob", b"kept's\n")
    loose.make_durable(kept.path)  # neither the store nor its files are there: nothing of theirs to flush
    assert kept.odb.exists(blob) and loose._written.files == [] and loose._written.elsewhere == set()


def test_an_object_found_present_is_freshened_so_a_gc_does_not_prune_it_as_old(tmp_path):
    root = make_repo(tmp_path / "r")
    git_dir = str(root / ".git")
    oid = loose.write_object(git_dir, "blob", b"kept for a checkpoint\n")
    path = root / ".git" / "objects" / str(oid)[:2] / str(oid)[2:]
    month_ago = time.time() - 30 * 86400
    os.utime(path, (month_ago, month_ago))
    assert str(oid) in git(root, "prune", "--expire=2.weeks.ago", "--dry-run")  # unreachable and old: git would
    assert loose.write_object(git_dir, "blob", b"kept for a checkpoint\n") == oid
    assert time.time() - path.stat().st_mtime < 60
    assert str(oid) not in git(root, "prune", "--expire=2.weeks.ago", "--dry-run")


@pytest.mark.parametrize(
    ("kind", "journal", "covered"),
    [("xfs", False, True), ("ext4", True, True), ("ext4", False, False), ("tmpfs", False, False), (None, False, False)],
)
def test_a_folder_is_left_unsynced_only_on_a_file_system_known_to_journal_renames(monkeypatch, tmp_path, kind, journal, covered):
    """ext2 and ext3/4 without a journal share the driver's name: only a journal in /proc/fs/jbd2 tells them apart."""
    device = os.stat(tmp_path).st_dev
    block = f"/sys/dev/block/{os.major(device)}:{os.minor(device)}"
    monkeypatch.setattr(flush, "_mounted_kind", lambda dev: kind if dev == device else "ext4")
    monkeypatch.setattr(flush.os, "readlink", lambda path: "../../devices/virtual/block/loop9" if path == block else "?")
    monkeypatch.setattr(flush.os.path, "isdir", lambda path: journal and path == "/proc/fs/jbd2/loop9-8")
    assert flush.fsync_covers_rename(str(tmp_path)) is covered
    assert flush.fsync_covers_rename(str(tmp_path / "missing")) is False


@pytest.mark.skipif(shutil.which("findmnt") is None, reason="util-linux's findmnt, the independent answer, is missing")
@pytest.mark.parametrize("where", ["tmp", "/proc", "/dev"])
def test_the_file_system_type_is_the_one_findmnt_gives(tmp_path, where):
    path = str(tmp_path) if where == "tmp" else where
    told = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", path], capture_output=True, text=True, check=True)
    assert flush._mounted_kind(os.stat(path).st_dev) == told.stdout.strip()
    assert flush._mounted_kind(os.makedev(4095, 1048575)) is None


def test_an_object_folder_a_packing_removes_meanwhile_is_made_again(tmp_path, monkeypatch):
    """``git repack -d`` removes the ``objects/xx`` folders it empties, also one a write has just found present."""
    root = make_repo(tmp_path / "r")
    git_dir = str(root / ".git")
    body = b"written while a packing ran\n"
    oid = str(loose.write_object(git_dir, "blob", body, batch=loose.Batch(git_dir)))  # its id, nothing written
    folder = os.path.join(git_dir, "objects", oid[:2])
    os.makedirs(folder, exist_ok=True)
    real_open, removed = os.open, []

    def packed_then_open(path, *args, **kwargs):  # the folder there, then emptied and removed by git first
        if os.path.dirname(str(path)) == folder and not removed:
            removed.append(folder)
            os.rmdir(folder)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", packed_then_open)
    assert str(loose.write_object(git_dir, "blob", body)) == oid
    monkeypatch.undo()
    assert removed == [folder]
    assert git(root, "cat-file", "blob", oid) == body.decode().rstrip("\n")
    assert [name for name in os.listdir(folder) if name.startswith("tmp_obj_")] == []
