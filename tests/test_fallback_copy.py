"""The capture by git alone works on a private copy of the paths it updates, and still gives git's tree.

SHA-256 repositories and split indexes are captured by ``update-index`` with a
copy as its work tree (capture/mirror.py). Each kind of change git records
must come through the copy as ``git add -A`` sees it in the worktree: bytes,
the executable bit, links, a file turned folder and back, gitlinks moved,
nested repositories with and without a commit, the safer autocrlf rule, and
special files; and no copy is left behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from capture_helpers import assert_matches_git, checkpoint
from repo_helpers import commit_all, git, write

from snapshotd.engine.core import Engine

KINDS = ["sha256", "split-index"]


def repository(path: Path, kind: str) -> Path:
    """A repository captured by git alone, with a nested repository committed as a gitlink."""
    path.mkdir(parents=True)
    object_format = "sha256" if kind == "sha256" else "sha1"
    git(path, "init", "-q", f"--object-format={object_format}")
    if kind == "split-index":
        git(path, "config", "core.splitIndex", "true")
    write(path / "plain.txt", "plain\n")
    write(path / "tool.sh", "#!/bin/sh\n")
    write(path / "crlf.txt", "kept\r\nas is\r\n")
    write(path / "will-be-folder", "a file\n")
    write(path / "will-be-file/inside.txt", "inside\n")
    write(path / "will-be-link", "a file\n")
    os.symlink("plain.txt", path / "link")
    write(path / "gone.txt", "gone\n")
    nested(path / "sub", object_format, "first")
    commit_all(path, "start")
    if kind == "split-index":
        git(path, "update-index", "--split-index")
    return path


def nested(path: Path, object_format: str, content: str) -> str:
    """A repository at ``path`` (made if missing) with a new commit of ``content``; its id."""
    if not (path / ".git").exists():
        path.mkdir(parents=True)
        git(path, "init", "-q", f"--object-format={object_format}")
    write(path / "file.txt", content)
    return commit_all(path, content)


def change_everything(repo: Path) -> None:
    """One change of each kind git records, none staged."""
    object_format = git(repo, "rev-parse", "--show-object-format")
    write(repo / ".gitattributes", "* text=auto\n")  # crlf.txt stays CRLF: its index blob has CRs
    write(repo / "crlf.txt", "kept\r\nas is\r\nand more\r\n")
    write(repo / "plain.txt", "plain, edited\n")
    (repo / "tool.sh").chmod(0o755)
    write(repo / "new-tool.sh", "#!/bin/sh\n", mode=0o700)
    write(repo / "new.txt", "new\r\n")
    (repo / "will-be-folder").unlink()
    write(repo / "will-be-folder/now.txt", "now a folder\n")
    (repo / "will-be-file/inside.txt").unlink()
    (repo / "will-be-file").rmdir()
    write(repo / "will-be-file", "now a file\n")
    (repo / "will-be-link").unlink()
    os.symlink("tool.sh", repo / "will-be-link")
    (repo / "link").unlink()
    write(repo / "link", "a file now\n")
    os.symlink("nowhere", repo / "new-link")
    (repo / "gone.txt").unlink()
    nested(repo / "sub", object_format, "moved on")
    nested(repo / "inner", object_format, "inner")
    (repo / "empty-repo").mkdir()
    git(repo / "empty-repo", "init", "-q", f"--object-format={object_format}")
    os.mkfifo(repo / "fifo")


@pytest.mark.parametrize("kind", KINDS)
async def test_every_kind_of_change_comes_through_the_copy_as_git_sees_it(
    engine: Engine, tmp_path: Path, kind: str
) -> None:
    repo = repository(tmp_path / "repo", kind)
    change_everything(repo)
    result = await checkpoint(engine, repo)
    assert result["stats"]["hashed"] > 0
    os.unlink(repo / "fifo")  # git add -A stops at a FIFO; the capture leaves it out
    want = assert_matches_git(repo, result)
    entries = git(repo, "ls-tree", "-r", want)
    assert "160000 commit" in entries and "\tinner" in entries and "\tempty-repo" not in entries
    assert "100755 blob" in entries
    tmp = repo / ".git" / "snapshotd" / "tmp"
    assert [name for name in os.listdir(tmp) if name.startswith("tree-")] == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_second_capture_takes_unchanged_files_from_the_cache_and_gives_the_same_tree(
    engine: Engine, tmp_path: Path, kind: str
) -> None:
    repo = repository(tmp_path / "repo", kind)
    change_everything(repo)
    first = await checkpoint(engine, repo)
    write(repo / "plain.txt", "plain, edited again\n")
    second = await checkpoint(engine, repo)
    os.unlink(repo / "fifo")
    assert_matches_git(repo, second)
    assert second["checkpoint"]["tree"] != first["checkpoint"]["tree"]


async def test_a_copy_left_by_a_process_that_died_is_removed_when_the_worktree_is_opened(
    engine: Engine, tmp_path: Path
) -> None:
    repo = repository(tmp_path / "repo", "sha256")
    await checkpoint(engine, repo)
    tmp = repo / ".git" / "snapshotd" / "tmp"
    write(tmp / "tree-999999999-dead/private/copy.txt", "a copy of the user's file\n")
    write(tmp / f"tree-{os.getpid()}-alive/copy.txt", "in use by a live process\n")
    await engine.aclose()
    again = Engine()
    try:
        await checkpoint(again, repo)
    finally:
        await again.aclose()
    assert sorted(name for name in os.listdir(tmp) if name.startswith("tree-")) == [f"tree-{os.getpid()}-alive"]
