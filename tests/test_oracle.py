"""The oracle itself: git's answer, computed without touching the user's index."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from oracle import OracleError, oracle_tree
from repo_helpers import (
    blob,
    file_fingerprint,
    git,
    git_path,
    init_repo,
    load_fixture,
    tree_entries,
    user_state,
    write,
)

make_odd = load_fixture("make_odd")
make_small = load_fixture("make_small")


def hash_object(repo: Path, data: bytes) -> str:
    return git(repo, "hash-object", "-w", "--stdin", input=data)


def mktree(repo: Path, entries: dict[str, tuple[str, str]]) -> str:
    """Build a tree by hand from ``{path: (mode, oid)}`` with ``git mktree``."""
    here: dict[str, tuple[str, str, str]] = {}
    below: dict[str, dict[str, tuple[str, str]]] = {}
    for path, (mode, oid) in entries.items():
        head, sep, rest = path.partition("/")
        if sep:
            below.setdefault(head, {})[rest] = (mode, oid)
        else:
            kind = {"160000": "commit"}.get(mode, "blob")
            here[head] = (mode, kind, oid)
    for name, sub in below.items():
        here[name] = ("040000", "tree", mktree(repo, sub))
    lines = b"".join(
        f"{mode} {kind} {oid}\t".encode() + os.fsencode(name) + b"\0"
        for name, (mode, kind, oid) in here.items()
    )
    return git(repo, "mktree", "-z", input=lines)


def literal_add_all(repo: Path) -> str:
    """The contract's words run for real: ``git add -A && git write-tree`` on a copy."""
    copy = repo.with_name(repo.name + "-copy")
    subprocess.run(["cp", "-a", str(repo), str(copy)], check=True)
    git(copy, "add", "-A")
    return git(copy, "write-tree")


def test_clean_repository_gives_head_tree(tmp_path: Path) -> None:
    made = make_small.make_small(tmp_path / "small")
    assert oracle_tree(made.worktree) == git(made.worktree, "rev-parse", "HEAD^{tree}")


def test_hand_built_tree(tmp_path: Path) -> None:
    repo = init_repo(
        tmp_path / "repo",
        ("keep.txt", "keep\n"),
        ("edit.txt", "v1\n"),
        ("gone.txt", "gone\n"),
        ("sub/deep/a.txt", "a\n"),
        (".gitignore", "*.log\n"),
    )
    write(repo / "edit.txt", "v2\n")
    (repo / "gone.txt").unlink()
    write(repo / "new.sh", "#!/bin/sh\n", mode=0o755)
    write(repo / "sub" / "deep" / "b.txt", b"\x00binary")
    write(repo / "ignored.log", "ignored\n")
    os.symlink("keep.txt", repo / "link")
    (repo / "empty_dir").mkdir()

    expected = mktree(
        repo,
        {
            ".gitignore": ("100644", hash_object(repo, b"*.log\n")),
            "keep.txt": ("100644", hash_object(repo, b"keep\n")),
            "edit.txt": ("100644", hash_object(repo, b"v2\n")),
            "new.sh": ("100755", hash_object(repo, b"#!/bin/sh\n")),
            "sub/deep/a.txt": ("100644", hash_object(repo, b"a\n")),
            "sub/deep/b.txt": ("100644", hash_object(repo, b"\x00binary")),
            "link": ("120000", hash_object(repo, b"keep.txt")),
        },
    )
    assert oracle_tree(repo) == expected


def test_nested_repository_is_a_gitlink_by_hand(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    inner = init_repo(repo / "inner", ("x", "x\n"))
    head = git(inner, "rev-parse", "HEAD")
    init_repo(repo / "empty_inner", ("y", "y\n"), commit=False)
    expected = mktree(
        repo,
        {"a.txt": ("100644", hash_object(repo, b"a\n")), "inner": ("160000", head)},
    )
    assert oracle_tree(repo) == expected


def test_unborn_repository_without_index(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo / "a.txt", "a\n")
    assert not git_path(repo, "index").exists()
    expected = mktree(repo, {"a.txt": ("100644", hash_object(repo, b"a\n"))})
    assert oracle_tree(repo) == expected
    assert not git_path(repo, "index").exists()


def test_plain_folder_same_tree_as_the_same_files_in_git(tmp_path: Path) -> None:
    plain = make_small.make_small(tmp_path / "plain", plain=True, dirty=True)
    repo = make_small.make_small(tmp_path / "repo", dirty=True)
    assert oracle_tree(plain.worktree) == oracle_tree(repo.worktree)
    assert not (plain.worktree / ".git").exists()


def test_empty_plain_folder(tmp_path: Path) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    assert oracle_tree(folder) == "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(
    "case",
    [
        "unicode_names",
        "glob_names",
        "pathspec_magic_names",
        "control_char_names",
        "symlinks",
        "exec_bits",
        "filemode_false",
        "type_changes",
        "binary_files",
        "nested_gitignore",
        "info_exclude",
        "tracked_ignored",
        "staged_then_edited",
        "merge_conflict",
        "crlf_autocrlf",
        "gitattributes_eol",
        "case_only_rename",
        "nested_repo_with_commit",
        "submodule",
        "submodule_uninitialised",
        "special_files",
        "many_changes",
    ],
)
def test_matches_literal_git_add_on_a_copy(tmp_path: Path, case: str) -> None:
    made = make_odd.build(case, tmp_path / "repo")
    assert oracle_tree(made.worktree) == literal_add_all(made.worktree)


@pytest.mark.parametrize("case", list(make_odd.CASES))
def test_user_state_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    made = make_odd.build(case, tmp_path / "repo")
    if "global_config" in made.info:
        monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(made.info["global_config"]))
    if made.name == "plain_folder":
        before = sorted(p.name for p in made.worktree.iterdir())
        oracle_tree(made.worktree)
        assert sorted(p.name for p in made.worktree.iterdir()) == before
        return
    before = user_state(made.worktree)
    try:
        oracle_tree(made.worktree, size_cap=made.info.get("cap"))
    except OracleError:
        assert made.info.get("git_fails")
    assert user_state(made.worktree) == before


def test_stale_index_lock_does_not_matter(tmp_path: Path) -> None:
    made = make_small.make_small(tmp_path / "small", dirty=True)
    lock = git_path(made.worktree, "index.lock")
    lock.write_bytes(b"stale")
    tree = oracle_tree(made.worktree)
    assert lock.read_bytes() == b"stale"
    lock.unlink()
    assert oracle_tree(made.worktree) == tree


def test_inherited_environment_does_not_redirect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_small.make_small(tmp_path / "small", dirty=True).worktree
    other = init_repo(tmp_path / "other", ("other.txt", "other\n"))
    expected = oracle_tree(repo)
    other_index = file_fingerprint(git_path(other, "index"))
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(other / ".git" / "objects"))
    monkeypatch.setenv("GIT_LITERAL_PATHSPECS", "1")
    assert oracle_tree(repo) == expected
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_WORK_TREE")
    monkeypatch.delenv("GIT_INDEX_FILE")
    monkeypatch.delenv("GIT_OBJECT_DIRECTORY")
    assert file_fingerprint(git_path(other, "index")) == other_index


def test_size_cap(tmp_path: Path) -> None:
    made = make_odd.build("large_untracked", tmp_path / "repo")
    cap = made.info["cap"]
    capped = tree_entries(made.worktree, oracle_tree(made.worktree, size_cap=cap))
    uncapped = tree_entries(made.worktree, oracle_tree(made.worktree))
    for path in made.info["skipped"]:
        assert path not in capped
        assert path in uncapped
    for path in ("exact.bin", "under.bin", "tracked_big.bin", "data1.bin", "link_to_big"):
        assert path in capped
    assert oracle_tree(made.worktree, size_cap=0) == oracle_tree(made.worktree)


def test_size_cap_never_drops_tracked_files(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("big.bin", b"x" * 5000))
    write(repo / "big.bin", b"y" * 6000)
    entries = tree_entries(repo, oracle_tree(repo, size_cap=100))
    assert blob(repo, oracle_tree(repo, size_cap=100), "big.bin") == b"y" * 6000
    assert "big.bin" in entries


def test_skip_worktree_and_assume_unchanged(tmp_path: Path) -> None:
    made = make_odd.build("skip_worktree", tmp_path / "skip")
    tree = oracle_tree(made.worktree)
    assert blob(made.worktree, tree, "edited.txt") == made.info["disk"]["edited.txt"]
    assert blob(made.worktree, tree, "missing.txt") == blob(made.worktree, "HEAD", "missing.txt")

    made = make_odd.build("assume_unchanged", tmp_path / "assume")
    tree = oracle_tree(made.worktree)
    for path, content in made.info["disk"].items():
        assert blob(made.worktree, tree, path) == content


@pytest.mark.parametrize("case", ["sparse_cone", "sparse_index"])
def test_sparse_checkout_not_materialised(tmp_path: Path, case: str) -> None:
    made = make_odd.build(case, tmp_path / "repo")
    tree = oracle_tree(made.worktree)
    for path in made.info["not_on_disk"]:
        assert not (made.worktree / path).exists()
        assert blob(made.worktree, tree, path) == blob(made.worktree, "HEAD", path)


def test_sparse_index_and_full_index_agree(tmp_path: Path) -> None:
    a = make_odd.build("sparse_cone", tmp_path / "a")
    b = make_odd.build("sparse_index", tmp_path / "b")
    assert oracle_tree(a.worktree) == oracle_tree(b.worktree)


def test_same_size_rewrite_with_same_mtime_is_seen(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "aaaa\n"))
    st = os.stat(repo / "a.txt")
    for i in range(20):
        content = f"{i:04}\n".encode()
        (repo / "a.txt").write_bytes(content)
        os.utime(repo / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
        assert blob(repo, oracle_tree(repo), "a.txt") == content


def test_rewrite_that_fools_the_stat_check_is_seen(tmp_path: Path) -> None:
    """Same size, mtime put back, inode kept, ctime in the same second as the index's.

    ``git diff`` (and the oracle with ``trust_stat=True``) may call this clean;
    the oracle by default checks the content and must not.
    """
    repo = init_repo(tmp_path / "repo", ("a.txt", "0000\n"))
    st = os.stat(repo / "a.txt")
    for i in range(10):
        with open(repo / "a.txt", "r+b") as fh:
            fh.write(f"r{i:03}\n".encode())
        os.utime(repo / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
        git(repo, "add", "a.txt")  # the index records this stat data
        with open(repo / "a.txt", "r+b") as fh:
            fh.write(f"s{i:03}\n".encode())
        os.utime(repo / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
        index = file_fingerprint(git_path(repo, "index"))
        assert blob(repo, oracle_tree(repo), "a.txt") == f"s{i:03}\n".encode()
        oracle_tree(repo, trust_stat=True)  # git's everyday answer, whatever it is
        assert file_fingerprint(git_path(repo, "index")) == index


def test_failures_are_loud(tmp_path: Path) -> None:
    made = make_odd.build("clean_filter_failing", tmp_path / "filter")
    with pytest.raises(OracleError, match="filter"):
        oracle_tree(made.worktree)

    made = make_odd.build("corrupt_index", tmp_path / "corrupt")
    index = file_fingerprint(git_path(made.worktree, "index"))
    with pytest.raises(OracleError):
        oracle_tree(made.worktree)
    fresh = oracle_tree(made.worktree, fresh_index=True)
    assert blob(made.worktree, fresh, "README.md") == b"# edited\n"
    assert file_fingerprint(git_path(made.worktree, "index")) == index


def test_oracle_objects_are_readable_in_the_repository(tmp_path: Path) -> None:
    made = make_small.make_small(tmp_path / "small", dirty=True)
    tree = oracle_tree(made.worktree)
    assert blob(made.worktree, tree, "notes.txt") == b"remember the milk\n"
