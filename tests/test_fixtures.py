"""The fixture builders make what they say, and git agrees with their notes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from oracle import OracleError, oracle_tree
from repo_helpers import FIXTURES, git, git_path, load_fixture, tree_entries

make_odd = load_fixture("make_odd")
make_small = load_fixture("make_small")
make_synthetic = load_fixture("make_synthetic")


@pytest.mark.parametrize("case", list(make_odd.CASES))
def test_odd_case_matches_its_notes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    made = make_odd.build(case, tmp_path / "repo")
    assert made.name == case
    if "global_config" in made.info:
        monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(made.info["global_config"]))
    if made.info.get("git_fails"):
        with pytest.raises(OracleError):
            oracle_tree(made.worktree)
        return
    tree = oracle_tree(made.worktree, size_cap=made.info.get("cap"))
    if case == "plain_folder":
        assert not (made.worktree / ".git").exists()
        # Trees are content-addressed: read this one through a repository holding it.
        store = tmp_path / "store.git"
        git(tmp_path, "init", "-q", "--bare", str(store))
        env = {"GIT_INDEX_FILE": str(tmp_path / "index")}
        prefix = (f"--git-dir={store}", f"--work-tree={made.worktree}")
        git(made.worktree, *prefix, "add", "-A", "--", ".", ":(exclude)scratch", env=env)
        assert git(made.worktree, *prefix, "write-tree", env=env) == tree
        entries = tree_entries(made.worktree, tree, git_dir=store)
    else:
        entries = tree_entries(made.worktree, tree)
    missing = [p for p in made.present if p not in entries]
    unexpected = [p for p in made.absent if p in entries]
    assert not missing, f"git left out {missing}"
    assert not unexpected, f"git captured {unexpected}"
    for path, content in made.info.get("disk", {}).items():
        assert (made.worktree / path).read_bytes() == content


def test_odd_cases_from_the_command_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(FIXTURES / "make_odd.py"), str(tmp_path), "symlinks", "unborn_head"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "symlinks" in out
    assert (tmp_path / "symlinks" / "link_to_file").is_symlink()
    assert (tmp_path / "unborn_head" / ".git").is_dir()
    listing = subprocess.run(
        [sys.executable, str(FIXTURES / "make_odd.py"), "--list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert len(listing.splitlines()) == len(make_odd.CASES)


def test_odd_case_refuses_a_non_empty_destination(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "x").write_text("x")
    with pytest.raises(FileExistsError):
        make_odd.build("unborn_head", tmp_path / "repo")


def test_odd_special_files_are_special(tmp_path: Path) -> None:
    made = make_odd.build("special_files", tmp_path / "repo")
    assert (made.worktree / "pipe").is_fifo()
    assert "pipe" in made.info["special"]


def test_small_project(tmp_path: Path) -> None:
    a = make_small.make_small(tmp_path / "a")
    b = make_small.make_small(tmp_path / "b")
    assert a.commits == b.commits  # fixed identity and dates
    assert len(a.commits) >= 2
    assert 25 <= len(a.tracked) <= 60
    assert git(a.worktree, "status", "--porcelain") == ""
    ignored = git(a.worktree, "status", "--porcelain", "--ignored", "--untracked-files=all")
    assert "build/" in ignored
    assert all(line.startswith("!!") for line in ignored.splitlines())
    assert sorted(git(a.worktree, "ls-files").splitlines()) == a.tracked
    assert any(p.count("/") >= 3 for p in a.tracked)
    assert oracle_tree(a.worktree) == git(a.worktree, "rev-parse", "HEAD^{tree}")


def test_small_project_dirty_and_plain(tmp_path: Path) -> None:
    dirty = make_small.make_small(tmp_path / "dirty", dirty=True)
    status = git(dirty.worktree, "status", "--porcelain")
    assert {line[3:] for line in status.splitlines()} == set(dirty.dirty)
    plain = make_small.make_small(tmp_path / "plain", plain=True)
    assert not (plain.worktree / ".git").exists()
    assert plain.commits == []
    assert (plain.worktree / "build").is_dir()


def test_small_project_command_line(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(FIXTURES / "make_small.py"), str(tmp_path / "s"), "--dirty"],
        check=True,
        capture_output=True,
    )
    assert (tmp_path / "s" / "notes.txt").exists()


def test_synthetic_tree(tmp_path: Path) -> None:
    made = make_synthetic.make_synthetic(tmp_path / "syn", 1000, seed=3, commit=True)
    root = Path(made.worktree)
    assert made.files == 1000
    assert git(root, "status", "--porcelain") == ""
    tracked = git(root, "ls-files").splitlines()
    assert len(tracked) == 1000
    assert oracle_tree(root) == git(root, "rev-parse", "HEAD^{tree}")
    folders: dict[str, int] = {}
    for path in tracked:
        if path != ".gitignore":
            folders[path.rsplit("/", 1)[0]] = folders.get(path.rsplit("/", 1)[0], 0) + 1
    depths = {folder.count("/") + 1 for folder in folders}
    assert depths <= {3, 4, 5} and len(depths) >= 2
    assert 15 <= sum(folders.values()) / len(folders) <= 25
    sizes = [os.path.getsize(root / p) for p in tracked if p != ".gitignore"]
    assert min(sizes) >= 100 and max(sizes) <= 20 * 1024
    binary = [p for p in tracked if b"\0" in (root / p).read_bytes()]
    assert 0 < len(binary) < 100
    ignored = git(root, "status", "--porcelain", "--ignored", "--untracked-files=all")
    assert len(ignored.splitlines()) == made.ignored_files


def test_synthetic_is_deterministic(tmp_path: Path) -> None:
    a = make_synthetic.make_synthetic(tmp_path / "a", 300, seed=7, commit=True)
    b = make_synthetic.make_synthetic(tmp_path / "b", 300, seed=7, commit=True)
    c = make_synthetic.make_synthetic(tmp_path / "c", 300, seed=8, commit=True)
    assert a.commit == b.commit
    assert a.commit != c.commit


def test_synthetic_uncommitted_and_plain(tmp_path: Path) -> None:
    made = make_synthetic.make_synthetic(tmp_path / "u", 200)
    root = Path(made.worktree)
    assert made.commit is None
    assert not git_path(root, "index").exists()
    untracked = git(root, "ls-files", "-o", "--exclude-standard").splitlines()
    assert len(untracked) == 200
    plain = make_synthetic.make_synthetic(tmp_path / "p", 200, plain=True)
    assert not (Path(plain.worktree) / ".git").exists()
    with pytest.raises(ValueError):
        make_synthetic.make_synthetic(tmp_path / "x", 10, plain=True, commit=True)


def test_synthetic_command_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(FIXTURES / "make_synthetic.py"),
            str(tmp_path / "s"),
            "--files",
            "250",
            "--seed",
            "1",
            "--commit",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    summary = json.loads(out)
    assert summary["files"] == 250 and summary["commit"]


@pytest.mark.slow
def test_synthetic_50k_builds_and_commits(tmp_path: Path) -> None:
    """The 50k tree the benchmarks use: every file committed (its build time is bench's to report)."""
    made = make_synthetic.make_synthetic(tmp_path / "big", 50_000, commit=True)
    assert git(made.worktree, "ls-files", "-z").count("\0") == 50_000
    assert git(made.worktree, "status", "--porcelain").strip() == ""
