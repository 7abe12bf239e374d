"""Odd file names captured as git captures them, also where git's filters apply.

With a ``.gitattributes`` (or any conversion rule) files are hashed by git
itself (``update-index -z --stdin``; before it ``hash-object --stdin-paths``,
which reads one name a line and C-unquotes a line that starts with a double
quote); names with a newline, a trailing carriage return or a leading quote
must still reach git intact.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import capture_helpers
import pytest
from capture_helpers import assert_matches_git, assert_tree, checkpoint, head_or_none
from oracle import oracle_tree
from repo_helpers import git, init_repo, load_fixture, tree_entries, write

from snapshotd.engine.core import Engine

make_odd = load_fixture("make_odd")

mode = capture_helpers.mode
eng = capture_helpers.eng

NAME_CASES = [
    "unicode_names",
    "space_names",
    "dash_names",
    "glob_names",
    "pathspec_magic_names",
    "backslash_names",
    "control_char_names",
]


@pytest.mark.parametrize("case", NAME_CASES)
async def test_odd_names_through_filters(eng: Engine, mode: str, tmp_path: Path, case: str) -> None:
    """Every odd name is captured through git's filters as ``git add -A`` records it."""
    made = make_odd.build(case, tmp_path / "repo")
    repo = made.worktree
    write(repo / ".gitattributes", "* text=auto\n")
    if case == "control_char_names":
        for name in ("ends with return\r", '"quoted\nand newline"', "dir\rreturn\r/f.txt"):
            write(repo / name, f"{name!r}\r\n")
            made.present.append(name)
    for name in made.present[:3]:
        with open(repo / name, "ab") as handle:
            handle.write(b"crlf\r\n")
    first = await checkpoint(eng, repo)
    tree = assert_matches_git(repo, first)
    assert first["stats"]["skipped"] == []
    entries = tree_entries(repo, tree)
    assert not [p for p in made.present if p not in entries]
    assert first["checkpoint"]["base"] == head_or_none(repo)
    if mode == "warm":
        for name in made.present:
            with open(repo / name, "ab") as handle:
                handle.write(b"again\r\n")
        again = await checkpoint(eng, repo)
        assert_matches_git(repo, again)
        assert again["checkpoint"]["changed"] is True


REFUSED = [".GIT/x", ".git.", ".git ", "git~1/inside", ".git::$INDEX_ALLOCATION", "sub/.Git/y"]
REFUSED_LINKS = [".gitmodules", "deep/.GITMODULES", "GITMOD~1"]  # as symbolic links


@pytest.mark.parametrize("filters", [False, True])
@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
async def test_names_git_refuses_are_skipped(
    eng: Engine, mode: str, tmp_path: Path, filters: bool, object_format: str
) -> None:
    """A name ``git add -A`` stops on is left out and named; the rest is captured as git does without it."""
    repo = init_repo(tmp_path / "r", commit=False)
    if object_format == "sha256":
        shutil.rmtree(repo / ".git")
        git(repo, "init", "-q", "--object-format=sha256")
    write(repo / "a.txt", "a\n")
    if filters:
        write(repo / ".gitattributes", "*.txt text\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a")
    write(repo / "b.txt", "b\r\n")
    await checkpoint(eng, repo)  # warm: the names below reach the watcher
    for name in REFUSED:
        write(repo / name, "refused\n")
    for name in REFUSED_LINKS:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink("a.txt", repo / name)
    result = await checkpoint(eng, repo)
    assert set(result["stats"]["skipped"]) == {*REFUSED, *REFUSED_LINKS}
    reasons = {item["path"]: item["reason"] for item in result["stats"]["skipped_files"]}
    assert all("refuses" in reason for reason in reasons.values())
    tree = result["checkpoint"]["tree"]
    for name in (*REFUSED, *REFUSED_LINKS):  # git's own answer is the worktree without them
        os.rename(repo / name, tmp_path / name.replace("/", "_"))
    assert_tree(repo, tree, oracle_tree(repo))
    assert "b.txt" in tree_entries(repo, tree)


async def test_odd_names_come_back_through_filters(eng: Engine, tmp_path: Path) -> None:
    """A restore in a filtered repository takes odd names back, after a safety checkpoint of them."""
    made = make_odd.build("control_char_names", tmp_path / "repo")
    repo = made.worktree
    write(repo / ".gitattributes", "* text=auto\n")
    names = [*made.present, '"quoted"\n', "ends with return\r"]
    for name in names:
        write(repo / name, f"{name!r} v1\r\n")
    saved = (await checkpoint(eng, repo))["checkpoint"]
    for name in names:
        write(repo / name, "v2\n")
    result = await eng.call("restore", {"checkpoint": saved["id"], "path": str(repo)})
    assert result["safety_checkpoint"]
    for name in names:  # as git checks the blob out: text=auto made it LF
        assert (repo / name).read_bytes() == f"{name!r} v1\n".encode("utf-8", "surrogateescape")
    again = await checkpoint(eng, repo)
    assert again["checkpoint"]["tree"] == saved["tree"]
    assert_matches_git(repo, again)


async def test_a_file_deleted_before_git_hashes_it_does_not_fail_the_capture(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault: a listed file is deleted just before it is read for git; the capture goes on without it."""
    from snapshotd.capture import checkin, mirror

    repo = init_repo(tmp_path / "r", (".gitattributes", "* text=auto\n"), ("kept.txt", "kept\r\n"))
    write(repo / "new.txt", "new\r\n")
    write(repo / "doomed.txt", "doomed\r\n")
    real_copy, real_git = mirror.Mirror.copy_file, checkin.run_git_sync
    calls: list[list[str]] = []

    def delete_first(self, path):  # type: ignore[no-untyped-def]
        if path == "doomed.txt":
            (repo / "doomed.txt").unlink()
        return real_copy(self, path)

    def count(target, args, **options):  # type: ignore[no-untyped-def]
        calls.append(list(args))
        return real_git(target, args, **options)

    monkeypatch.setattr(mirror.Mirror, "copy_file", delete_first)
    monkeypatch.setattr(checkin, "run_git_sync", count)
    result = await checkpoint(engine, repo)
    assert [args[0] for args in calls].count("update-index") == 1  # git drops the vanished file (--remove)
    assert_matches_git(repo, result)
    entries = tree_entries(repo, result["checkpoint"]["tree"])
    assert "new.txt" in entries and "doomed.txt" not in entries
