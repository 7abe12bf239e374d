"""Objects written from Python are git's own, and a ref names only objects already on disk."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pygit2
from repo_helpers import git

from snapshotd.capture.treeedit import edit_tree
from snapshotd.git import loose
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
    entries = [(entry.raw_name, entry.filemode, entry.id) for entry in head_tree]
    assert {mode for _, mode, _ in entries} == {MODE_TREE, MODE_FILE, MODE_EXEC, MODE_LINK}
    assert loose.write_object(repo.path, "tree", loose.tree_body(reversed(entries))) == head_tree.id
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

    def slow_flush(path):
        flushes.append(time.monotonic())
        time.sleep(0.2)

    monkeypatch.setattr(loose, "sync_filesystem", slow_flush)
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
