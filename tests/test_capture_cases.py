"""Captures compared with git itself, case by case.

Every test builds a repository with real git, checkpoints it through the
engine and asserts that the checkpoint's tree is exactly the oracle's
(``git add -A && git write-tree`` on a copy of the user's index), plus what the
case is about. Numbers in brackets refer to docs/peer-cases.md.

Each test runs twice: ``cold`` (an engine without a watcher) and ``warm`` (a
watched engine; where it matters the worktree is changed after a first
capture, so the later captures go through the watcher).
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Any

import capture_helpers
import pytest
import trio
from capture_helpers import (
    Perturbation,
    assert_commit_in_repo,
    assert_matches_git,
    assert_tree,
    checkpoint,
    find_store,
    head_or_none,
    make_engine,
)
from oracle import oracle_tree
from repo_helpers import (
    assert_same_state,
    blob,
    commit_all,
    file_fingerprint,
    git,
    git_path,
    git_run,
    init_repo,
    load_fixture,
    tree_entries,
    user_state,
    write,
)

from snapshotd.engine.core import Engine
from snapshotd.errors import SnapshotdError

make_odd = load_fixture("make_odd")
make_small = load_fixture("make_small")

mode = capture_helpers.mode
eng = capture_helpers.eng

# Cases that capture normally; the others have tests of their own below.
SPECIAL_CASES = {
    "clean_filter_failing",
    "corrupt_index",
    "unreadable",
    "plain_folder",
    "large_untracked",
}
GENERIC_CASES = [name for name in make_odd.CASES if name not in SPECIAL_CASES]


def list_ids(result: dict[str, Any]) -> list[str]:
    return [cp["id"] for cp in result["checkpoints"]]


# --- every odd case ---------------------------------------------------------------


@pytest.mark.parametrize("case", GENERIC_CASES)
async def test_odd_case(
    eng: Engine, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """[5, 9, 10, 12, 20-25, 29, 50, 58, 65-88, 103-106] as git does them."""
    made = make_odd.build(case, tmp_path / "repo")
    repo = made.worktree
    if "global_config" in made.info:
        monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(made.info["global_config"]))
    before = user_state(repo)

    first = await checkpoint(eng, repo, label="first")
    assert_same_state(before, user_state(repo))
    tree = assert_matches_git(repo, first)
    cp = first["checkpoint"]
    assert cp["changed"] is True
    assert cp["base"] == head_or_none(repo)
    entries = tree_entries(repo, tree)
    assert not [p for p in made.present if p not in entries]
    assert not [p for p in made.absent if p in entries]
    for path, content in made.info.get("disk", {}).items():
        assert blob(repo, cp["id"], path) == content

    again = await checkpoint(eng, repo, label="again")
    assert again["checkpoint"]["changed"] is False
    assert again["checkpoint"]["tree"] == tree
    assert_same_state(before, user_state(repo))

    if mode == "warm":
        edits = Perturbation(repo, made.present)
        edits.apply()
        changed = await checkpoint(eng, repo, label="perturbed")
        assert_matches_git(repo, changed)
        edits.revert()
        back = await checkpoint(eng, repo, label="reverted")
        assert_matches_git(repo, back)
        assert back["checkpoint"]["tree"] == tree


# --- capture basics [1-9] ---------------------------------------------------------


def name_status(repo: Path, a: str, b: str) -> set[tuple[str, str]]:
    out = git_run(repo, "diff-tree", "-r", "--no-renames", "--name-status", "-z", a, b).stdout
    items = [os.fsdecode(x) for x in out.split(b"\0") if x]
    return {(items[i + 1], items[i]) for i in range(0, len(items), 2)}


def engine_status(files: list[dict[str, Any]]) -> set[tuple[str, str]]:
    letters = {"added": "A", "deleted": "D", "modified": "M", "type_changed": "T"}
    result: set[tuple[str, str]] = set()
    for change in files:
        if change["status"] == "renamed":
            result.add((change["old_path"], "D"))
            result.add((change["path"], "A"))
        else:
            result.add((change["path"], letters[change["status"]]))
    return result


async def test_modify_add_delete_across_folders(eng: Engine, tmp_path: Path) -> None:
    """[1-4, 13] one entry per changed file, correct paths, git's statuses."""
    repo = make_small.make_small(tmp_path / "small").worktree
    first = await checkpoint(eng, repo)
    assert_matches_git(repo, first)
    write(repo / "src/inkwell/util/text.py", "def first_line(s):\n    return s\n")
    write(repo / "docs/design/new.md", "# new\n")
    (repo / "tests/test_tag.py").unlink()
    write(repo / "README.md", (repo / "README.md").read_text() + "  \n")  # whitespace only
    second = await checkpoint(eng, repo)
    assert_matches_git(repo, second)
    a, b = first["checkpoint"]["id"], second["checkpoint"]["id"]
    assert second["checkpoint"]["parent"] == a
    assert second["checkpoint"]["seq"] > first["checkpoint"]["seq"]
    expected = name_status(repo, a, b)
    assert expected == {
        ("src/inkwell/util/text.py", "M"),
        ("docs/design/new.md", "A"),
        ("tests/test_tag.py", "D"),
        ("README.md", "M"),
    }
    assert blob(repo, a, "tests/test_tag.py") == blob(repo, "HEAD", "tests/test_tag.py")
    assert blob(repo, b, "docs/design/new.md") == b"# new\n"

    diff = await eng.call("diff", {"from": a, "to": b})
    assert engine_status(diff["files"]) == expected
    numstat = git(repo, "diff", "--numstat", "--no-renames", a, b)
    counts = {
        line.split("\t")[2]: (int(line.split("\t")[0]), int(line.split("\t")[1]))
        for line in numstat.splitlines()
    }
    for change in diff["files"]:
        assert (change["additions"], change["deletions"]) == counts[change["path"]]


async def test_an_index_entry_naming_a_blob_never_written(eng: Engine, tmp_path: Path) -> None:
    """``git update-index --cacheinfo`` of an id ``hash-object`` gave without ``-w``: ``git add -A`` hashes the
    file anew and writes its blob; the capture failed "unexpectedly" (libgit2 would not write the index's tree)."""
    repo = make_small.make_small(tmp_path / "small").worktree
    assert_matches_git(repo, await checkpoint(eng, repo))
    write(repo / "README.md", "changed\n")
    write(repo / "src/new.py", "new\n")
    for path in ("README.md", "src/new.py"):
        never_written = git(repo, "hash-object", path).strip()
        git(repo, "update-index", "--add", "--cacheinfo", f"100644,{never_written},{path}")
    result = await checkpoint(eng, repo)  # before the oracle's own `git add -A` writes the blobs
    assert blob(repo, result["checkpoint"]["id"], "README.md") == b"changed\n"
    assert_matches_git(repo, result)


@pytest.mark.parametrize("split", [False, True])
async def test_core_split_index_leaves_nothing_in_the_git_dir(eng: Engine, tmp_path: Path, split: bool) -> None:
    """With ``core.splitIndex`` on, git wrote the capture's private index split: a ``sharedindex`` file left in the
    user's git dir at every capture, and an index libgit2 cannot read (the checkpoint failed)."""
    repo = make_small.make_small(tmp_path / "small").worktree
    write(repo / ".gitattributes", "*.md text\n")
    git(repo, "config", "core.splitIndex", "true")
    if split:
        git(repo, "update-index", "--split-index")
    git_dir = Path(git_path(repo, "."))
    before = {p.name: p.read_bytes() for p in git_dir.glob("sharedindex.*")}
    assert bool(before) == split
    for round_ in range(2):
        write(repo / "README.md", f"crlf {round_}\r\n")  # a CR under a text rule: git hashes it
        write(repo / f"new{round_}.md", "new\r\n")
        result = await checkpoint(eng, repo)
        # Any git reading a split index (the capture's ls-files of its copy) touches its shared index's mtime,
        # which keeps it from expiring; its content stays.
        assert {p.name: p.read_bytes() for p in git_dir.glob("sharedindex.*")} == before
        assert_matches_git(repo, result)
        before = {p.name: p.read_bytes() for p in git_dir.glob("sharedindex.*")}  # git's own add -A writes one


async def test_list_and_show_by_prefix(eng: Engine, tmp_path: Path) -> None:
    """A checkpoint is found by a 7-digit prefix; list is newest first."""
    repo = make_small.make_small(tmp_path / "small", dirty=True).worktree
    one = (await checkpoint(eng, repo, label="one"))["checkpoint"]
    write(repo / "x.txt", "x\n")
    two = (await checkpoint(eng, repo, label="two"))["checkpoint"]
    shown = await eng.call("show", {"checkpoint": one["id"][:7]})
    assert shown["checkpoint"]["id"] == one["id"]
    assert shown["checkpoint"]["tree"] == one["tree"]
    listed = await eng.call("list", {"path": str(repo)})
    assert list_ids(listed)[:2] == [two["id"], one["id"]]


async def test_path_inside_the_worktree(eng: Engine, tmp_path: Path) -> None:
    """Any folder inside a worktree names the whole worktree."""
    repo = make_small.make_small(tmp_path / "small", dirty=True).worktree
    top = await checkpoint(eng, repo)
    inner = await checkpoint(eng, repo / "src" / "inkwell" / "util")
    assert inner["checkpoint"]["worktree"] == top["checkpoint"]["worktree"]
    assert inner["checkpoint"]["tree"] == top["checkpoint"]["tree"]
    assert_matches_git(repo, inner)


async def test_no_change_same_tree_and_deterministic(eng: Engine, tmp_path: Path) -> None:
    """[6, 7] no change: changed false, same tree; identical trees give identical ids."""
    made = make_small.make_small(tmp_path / "a", dirty=True)
    copy = make_small.make_small(tmp_path / "b", dirty=True)
    a1 = await checkpoint(eng, made.worktree)
    a2 = await checkpoint(eng, made.worktree)
    assert a2["checkpoint"]["changed"] is False
    assert a2["checkpoint"]["tree"] == a1["checkpoint"]["tree"]
    other_session = await checkpoint(eng, made.worktree, session="s2")
    assert other_session["checkpoint"]["tree"] == a1["checkpoint"]["tree"]
    b1 = await checkpoint(eng, copy.worktree)
    assert b1["checkpoint"]["tree"] == a1["checkpoint"]["tree"]
    assert b1["checkpoint"]["worktree"] != a1["checkpoint"]["worktree"]


async def test_equals_read_tree_head_method(eng: Engine, tmp_path: Path) -> None:
    """[8] same tree as the reference temp-index method (read-tree HEAD, add -A, write-tree)."""
    repo = make_small.make_small(tmp_path / "small", dirty=True).worktree
    result = await checkpoint(eng, repo)
    env = {"GIT_INDEX_FILE": str(tmp_path / "ref-index")}
    git(repo, "read-tree", "HEAD", env=env)
    git(repo, "add", "-A", env=env)
    assert result["checkpoint"]["tree"] == git(repo, "write-tree", env=env)


async def test_user_state_stash_and_branches_untouched(eng: Engine, tmp_path: Path) -> None:
    """[9, 52] index bytes and mtime, HEAD, branches, stash list and files stay as they were."""
    repo = make_small.make_small(tmp_path / "small").worktree
    write(repo / "README.md", "# stashed\n")
    git(repo, "stash", "push", "-q", "-m", "keep me")
    git(repo, "branch", "feature")
    git(repo, "tag", "v1")
    write(repo / "README.md", "# dirty again\n")
    write(repo / "staged.txt", "staged\n")
    git(repo, "add", "staged.txt")
    before = user_state(repo)
    stash = git(repo, "stash", "list")
    result = await checkpoint(eng, repo)
    assert_same_state(before, user_state(repo))
    assert git(repo, "stash", "list") == stash
    assert_matches_git(repo, result)


async def test_stale_user_index_lock_does_not_block(eng: Engine, tmp_path: Path) -> None:
    """[91, 92] the user's stale index.lock neither blocks a capture nor is removed."""
    repo = make_small.make_small(tmp_path / "small", dirty=True).worktree
    lock = git_path(repo, "index.lock")
    lock.write_bytes(b"left behind by a crashed editor")
    result = await checkpoint(eng, repo)
    assert_matches_git(repo, result)
    assert lock.read_bytes() == b"left behind by a crashed editor"
    write(repo / "more.txt", "more\n")
    result = await checkpoint(eng, repo)
    assert_matches_git(repo, result)
    assert lock.exists()


async def test_missing_index(eng: Engine, tmp_path: Path) -> None:
    """[11] no index file: a fresh one, and none is created."""
    made = make_odd.build("missing_index", tmp_path / "repo")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    assert not git_path(made.worktree, "index").exists()


async def test_corrupt_index_fails_cleanly_or_uses_a_fresh_index(
    eng: Engine, tmp_path: Path
) -> None:
    """[11] git cannot read the index: a clear error with nothing recorded, or a fresh index.

    The index is left byte-identical either way.
    """
    made = make_odd.build("corrupt_index", tmp_path / "repo")
    repo = made.worktree
    before = user_state(repo)
    try:
        result = await checkpoint(eng, repo)
    except SnapshotdError:
        assert git(repo, "for-each-ref", "refs/snapshotd/") == ""
    else:
        assert_tree(repo, result["checkpoint"]["tree"], oracle_tree(repo, fresh_index=True))
    assert_same_state(before, user_state(repo))


@pytest.mark.parametrize("case", ["unborn_head", "unborn_empty"])
async def test_unborn_head(eng: Engine, tmp_path: Path, case: str) -> None:
    """[12] no commit yet: base is None; staged and unstaged files are captured."""
    made = make_odd.build(case, tmp_path / "repo")
    before = user_state(made.worktree)
    result = await checkpoint(eng, made.worktree)
    assert result["checkpoint"]["base"] is None
    assert_matches_git(made.worktree, result)
    assert_same_state(before, user_state(made.worktree))
    assert git_run(made.worktree, "rev-parse", "-q", "--verify", "HEAD", check=False).returncode


# --- untracked and ignored [16-29] --------------------------------------------------------


async def test_untracked_file_lifecycle(eng: Engine, tmp_path: Path) -> None:
    """[16-19] untracked edits, deletions and disappearances; no ghosts."""
    repo = make_small.make_small(tmp_path / "small").worktree
    write(repo / "scratch" / "u.txt", "v1\n")
    write(repo / "v.txt", "stays\n")
    one = await checkpoint(eng, repo)
    assert_matches_git(repo, one)
    assert blob(repo, one["checkpoint"]["id"], "scratch/u.txt") == b"v1\n"

    diff = await eng.call("diff", {"from": one["checkpoint"]["id"], "to": "worktree"})
    assert diff["files"] == []  # [17]

    write(repo / "scratch" / "u.txt", "v2\n")
    two = await checkpoint(eng, repo)
    assert_matches_git(repo, two)
    assert blob(repo, two["checkpoint"]["id"], "scratch/u.txt") == b"v2\n"

    shutil.rmtree(repo / "scratch")
    three = await checkpoint(eng, repo)
    assert_matches_git(repo, three)
    assert "scratch/u.txt" not in tree_entries(repo, three["checkpoint"]["tree"])  # [19]
    diff = await eng.call(
        "diff", {"from": two["checkpoint"]["id"], "to": three["checkpoint"]["id"]}
    )
    assert engine_status(diff["files"]) == {("scratch/u.txt", "D")}  # [18]


async def test_file_ignored_after_capture(eng: Engine, tmp_path: Path) -> None:
    """[21] a file added to .gitignore after a capture leaves the next one."""
    repo = make_small.make_small(tmp_path / "small").worktree
    write(repo / "data.csv", "a,b\n")
    write(repo / "out" / "x.bin", b"\x00")
    one = await checkpoint(eng, repo)
    assert "data.csv" in tree_entries(repo, one["checkpoint"]["tree"])
    with open(repo / ".gitignore", "a") as fh:
        fh.write("*.csv\nout/\n")
    two = await checkpoint(eng, repo)
    assert_matches_git(repo, two)
    entries = tree_entries(repo, two["checkpoint"]["tree"])
    assert "data.csv" not in entries and "out/x.bin" not in entries
    exclude = git_path(repo, "info/exclude")
    write(exclude, exclude.read_text() + "*.md\n")
    three = await checkpoint(eng, repo)
    assert_matches_git(repo, three)  # tracked .md files stay; none is untracked


async def test_global_excludes_file_changed_between_captures(
    eng: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[22, 23] the global excludes file and info/exclude, also when they change."""
    made = make_odd.build("core_excludes_file", tmp_path / "repo")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(made.info["global_config"]))
    repo = made.worktree
    one = await checkpoint(eng, repo)
    assert_matches_git(repo, one)
    excludes = made.info["excludes_file"]
    write(excludes, "*.txt\n")
    two = await checkpoint(eng, repo)
    assert_matches_git(repo, two)
    assert "kept.txt" not in tree_entries(repo, two["checkpoint"]["tree"])


# --- sizes [55-60] -------------------------------------------------------------------------


async def test_size_cap(mode: str, nursery: trio.Nursery, tmp_path: Path) -> None:
    """[55-57, 59, 60] untracked files over the cap are skipped, listed and kept on disk."""
    made = make_odd.build("large_untracked", tmp_path / "repo")
    repo, cap = made.worktree, made.info["cap"]
    engine = make_engine(mode, nursery, size_cap=cap)
    try:
        result = await checkpoint(engine, repo)
        assert_matches_git(repo, result, size_cap=cap)
        assert sorted(result["stats"]["skipped"]) == made.info["skipped"]
        for path in made.info["skipped"]:
            assert (repo / path).stat().st_size > cap
        clean = await checkpoint(engine, repo)  # nothing changed: the big files are still left out
        assert clean["checkpoint"]["changed"] is False
        assert sorted(clean["stats"]["skipped"]) == made.info["skipped"]
        assert result["stats"]["skipped_files"] == [
            {"path": path, "reason": "larger than the size cap for untracked files", "size": (repo / path).stat().st_size, "cap": cap}
            for path in made.info["skipped"]
        ]
        assert clean["stats"]["skipped_files"] == result["stats"]["skipped_files"]
        entries = tree_entries(repo, result["checkpoint"]["tree"])
        assert "exact.bin" in entries and "data1.bin" in entries  # [56, 60]
        assert blob(repo, result["checkpoint"]["id"], "tracked_big.bin") == b"U" * (cap * 4)

        write(repo / "another_big.bin", b"z" * (cap + 1))  # [57]
        again = await checkpoint(engine, repo)
        assert again["checkpoint"]["changed"] is False
        assert again["checkpoint"]["tree"] == result["checkpoint"]["tree"]
        assert sorted(again["stats"]["skipped"]) == sorted([*made.info["skipped"], "another_big.bin"])

        (repo / "under.bin").write_bytes(b"k" * (cap + 5))  # grows past the cap
        grown = await checkpoint(engine, repo)
        assert_matches_git(repo, grown, size_cap=cap)
        assert "under.bin" in grown["stats"]["skipped"]

        git(repo, "add", "under.bin")  # tracked now: always captured
        tracked = await checkpoint(engine, repo)
        assert_matches_git(repo, tracked, size_cap=cap)
        assert "under.bin" not in tracked["stats"]["skipped"]
        assert "another_big.bin" in tracked["stats"]["skipped"]
        (repo / "another_big.bin").unlink()
        gone = await checkpoint(engine, repo)
        assert_matches_git(repo, gone, size_cap=cap)
        assert "another_big.bin" not in gone["stats"]["skipped"]
    finally:
        await engine.aclose()


async def test_default_cap_skips_nothing_small(eng: Engine, tmp_path: Path) -> None:
    made = make_odd.build("large_untracked", tmp_path / "repo")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    assert result["stats"]["skipped"] == []


async def test_size_cap_zero_means_none(mode: str, nursery: trio.Nursery, tmp_path: Path) -> None:
    made = make_odd.build("large_untracked", tmp_path / "repo")
    engine = make_engine(mode, nursery, size_cap=0)
    try:
        result = await checkpoint(engine, made.worktree)
        assert_matches_git(made.worktree, result)
        assert result["stats"]["skipped"] == []
    finally:
        await engine.aclose()


# --- names and types [65-80] --------------------------------------------------------


async def test_names_survive_byte_exact(eng: Engine, tmp_path: Path) -> None:
    """[66, 70, 71] NFC and NFD spellings stay two entries; odd bytes are kept."""
    made = make_odd.build("unicode_names", tmp_path / "repo")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    entries = tree_entries(made.worktree, result["checkpoint"]["tree"])
    assert f"normal/{made.info['nfc']}" in entries
    assert f"normal/{made.info['nfd']}" in entries

    made = make_odd.build("control_char_names", tmp_path / "ctrl")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    assert "new\nline.txt" in tree_entries(made.worktree, result["checkpoint"]["tree"])


async def test_binary_content_byte_exact(eng: Engine, tmp_path: Path) -> None:
    """[72, 73] NUL bytes, no final newline, invalid UTF-8: blobs equal the disk bytes."""
    made = make_odd.build("binary_files", tmp_path / "repo")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    for path in made.present:
        assert (
            blob(made.worktree, result["checkpoint"]["id"], path)
            == (made.worktree / path).read_bytes()
        )


async def test_symlinks_recorded_as_links(eng: Engine, tmp_path: Path) -> None:
    """[74-76] links are entries of mode 120000 holding the target, never followed."""
    made = make_odd.build("symlinks", tmp_path / "repo")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    entries = tree_entries(made.worktree, result["checkpoint"]["tree"])
    for path in ("link_to_file", "link_to_dir", "dangling", "loop_a", "self", "outside_abs"):
        assert entries[path][0] == "120000"
        target = os.readlink(made.worktree / path)
        assert blob(made.worktree, result["checkpoint"]["id"], path) == os.fsencode(target)

    made = make_odd.build("dir_replaced_by_symlink", tmp_path / "replaced")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    entries = tree_entries(made.worktree, result["checkpoint"]["tree"])
    assert entries["lib"][0] == "120000"
    assert not [p for p in entries if p.startswith("lib/")]


async def test_exec_bits_and_net_zero_mode_change(eng: Engine, tmp_path: Path) -> None:
    """[77, 78] +x/-x captured; a mode changed and changed back is no change."""
    made = make_odd.build("exec_bits", tmp_path / "repo")
    repo = made.worktree
    result = await checkpoint(eng, repo)
    assert_matches_git(repo, result)
    entries = tree_entries(repo, result["checkpoint"]["tree"])
    for path in made.info["executable"]:
        assert entries[path][0] == "100755"
    for path in made.info["plain"]:
        assert entries[path][0] == "100644"
    (repo / "new.sh").chmod(0o644)
    (repo / "new.sh").chmod(0o755)
    again = await checkpoint(eng, repo)
    assert again["checkpoint"]["changed"] is False
    (repo / "run.sh").chmod(0o755)
    flipped = await checkpoint(eng, repo)
    assert_matches_git(repo, flipped)
    assert tree_entries(repo, flipped["checkpoint"]["tree"])["run.sh"][0] == "100755"


async def test_filemode_false(eng: Engine, tmp_path: Path) -> None:
    made = make_odd.build("filemode_false", tmp_path / "repo")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    entries = tree_entries(made.worktree, result["checkpoint"]["tree"])
    for path, want in made.info["tree_modes"].items():
        assert entries[path][0] == want


async def test_special_files_do_not_hang(eng: Engine, tmp_path: Path) -> None:
    """[79] FIFOs, sockets and an endless device are passed over, quickly."""
    made = make_odd.build("special_files", tmp_path / "repo")
    with trio.fail_after(20):
        result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    assert (made.worktree / "pipe").is_fifo()


async def test_empty_folders_not_captured(eng: Engine, tmp_path: Path) -> None:
    """[80] empty folders are not in the tree, and stay on disk."""
    made = make_odd.build("empty_and_deep_dirs", tmp_path / "repo")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    for path in made.absent:
        assert (made.worktree / path).is_dir()


# --- nested repositories, submodules, worktrees, sparse [81-88] ---------------------------


async def test_nested_repositories(eng: Engine, tmp_path: Path) -> None:
    """[81, 82] with a commit: a gitlink at its HEAD; without: left out, untouched."""
    made = make_odd.build("nested_repo_with_commit", tmp_path / "with")
    inner = made.worktree / made.info["gitlink"]
    inner_state = user_state(inner)
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    entries = tree_entries(made.worktree, result["checkpoint"]["tree"])
    assert entries[made.info["gitlink"]] == ("160000", "commit", made.info["head"])
    assert_same_state(inner_state, user_state(inner))
    assert (inner / ".git").is_dir()

    made = make_odd.build("nested_repo_without_commit", tmp_path / "without")
    scratch = user_state(made.worktree / "scratch")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    assert_same_state(scratch, user_state(made.worktree / "scratch"))


@pytest.mark.parametrize("case", ["submodule", "submodule_new_commit", "submodule_uninitialised"])
async def test_submodules(eng: Engine, tmp_path: Path, case: str) -> None:
    """[84] registered submodules: initialised, dirty, moved on, uninitialised."""
    made = make_odd.build(case, tmp_path / "repo")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    entries = tree_entries(made.worktree, result["checkpoint"]["tree"])
    assert entries[made.info["gitlink"]] == ("160000", "commit", made.info["head"])


async def test_linked_worktree_uses_its_own_index(eng: Engine, tmp_path: Path) -> None:
    """[85] a linked worktree is captured from its own index; the main one is untouched."""
    made = make_odd.build("linked_worktree", tmp_path / "repo")
    linked, main = made.worktree, made.info["main"]
    main_before, linked_before = user_state(main), user_state(linked)
    result = await checkpoint(eng, linked)
    assert_matches_git(linked, result)
    assert result["checkpoint"]["base"] == git(linked, "rev-parse", "HEAD")
    main_result = await checkpoint(eng, main)
    assert_matches_git(main, main_result)
    assert main_result["checkpoint"]["worktree"] != result["checkpoint"]["worktree"]
    assert main_result["checkpoint"]["tree"] != result["checkpoint"]["tree"]
    assert_same_state(main_before, user_state(main))
    assert_same_state(linked_before, user_state(linked))


async def test_linked_worktree_moved_on_disk(eng: Engine, tmp_path: Path) -> None:
    """[86] a moved linked worktree keeps its id and is captured at its new path."""
    made = make_odd.build("linked_worktree", tmp_path / "repo")
    first = await checkpoint(eng, made.worktree)
    moved = made.worktree.with_name("moved")
    os.rename(made.worktree, moved)
    result = await checkpoint(eng, moved)
    assert_matches_git(moved, result)
    assert result["checkpoint"]["worktree"] == first["checkpoint"]["worktree"]
    listed = await eng.call("list", {"path": str(moved)})
    assert first["checkpoint"]["id"] in list_ids(listed)


@pytest.mark.parametrize("case", ["sparse_cone", "sparse_index", "sparse_with_outside_files"])
async def test_sparse_checkout_not_materialised(eng: Engine, tmp_path: Path, case: str) -> None:
    """[87] out-of-cone files come from the index and are never written to disk."""
    made = make_odd.build(case, tmp_path / "repo")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    for path in made.info["not_on_disk"]:
        assert not os.path.lexists(made.worktree / path)
        assert blob(made.worktree, result["checkpoint"]["id"], path) == blob(
            made.worktree, "HEAD", path
        )


async def test_split_index_untouched(eng: Engine, tmp_path: Path) -> None:
    """[88] a split index and its shared index file keep their bytes."""
    made = make_odd.build("split_index", tmp_path / "repo")
    before = user_state(made.worktree)
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)
    assert_same_state(before, user_state(made.worktree))
    for name in made.info["shared_indexes"]:
        assert (made.worktree / ".git" / name).exists()


# --- concurrency [99] ------------------------------------------------------------------


async def test_capture_during_concurrent_writes(eng: Engine, tmp_path: Path) -> None:
    """[99] files replaced atomically while captures run: each blob is a whole version."""
    repo = init_repo(tmp_path / "repo", (".gitignore", "tmp/\n"))
    (repo / "tmp").mkdir()
    versions = {
        f"f{i}.txt": (f"old {i}\n".encode() * (i + 1), f"NEW {i}!\n".encode() * (2 * i + 3))
        for i in range(6)
    }
    for name, (old, _) in versions.items():
        write(repo / name, old)
    commit_all(repo, "files")
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            for name, pair in versions.items():
                temp = repo / "tmp" / f"{name}.{n}"
                temp.write_bytes(pair[n % 2])
                os.replace(temp, repo / name)
            n += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for _ in range(8):
            result = await checkpoint(eng, repo)
            cp = result["checkpoint"]
            entries = tree_entries(repo, cp["tree"])
            assert set(entries) == {".gitignore", *versions}
            for name, pair in versions.items():
                assert blob(repo, cp["id"], name) in pair
            await trio.sleep(0.01)
    finally:
        stop.set()
        thread.join()
    final = await checkpoint(eng, repo)
    assert_matches_git(repo, final)


# --- environment, identity, filters, formats [105-108] -----------------------------------


async def test_inherited_git_environment_does_not_redirect(
    eng: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[83, 105] GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE and hooks do not leak in."""
    repo = make_small.make_small(tmp_path / "small", dirty=True).worktree
    other = init_repo(tmp_path / "other", ("other.txt", "other\n"))
    other_before = user_state(other)
    marker = tmp_path / "hook-ran"
    hooks = git_path(repo, "hooks")
    for hook in ("pre-commit", "post-commit", "post-index-change", "reference-transaction"):
        write(hooks / hook, f"#!/bin/sh\necho {hook} >> '{marker}'\n", mode=0o755)
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(other / ".git" / "objects"))
    before = user_state(repo)
    result = await checkpoint(eng, repo)
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY"):
        monkeypatch.delenv(name)
    hook_log = marker.read_text() if marker.exists() else ""
    for hook in ("pre-commit", "post-commit", "post-index-change", "reference-transaction"):
        (hooks / hook).unlink()
    assert_matches_git(repo, result)
    assert_same_state(before, user_state(repo))
    assert_same_state(other_before, user_state(other))
    assert hook_log == "", f"git hooks ran during a capture: {hook_log.split()}"


async def test_foreign_locale(eng: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[106] a user's locale cannot change what a capture sees."""
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    monkeypatch.setenv("LANG", "tr_TR.UTF-8")
    monkeypatch.setenv("LANGUAGE", "de")
    made = make_odd.build("unicode_names", tmp_path / "repo")
    result = await checkpoint(eng, made.worktree)
    assert_matches_git(made.worktree, result)


async def test_sha256_repository(eng: Engine, tmp_path: Path) -> None:
    """[106] SHA-256 object format: 64-digit ids, git show works."""
    made = make_odd.build("sha256_repo", tmp_path / "repo")
    result = await checkpoint(eng, made.worktree)
    assert len(result["checkpoint"]["id"]) == 64
    assert len(result["checkpoint"]["tree"]) == 64
    assert_matches_git(made.worktree, result)


async def test_failing_clean_filter_records_nothing(eng: Engine, tmp_path: Path) -> None:
    """[94, 107] a required clean filter fails: a clear error, no checkpoint, index intact."""
    made = make_odd.build("clean_filter_failing", tmp_path / "repo")
    repo = made.worktree
    before = user_state(repo)
    with pytest.raises(SnapshotdError):
        await checkpoint(eng, repo)
    assert git(repo, "for-each-ref", "refs/snapshotd/") == ""
    assert_same_state(before, user_state(repo))
    (repo / "x.dat").unlink()
    result = await checkpoint(eng, repo)
    assert_matches_git(repo, result)


async def test_clean_filter_applied_and_not_rerun(eng: Engine, tmp_path: Path) -> None:
    """[107] a clean filter is applied as git applies it, and not rerun on unchanged files."""
    made = make_odd.build("clean_filter", tmp_path / "repo")
    repo, log = made.worktree, made.info["filter_log"]
    past = time.time() - 60
    for name in ("tracked.up", "new.up", ".gitattributes"):
        os.utime(repo / name, (past, past))
    git(repo, "update-index", "--refresh")  # the index now holds the older stat data
    first = await checkpoint(eng, repo)
    assert_matches_git(repo, first)
    assert blob(repo, first["checkpoint"]["id"], "new.up") == made.info["cleaned"]["new.up"]
    runs = log.read_text().count("run")
    second = await checkpoint(eng, repo)
    assert second["checkpoint"]["changed"] is False
    assert log.read_text().count("run") == runs, "the clean filter ran again on unchanged files"
    write(repo / "tracked.up", "changed text\n")
    third = await checkpoint(eng, repo)
    assert_matches_git(repo, third)
    assert blob(repo, third["checkpoint"]["id"], "tracked.up") == b"CHANGED TEXT\n"


async def test_no_identity_configured(
    eng: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[108] no user.name/email anywhere (and git told not to guess): capture still works."""
    repo = make_small.make_small(tmp_path / "small", dirty=True).worktree
    for name in (
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "GIT_COMMITTER_NAME",
        "GIT_COMMITTER_EMAIL",
        "EMAIL",
    ):
        monkeypatch.delenv(name, raising=False)
    home = Path(os.environ["HOME"])
    (home / ".gitconfig").write_text(
        "[init]\n\tdefaultBranch = main\n[user]\n\tuseConfigOnly = true\n"
    )
    assert git_run(repo, "commit", "--allow-empty", "-m", "x", check=False).returncode != 0
    before = user_state(repo)
    result = await checkpoint(eng, repo)
    assert_matches_git(repo, result)
    assert_same_state(before, user_state(repo))


async def test_unreadable_file_fails_loudly(eng: Engine, tmp_path: Path) -> None:
    """[112] a file nobody may read: git fails, so the capture fails and records nothing."""
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    made = make_odd.build("unreadable", tmp_path / "repo")
    repo = made.worktree
    try:
        with pytest.raises(SnapshotdError):
            await checkpoint(eng, repo)
        assert git(repo, "for-each-ref", "refs/snapshotd/") == ""
    finally:
        (repo / "locked").chmod(0o755)
        (repo / "secret.txt").chmod(0o644)
    result = await checkpoint(eng, repo)
    assert_matches_git(repo, result)


# --- plain folders [109] -----------------------------------------------------------------


async def test_plain_folder(eng: Engine, tmp_path: Path) -> None:
    """[109] a non-git folder: no .git appears; an app-owned store under $SNAPSHOTD_HOME."""
    made = make_odd.build("plain_folder", tmp_path / "plain")
    folder = made.worktree
    before = sorted(p.name for p in folder.iterdir())
    opened = await eng.call("open", {"path": str(folder)})
    assert opened["worktree"]["kind"] == "plain"
    result = await checkpoint(eng, folder)
    cp = result["checkpoint"]
    assert sorted(p.name for p in folder.iterdir()) == before
    assert not (folder / ".git").exists()
    assert cp["base"] is None
    assert_tree(folder, cp["tree"], oracle_tree(folder))
    store = find_store(os.environ["SNAPSHOTD_HOME"], cp["id"])
    assert store is not None, "no repository under $SNAPSHOTD_HOME holds the checkpoint"
    assert git(store, f"--git-dir={store}", "rev-parse", f"{cp['id']}^{{tree}}") == cp["tree"]
    assert git_run(store, f"--git-dir={store}", "show", "--stat", cp["id"]).returncode == 0

    write(folder / "src" / "new.py", "new\n")
    again = await checkpoint(eng, folder)
    assert_tree(folder, again["checkpoint"]["tree"], oracle_tree(folder))
    assert again["checkpoint"]["changed"] is True


async def test_git_init_in_a_plain_folder(eng: Engine, tmp_path: Path) -> None:
    """[109] after ``git init`` the folder's captures follow git's rules and its repository."""
    folder = tmp_path / "plain"
    write(folder / "a.txt", "a\n")
    first = await checkpoint(eng, folder)
    assert_tree(folder, first["checkpoint"]["tree"], oracle_tree(folder))
    git(folder, "init", "-q")
    write(git_path(folder, "info/exclude"), "a.txt\n")
    write(folder / "b.txt", "b\n")
    second = await checkpoint(eng, folder)
    assert_matches_git(folder, second)


# --- durability and HEAD movements [110, 111] ----------------------------------------


async def test_survives_gc_and_restart(mode: str, nursery: trio.Nursery, tmp_path: Path) -> None:
    """[110] refs keep checkpoints through ``git gc --prune=now``; a new engine finds them."""
    repo = make_small.make_small(tmp_path / "small", dirty=True).worktree
    engine = make_engine(mode, nursery)
    try:
        one = (await checkpoint(engine, repo, label="one"))["checkpoint"]
        write(repo / "later.txt", "later\n")
        two = (await checkpoint(engine, repo, label="two"))["checkpoint"]
    finally:
        await engine.aclose()
    git(repo, "reflog", "expire", "--expire=now", "--all")
    git(repo, "gc", "-q", "--prune=now")
    for cp in (one, two):
        assert_commit_in_repo(repo, cp)
    assert blob(repo, two["id"], "later.txt") == b"later\n"
    engine = make_engine(mode, nursery)
    try:
        listed = await engine.call("list", {"path": str(repo)})
        assert list_ids(listed)[:2] == [two["id"], one["id"]]
        shown = await engine.call("show", {"checkpoint": one["id"][:7]})
        assert shown["checkpoint"]["tree"] == one["tree"]
        three = await checkpoint(engine, repo, label="three")
        assert three["checkpoint"]["changed"] is False
        assert three["checkpoint"]["parent"] == two["id"]
    finally:
        await engine.aclose()


async def test_head_moves_between_captures(eng: Engine, tmp_path: Path) -> None:
    """[111] an external commit, a branch switch and a detached HEAD: base follows HEAD."""
    repo = make_small.make_small(tmp_path / "small", dirty=True).worktree
    one = await checkpoint(eng, repo)
    assert one["checkpoint"]["base"] == git(repo, "rev-parse", "HEAD")
    commit_all(repo, "user commit")
    two = await checkpoint(eng, repo)
    assert_matches_git(repo, two)
    assert two["checkpoint"]["base"] == git(repo, "rev-parse", "HEAD")
    assert two["checkpoint"]["tree"] == one["checkpoint"]["tree"]
    git(repo, "checkout", "-q", "-b", "side", "HEAD~2")
    three = await checkpoint(eng, repo)
    assert_matches_git(repo, three)
    assert three["checkpoint"]["base"] == git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "--detach", "main")
    before = user_state(repo)
    four = await checkpoint(eng, repo)
    assert_matches_git(repo, four)
    assert four["checkpoint"]["base"] == git(repo, "rev-parse", "HEAD")
    assert_same_state(before, user_state(repo))
    assert git_run(repo, "symbolic-ref", "-q", "HEAD", check=False).returncode != 0


async def test_user_index_changes_between_captures(eng: Engine, tmp_path: Path) -> None:
    """[50, 51] staging, unstaging and ``git rm --cached`` between captures."""
    repo = make_small.make_small(tmp_path / "small").worktree
    write(repo / "README.md", "# staged\n")
    git(repo, "add", "README.md")
    one = await checkpoint(eng, repo)
    assert_matches_git(repo, one)
    git(repo, "rm", "-q", "--cached", "LICENSE")
    write(repo / "README.md", "# staged, then edited\n")
    two = await checkpoint(eng, repo)
    assert_matches_git(repo, two)
    git(repo, "reset", "-q")
    three = await checkpoint(eng, repo)
    assert_matches_git(repo, three)
    assert three["checkpoint"]["tree"] == two["checkpoint"]["tree"]
    write(repo / ".gitignore", (repo / ".gitignore").read_text() + "LICENSE\n")
    git(repo, "rm", "-q", "--cached", "LICENSE")
    four = await checkpoint(eng, repo)
    assert_matches_git(repo, four)
    assert "LICENSE" not in tree_entries(repo, four["checkpoint"]["tree"])
    assert stat.S_ISREG(os.lstat(repo / "LICENSE").st_mode)
    assert file_fingerprint(repo / "LICENSE") is not None


# --- attributes that change a file's blob without touching the file --------------------


async def test_new_attributes_convert_files_hashed_before(mode: str, nursery: trio.Nursery, tmp_path: Path) -> None:
    """A ``.gitattributes`` that adds ``eol=lf`` gives an untouched CRLF file git's new blob.

    The file was edited (so it differs from the user's index) and hashed by an
    earlier capture, under other rules; exact and warm captures alike.
    Found by replaying libgit2's history (commit 9084712b55).
    """
    repo = init_repo(tmp_path / "repo", ("tool.sh", b"echo zero\r\n"), ("README", "r\n"))
    write(repo / "tool.sh", b"echo one\r\necho two\r\n")  # an edit the user has not staged
    os.utime(repo / "tool.sh", ns=(time.time_ns() - 5_000_000_000,) * 2)
    engine = make_engine(mode, nursery)
    try:
        first = await checkpoint(engine, repo)
        assert_matches_git(repo, first)
        write(repo / ".gitattributes", "*.sh text eol=lf\n")
        exact = await checkpoint(engine, repo, exact=True)
        assert_matches_git(repo, exact)
        assert blob(repo, exact["checkpoint"]["id"], "tool.sh") == b"echo one\necho two\n"
        write(repo / ".gitattributes", "*.sh text eol=lf\n*.md text\n")
        after = await checkpoint(engine, repo)
        assert_matches_git(repo, after)
        assert blob(repo, after["checkpoint"]["id"], "tool.sh") == b"echo one\necho two\n"
        (repo / ".gitattributes").unlink()  # and back: the raw bytes again
        back = await checkpoint(engine, repo)
        assert_matches_git(repo, back)
        assert blob(repo, back["checkpoint"]["id"], "tool.sh") == b"echo one\r\necho two\r\n"
    finally:
        await engine.aclose()
