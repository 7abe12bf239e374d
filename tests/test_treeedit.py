"""Editing a tree by paths gives exactly the tree libgit2 writes from a whole index."""

from __future__ import annotations

import pygit2
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from repo_helpers import git

from snapshotd.capture.treeedit import RecentBodies, edit_tree
from snapshotd.git import loose

NAMES = st.sampled_from(["a", "b", "c", "a.txt", "a-b", "z"])
PATHS = st.lists(NAMES, min_size=1, max_size=4).map("/".join)
MODES = st.sampled_from([0o100644, 0o100755, 0o120000])


def tree_of(repo: pygit2.Repository, files: dict[str, tuple[bytes, int]]) -> str:
    index = pygit2.Index()
    for path, (data, mode) in files.items():
        index.add(pygit2.IndexEntry(path, repo.create_blob(data), mode))
    return str(index.write_tree(repo))


def consistent(files: dict[str, tuple[bytes, int]]) -> dict[str, tuple[bytes, int]]:
    """Drop paths that would need a file and a folder at the same place (the first one wins)."""
    kept: dict[str, tuple[bytes, int]] = {}
    for path, value in files.items():
        parts = path.split("/")
        prefixes = {"/".join(parts[:i]) for i in range(1, len(parts))}
        if prefixes & kept.keys() or any(other.startswith(path + "/") for other in kept):
            continue
        kept[path] = value
    return kept


FILES = st.dictionaries(PATHS, st.tuples(st.binary(max_size=8), MODES), max_size=12).map(consistent)


@pytest.fixture(scope="module")
def shared_repo(tmp_path_factory: pytest.TempPathFactory) -> pygit2.Repository:
    return pygit2.init_repository(str(tmp_path_factory.mktemp("repo")), bare=True)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=FILES, after=FILES)
def test_edit_equals_a_full_rewrite(shared_repo, before, after):
    repo = shared_repo
    base = tree_of(repo, before)
    changes: dict[str, tuple[pygit2.Oid, int] | None] = {path: None for path in before if path not in after}
    for path, (data, mode) in after.items():
        if before.get(path) != (data, mode):
            changes[path] = (repo.create_blob(data), mode)
    edited, written = edit_tree(repo, base, changes)
    assert edited == tree_of(repo, after)
    assert all(str(oid) in repo for oid in written)


def test_empty_result_is_the_empty_tree(tmp_path):
    repo = pygit2.init_repository(str(tmp_path / "r"), bare=True)
    base = tree_of(repo, {"a/b": (b"x", 0o100644)})
    edited, _ = edit_tree(repo, base, {"a/b": None})
    assert edited == "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def test_only_the_trees_on_changed_paths_are_written(tmp_path):
    repo = pygit2.init_repository(str(tmp_path / "r"), bare=True)
    files = {f"d{i}/e{j}/f.txt": (b"%d%d" % (i, j), 0o100644) for i in range(20) for j in range(20)}
    base = tree_of(repo, files)
    edited, written = edit_tree(repo, base, {"d3/e4/f.txt": (repo.create_blob(b"new"), 0o100644)})
    assert len(written) == 3  # d3/e4, d3 and the root
    files["d3/e4/f.txt"] = (b"new", 0o100644)
    assert edited == tree_of(repo, files)


def test_modes_stored_otherwise_are_read_as_git_reads_them(tmp_path):
    """A tree an old git or another tool wrote (``100664``, ``100775``, ``120777``): the edited tree equals git's
    own ``read-tree``, ``update-index`` and ``write-tree`` of the same change (libgit2 would read ``120777`` as an
    executable file)."""
    root = tmp_path / "r"
    repo = pygit2.init_repository(str(root))
    blob = repo.create_blob(b"old\n")
    link = repo.create_blob(b"target")
    inner = loose.write_object(repo.path, "tree", b"100664 f\0" + blob.raw)
    odd = [(b"100664", b"group.txt", blob.raw), (b"100775", b"run", blob.raw), (b"120777", b"ln", link.raw),
           (b"40000", b"sub", inner.raw)]
    base = loose.write_object(repo.path, "tree", b"".join(b"%s %s\0%s" % entry for entry in odd))
    new = repo.create_blob(b"new\n")
    edited, _ = edit_tree(repo, base, {"sub/g": (new, 0o100644)})
    index = {"GIT_INDEX_FILE": str(tmp_path / "index")}
    git(root, "read-tree", str(base), env=index)
    git(root, "update-index", "--add", "--cacheinfo", f"100644,{new},sub/g", env=index)
    assert edited == git(root, "write-tree", env=index)


def test_a_base_that_is_not_a_tree_is_refused(tmp_path):
    repo = pygit2.init_repository(str(tmp_path / "r"), bare=True)
    blob = repo.create_blob(b"x")
    with pytest.raises(pygit2.GitError, match="where a tree was expected"):
        edit_tree(repo, blob, {"a": (blob, 0o100644)})
    with pytest.raises(KeyError, match="1" * 40):
        edit_tree(repo, "1" * 40, {"a": (blob, 0o100644)})


def test_a_tree_kept_from_the_last_edit_is_not_used_once_gone_from_the_store(tmp_path):
    """Bodies of the trees an edit wrote are kept for the next edit, but only while the store still holds them."""
    repo = pygit2.init_repository(str(tmp_path / "r"), bare=True)
    base = tree_of(repo, {"a/b.txt": (b"1", 0o100644)})
    first, written = edit_tree(repo, base, {"a/c.txt": (repo.create_blob(b"2"), 0o100644)})
    second, _ = edit_tree(repo, first, {"a/d.txt": (repo.create_blob(b"3"), 0o100644)})
    assert second == tree_of(repo, {name: (data, 0o100644) for name, data in
                                    [("a/b.txt", b"1"), ("a/c.txt", b"2"), ("a/d.txt", b"3")]})
    for oid in written:  # pruned (``git gc``, ``rm -rf`` under way)
        path = tmp_path / "r" / "objects" / str(oid)[:2] / str(oid)[2:]
        path.chmod(0o644)
        path.unlink()
    with pytest.raises(KeyError, match=first):
        edit_tree(repo, first, {"a/e.txt": (repo.create_blob(b"4"), 0o100644)})


def test_the_kept_bodies_stay_within_their_bound():
    kept = RecentBodies(1000)
    for index in range(100):
        kept.put(bytes([index]) * 20, b"x" * 60)
        kept.get(b"\0" * 20)  # the first one, used again each time, stays
    assert kept.size == sum(len(body) for body in kept.bodies.values()) <= 1000
    assert kept.get(b"\0" * 20) is not None and kept.get(bytes([1]) * 20) is None
    kept.put(b"big" * 7, b"y" * 200)  # over an eighth of the bound: never kept
    assert kept.get(b"big" * 7) is None
