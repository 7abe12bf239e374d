"""Tree-to-tree diffs, checked against git itself (diff-tree) as the oracle."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from snapshotd.errors import InvalidParams, NotFound
from snapshotd.git.repository import repository
from snapshotd.store.diff import diff_trees

_STATUS = {"A": "added", "M": "modified", "D": "deleted", "R": "renamed", "T": "type_changed"}


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> bytes:
    proc = subprocess.run(
        ["git", "-c", "gc.auto=0", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


def write_tree(wt: Path) -> str:
    """The tree of ``git add -A && git write-tree`` for the worktree, in a fresh index."""
    index = wt.parent / f".index-{os.urandom(6).hex()}"
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        git(wt, "add", "-A", env=env)
        return git(wt, "write-tree", env=env).decode().strip()
    finally:
        index.unlink(missing_ok=True)


def new_repo(tmp_path: Path, name: str = "wt") -> Path:
    wt = tmp_path / name
    wt.mkdir()
    git(wt, "init", "-q")
    return wt


def nested_repo(path: Path, content: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    env = {"GIT_DIR": str(path / ".git"), "GIT_WORK_TREE": str(path)}
    if not (path / ".git").exists():
        git(path, "init", "-q", env=env)
    (path / "n.txt").write_text(content)
    git(path, "add", "n.txt", env=env)
    git(path, "commit", "-qm", content, env=env)


def oracle(wt: Path, old: str, new: str) -> list[dict[str, Any]]:
    """FileChange records built from git diff-tree --raw and --numstat (-z)."""
    raw = git(wt, "diff-tree", "-r", "-M", "-z", "--raw", old, new).split(b"\0")
    records: list[dict[str, Any]] = []
    i = 0
    while i < len(raw) and raw[i]:
        meta = raw[i].decode()[1:].split()
        status = meta[4][0]
        old_path = os.fsdecode(raw[i + 1])
        if status in "RC":
            new_path = os.fsdecode(raw[i + 2])
            i += 3
        else:
            new_path = old_path
            i += 2
        zero = "0" * 40
        records.append(
            {
                "path": new_path,
                "old_path": old_path if status == "R" else None,
                "status": _STATUS[status],
                "old_mode": None if meta[0] == "000000" else meta[0],
                "new_mode": None if meta[1] == "000000" else meta[1],
                "old_oid": None if meta[2] == zero else meta[2],
                "new_oid": None if meta[3] == zero else meta[3],
            }
        )
    numstat = git(wt, "diff-tree", "-r", "-M", "-z", "--numstat", old, new).split(b"\0")
    counts: list[tuple[str, str]] = []
    i = 0
    while i < len(numstat) and numstat[i]:
        added, deleted, rest = numstat[i].decode().split("\t", 2)
        i += 3 if rest == "" else 1
        counts.append((added, deleted))
    assert len(counts) == len(records)
    for record, (added, deleted) in zip(records, counts, strict=True):
        binary = added == "-"
        record["binary"] = binary
        record["additions"] = 0 if binary else int(added)
        record["deletions"] = 0 if binary else int(deleted)
        for side in ("old", "new"):  # a binary file's bytes on each side, as `git diff --stat` shows them
            oid = record[f"{side}_oid"]
            record[f"{side}_size"] = int(git(wt, "cat-file", "-s", oid)) if binary and oid else None
    return records


def without_similarity(patch: str) -> str:
    """The patch with its similarity percentages blanked (libgit2 and git estimate them apart)."""
    return re.sub(r"(?m)^similarity index \d+%$", "similarity index N%", patch)


def ours(wt: Path, old: str | None, new: str | None, **kwargs: Any) -> dict[str, Any]:
    with repository(str(wt / ".git")) as repo:
        return diff_trees(repo, old, new, **kwargs).to_wire()


@pytest.fixture
def changed(tmp_path: Path) -> tuple[Path, str, str]:
    """A worktree with every kind of change between two trees."""
    wt = new_repo(tmp_path)
    (wt / "keep.txt").write_text("same\n")
    (wt / "edit.txt").write_text("one\ntwo\nthree\nfour\nfive\n")
    (wt / "ws.txt").write_text("a b\nc\n")
    (wt / "gone.txt").write_text("bye\nbye\n")
    (wt / "mode.sh").write_text("echo hi\n")
    (wt / "tolink").write_text("was a file\n")
    (wt / "link").symlink_to("keep.txt")
    (wt / "bin.dat").write_bytes(b"\x00\x01\x02binary\x00")
    (wt / "moved.txt").write_text("".join(f"line {i}\n" for i in range(40)))
    (wt / "folder").mkdir()
    (wt / "folder" / "inner.txt").write_text("inner\n")
    (wt / "togitlink").write_text("file first\n")
    (wt / "noeol.txt").write_bytes(b"no newline")
    nested_repo(wt / "nested", "first")
    old = write_tree(wt)

    (wt / "edit.txt").write_text("one\nTWO\nthree\nfive\nsix\nseven\n")
    (wt / "ws.txt").write_text("a  b\nc \n")
    (wt / "gone.txt").unlink()
    (wt / "mode.sh").chmod(0o755)
    (wt / "tolink").unlink()
    (wt / "tolink").symlink_to("edit.txt")
    (wt / "link").unlink()
    (wt / "link").write_text("now a file\nwith two lines\n")
    (wt / "bin.dat").write_bytes(b"\x00\x01\x02binary changed\x00")
    (wt / "moved.txt").rename(wt / "renamed.txt")
    with open(wt / "renamed.txt", "a") as handle:
        handle.write("one more\n")
    (wt / "added.txt").write_text("new\nfile\n")
    (wt / "folder" / "inner.txt").unlink()
    (wt / "folder").rmdir()
    (wt / "folder").write_text("folder became a file\n")
    (wt / "togitlink").unlink()
    nested_repo(wt / "togitlink", "gitlink now")
    nested_repo(wt / "nested", "second")
    (wt / "noeol.txt").write_bytes(b"no newline\n")
    (wt / "ünï cødé 😀.txt").write_text("unicode\n")
    new = write_tree(wt)
    return wt, old, new


def test_matches_git_on_every_kind_of_change(changed: tuple[Path, str, str]) -> None:
    wt, old, new = changed
    result = ours(wt, old, new)
    assert set(result) == {"files"}
    assert result["files"] == oracle(wt, old, new)


def test_statuses_and_counts(changed: tuple[Path, str, str]) -> None:
    wt, old, new = changed
    files = {f["path"]: f for f in ours(wt, old, new)["files"]}
    assert "keep.txt" not in files
    assert files["edit.txt"]["status"] == "modified"
    assert (files["edit.txt"]["additions"], files["edit.txt"]["deletions"]) == (3, 2)
    # Whitespace-only changes count.
    assert (files["ws.txt"]["additions"], files["ws.txt"]["deletions"]) == (2, 2)
    assert files["gone.txt"]["status"] == "deleted"
    assert files["gone.txt"]["new_mode"] is None and files["gone.txt"]["new_oid"] is None
    assert files["gone.txt"]["deletions"] == 2
    assert files["added.txt"]["status"] == "added"
    assert files["added.txt"]["old_mode"] is None and files["added.txt"]["old_oid"] is None
    mode = files["mode.sh"]
    assert (mode["status"], mode["old_mode"], mode["new_mode"]) == ("modified", "100644", "100755")
    assert mode["old_oid"] == mode["new_oid"] and mode["additions"] == mode["deletions"] == 0
    assert files["tolink"]["status"] == "type_changed"
    assert (files["tolink"]["old_mode"], files["tolink"]["new_mode"]) == ("100644", "120000")
    assert (files["tolink"]["additions"], files["tolink"]["deletions"]) == (1, 1)
    assert files["link"]["status"] == "type_changed"
    assert (files["link"]["additions"], files["link"]["deletions"]) == (2, 1)
    assert files["togitlink"]["status"] == "type_changed"
    assert files["togitlink"]["new_mode"] == "160000"
    assert files["nested"]["status"] == "modified"
    assert files["nested"]["old_mode"] == files["nested"]["new_mode"] == "160000"
    assert files["bin.dat"]["binary"] is True
    assert files["bin.dat"]["additions"] == files["bin.dat"]["deletions"] == 0
    assert files["bin.dat"]["old_size"] is not None and files["edit.txt"]["old_size"] is None
    assert (files["noeol.txt"]["additions"], files["noeol.txt"]["deletions"]) == (1, 1)
    renamed = files["renamed.txt"]
    assert (renamed["status"], renamed["old_path"]) == ("renamed", "moved.txt")
    assert (renamed["additions"], renamed["deletions"]) == (1, 0)
    assert "moved.txt" not in files
    assert files["folder"]["status"] == "added" and files["folder/inner.txt"]["status"] == "deleted"
    assert files["ünï cødé 😀.txt"]["status"] == "added"
    for record in files.values():
        assert set(record) == {
            "path", "old_path", "status", "old_mode", "new_mode",
            "old_oid", "new_oid", "binary", "additions", "deletions", "old_size", "new_size",
        }  # fmt: skip
        if record["status"] != "renamed":
            assert record["old_path"] is None


def test_renames_can_be_turned_off(changed: tuple[Path, str, str]) -> None:
    wt, old, new = changed
    files = {f["path"]: f for f in ours(wt, old, new, find_renames=False)["files"]}
    assert files["moved.txt"]["status"] == "deleted"
    assert files["renamed.txt"]["status"] == "added"
    assert not any(f["status"] == "renamed" for f in files.values())


def test_symlinks_and_gitlinks_moved_unchanged_are_renames_as_in_git(tmp_path: Path) -> None:
    """libgit2 pairs regular files only; git also pairs identical symlinks and gitlinks (R100)."""
    wt = new_repo(tmp_path)
    (wt / "b").mkdir()
    (wt / "b" / "link").symlink_to("t")  # two identical links: the one of the same base name goes first
    (wt / "b" / "other").symlink_to("t")
    (wt / "tab\there").symlink_to("q\"uoted")
    (wt / "edited").symlink_to("before")
    (wt / "tofile").symlink_to("same text")
    (wt / "plain.txt").write_text("moved too\n")
    nested_repo(wt / "sub1", "first")
    old = write_tree(wt)
    (wt / "z").mkdir()
    (wt / "a").mkdir()
    (wt / "b" / "link").rename(wt / "z" / "link")
    (wt / "b" / "other").rename(wt / "a" / "ln")
    (wt / "tab\there").rename(wt / "new\nname")
    (wt / "edited").unlink()
    (wt / "edited2").symlink_to("after")  # moved and changed: a deletion and an addition
    (wt / "tofile").unlink()
    (wt / "tofile2").write_text("same text")  # the link's text as a file: not a rename of it
    (wt / "plain.txt").rename(wt / "plain2.txt")
    (wt / "sub1").rename(wt / "sub2")
    new = write_tree(wt)

    files = ours(wt, old, new)["files"]
    assert files == oracle(wt, old, new)
    renames = {f["old_path"]: f["path"] for f in files if f["status"] == "renamed"}
    assert renames == {
        "b/link": "a/ln", "b/other": "z/link", "tab\there": "new\nname",
        "plain.txt": "plain2.txt", "sub1": "sub2",
    }  # fmt: skip
    patch = ours(wt, old, new, patch=True)["patch"]
    assert without_similarity(patch) == without_similarity(
        git(wt, "diff-tree", "-r", "-M", "-p", "--no-color", old, new).decode()
    )
    # A path on either side selects the rename, as for files.
    assert [f["path"] for f in ours(wt, old, new, paths=["sub1"])["files"]] == ["sub2"]
    turned_off = {f["path"]: f["status"] for f in ours(wt, old, new, find_renames=False)["files"]}
    assert turned_off["sub1"] == "deleted" and turned_off["sub2"] == "added"


def test_patch_matches_git(changed: tuple[Path, str, str]) -> None:
    wt, old, new = changed
    result = ours(wt, old, new, patch=True)
    expected = git(wt, "diff-tree", "-r", "-M", "-p", "--no-color", old, new).decode()
    assert without_similarity(result["patch"]) == without_similarity(expected)
    assert "Binary files a/bin.dat and b/bin.dat differ\n" in result["patch"]


def test_patch_context(changed: tuple[Path, str, str]) -> None:
    wt, old, new = changed
    for context in (0, 1, 10):
        result = ours(wt, old, new, patch=True, context=context, paths=["edit.txt", "ws.txt"])
        expected = git(
            wt, "diff-tree", "-r", "-M", "-p", f"-U{context}", old, new, "--", "edit.txt", "ws.txt"
        ).decode()
        assert result["patch"] == expected
    with pytest.raises(InvalidParams):
        ours(wt, old, new, context=-1)


def test_a_function_name_cut_after_a_blank_ends_its_hunk_header_as_gits(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    signature = "public static string ToWords(this int number, string culture, bool addAnd, stri n(int a)"
    assert signature[79] == " "  # git cuts the name at 80 bytes, then takes the blanks off its end
    body = [signature, "{", *map(str, range(1, 9))]
    (wt / "long.cs").write_text("\n".join(body) + "\n")
    (wt / "blank.c").write_text("x" * 60 + " " * 30 + "\n" + "".join(f"{n}\n" for n in range(1, 9)))
    old = write_tree(wt)
    (wt / "long.cs").write_text("\n".join(body).replace("\n7\n", "\nseven\n") + "\n")
    (wt / "blank.c").write_text("x" * 60 + " " * 30 + "\n" + "".join(f"{n}\n" for n in range(1, 9)).replace("7", "seven"))
    new = write_tree(wt)
    patch = ours(wt, old, new, patch=True)["patch"]
    assert patch == git(wt, "diff-tree", "-r", "-p", "--no-color", old, new).decode()
    assert "@@ -6,5 +6,5 @@ public static string ToWords(this int number, string culture, bool addAnd, stri\n" in patch


def test_an_empty_file_added_and_deleted_has_no_file_lines_as_in_git(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "kept.txt").write_text("kept\n")
    first = write_tree(wt)
    (wt / "new empty").write_bytes(b"")
    (wt / "kept.txt").write_bytes(b"")  # emptied: a hunk, so its ---/+++ lines stay
    second = write_tree(wt)
    (wt / "new empty").unlink()
    third = write_tree(wt)
    for old, new in ((first, second), (second, third)):
        patch = ours(wt, old, new, patch=True)["patch"]
        assert patch == git(wt, "diff-tree", "-r", "-M", "-p", "--no-color", old, new).decode()
        assert "new empty" in patch and "/dev/null" not in patch


def test_binary_added_and_deleted(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "old.bin").write_bytes(b"\x00" * 10 + b"tail")
    old = write_tree(wt)
    (wt / "old.bin").unlink()
    (wt / "new.bin").write_bytes(b"abc\x00def")
    new = write_tree(wt)
    result = ours(wt, old, new, patch=True)
    assert [(f["path"], f["status"], f["binary"]) for f in result["files"]] == [
        ("new.bin", "added", True),
        ("old.bin", "deleted", True),
    ]
    assert "Binary files /dev/null and b/new.bin differ\n" in result["patch"]
    assert "Binary files a/old.bin and /dev/null differ\n" in result["patch"]


def test_paths_filter_and_renames(changed: tuple[Path, str, str]) -> None:
    wt, old, new = changed
    only = ours(wt, old, new, paths=["edit.txt"])["files"]
    assert [f["path"] for f in only] == ["edit.txt"]
    # A rename is kept when either side is selected.
    by_old = ours(wt, old, new, paths=["moved.txt"])["files"]
    by_new = ours(wt, old, new, paths=["renamed.txt"])["files"]
    assert [f["path"] for f in by_old] == [f["path"] for f in by_new] == ["renamed.txt"]
    assert ours(wt, old, new, paths=["folder"])["files"] == [
        f for f in ours(wt, old, new)["files"] if f["path"] in ("folder", "folder/inner.txt")
    ]
    assert ours(wt, old, new, paths=[])["files"] == []
    assert ours(wt, old, new, paths=[""])["files"] == ours(wt, old, new)["files"]
    patched = ours(wt, old, new, paths=["tolink", "renamed.txt"], patch=True)
    expected = git(wt, "diff-tree", "-r", "-M", "-p", old, new, "--", "tolink").decode()
    assert expected in patched["patch"]
    assert "rename from moved.txt\nrename to renamed.txt\n" in patched["patch"]
    assert "diff --git a/edit.txt" not in patched["patch"]


def test_empty_trees(changed: tuple[Path, str, str]) -> None:
    wt, old, new = changed
    empty = git(wt, "hash-object", "-t", "tree", "/dev/null").decode().strip()
    added = ours(wt, None, old)["files"]
    assert added == oracle(wt, empty, old)
    assert all(f["status"] == "added" for f in added)
    deleted = ours(wt, new, None)["files"]
    assert deleted == oracle(wt, new, empty)
    assert ours(wt, None, None) == {"files": []}
    assert ours(wt, None, None, patch=True) == {"files": [], "patch": "", "next_offset": None}
    assert ours(wt, old, old, patch=True) == {"files": [], "patch": "", "next_offset": None}


def test_unknown_tree(changed: tuple[Path, str, str]) -> None:
    wt, old, _ = changed
    with pytest.raises(NotFound):
        ours(wt, old, "1" * 40)
    with pytest.raises(NotFound):
        ours(wt, "not-hex", old)


def test_commits_are_peeled_to_trees(changed: tuple[Path, str, str]) -> None:
    wt, old, new = changed
    commit = git(wt, "commit-tree", old, "-m", "x").decode().strip()
    assert ours(wt, commit, new) == ours(wt, old, new)


def test_order_and_counts_over_hundreds_of_files(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    names = []
    for i in range(420):
        folder = ["", "a/", "a/b/", "a-b/", "a.b/", "z/", "a b/"][i % 7]
        name = f"{folder}f{i:03d}{'.txt' if i % 3 else '-x'}"
        names.append(name)
        path = wt / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{i} {j}\n" for j in range(i % 17 + 1)))
    old = write_tree(wt)
    for i, name in enumerate(names):
        path = wt / name
        if i % 5 == 0:
            path.unlink()
        elif i % 5 == 1:
            path.write_text(path.read_text() + "more\n")
        elif i % 5 == 2 and i % 2:
            path.rename(path.with_name(path.name + ".moved"))
        elif i % 5 == 3:
            path.chmod(0o755)
    for i in range(40):
        (wt / f"a/new{i}.py").write_text(f"print({i})\n")
    new = write_tree(wt)
    result = ours(wt, old, new, patch=True)
    assert len(result["files"]) > 300
    assert result["files"] == oracle(wt, old, new)
    expected = git(wt, "diff-tree", "-r", "-M", "-p", old, new).decode()
    assert without_similarity(result["patch"]) == without_similarity(expected)


def test_non_utf8_names(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    old = write_tree(wt)
    name = os.fsdecode(b"caf\xe9.txt")
    (wt / name).write_text("latin-1 name\n")
    new = write_tree(wt)
    files = ours(wt, old, new)["files"]
    assert [f["path"] for f in files] == [name]
    assert os.fsencode(files[0]["path"]) == b"caf\xe9.txt"


def test_a_diff_with_a_file_too_big_for_libgit2_is_gits_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from snapshotd.git import process

    wt = new_repo(tmp_path)
    (wt / "big.txt").write_text("".join(f"line {n} of a big file\n" for n in range(20_000)))  # about 470 KB
    (wt / "small.txt").write_text("one\ntwo\n")
    (wt / "moved.txt").write_text("".join(f"kept {n}\n" for n in range(50)))
    old = write_tree(wt)
    (wt / "big.txt").write_text("".join(f"line {n} of a {'bigger' if n % 1000 == 0 else 'big'} file\n" for n in range(20_500)))
    (wt / "small.txt").write_text("one\nthree\n")
    (wt / "moved.txt").rename(wt / "there.txt")
    new = write_tree(wt)
    calls: list[list[str]] = []
    real = process.run_git_sync
    monkeypatch.setattr("snapshotd.store.gitdiff.run_git_sync", lambda target, args, **kw: calls.append(args) or real(target, args, **kw))
    result = ours(wt, old, new, patch=True)
    assert [args[0] for args in calls] == ["diff-tree"]  # made by git, not by libgit2 in this process
    assert result["files"] == oracle(wt, old, new)
    expected = git(wt, "diff-tree", "-r", "-M", "-p", old, new).decode()
    assert without_similarity(result["patch"]) == without_similarity(expected)
    assert ours(wt, old, new, paths=["small.txt"], patch=True)["files"] == [
        change for change in oracle(wt, old, new) if change["path"] == "small.txt"
    ]


def _loose_path(wt: Path, oid: str) -> Path:
    return wt / ".git" / "objects" / oid[:2] / oid[2:]


def test_a_diff_reads_no_subtree_that_is_the_same_on_both_sides(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    for folder in ("same/deep/er", "edited/deep"):
        (wt / folder).mkdir(parents=True)
        (wt / folder / "f.txt").write_text(f"{folder}\n")
    old = write_tree(wt)
    (wt / "edited" / "deep" / "f.txt").write_text("changed\n")
    new = write_tree(wt)
    expected = oracle(wt, old, new)
    same = git(wt, "rev-parse", f"{old}:same").decode().strip()
    _loose_path(wt, same).unlink()  # a subtree both sides share, gone: only a full walk would need it
    assert ours(wt, old, new)["files"] == expected == [
        {**expected[0], "path": "edited/deep/f.txt", "status": "modified"}
    ]
    assert "+changed" in ours(wt, old, new, patch=True)["patch"]


def test_folders_and_names_that_share_a_prefix_match_git(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    files = {
        "a": "a file\n", "a.txt": "sibling\n", "a-b/x": "dash\n", "ab/x": "ab\n",
        "d/e/f/g.txt": "".join(f"line {i}\n" for i in range(30)), "d/e/keep": "keep\n",
        "gone/one": "1\n", "gone/two/three": "3\n", "turn/into/file": "was deep\n",
        "x/y": "".join(f"moved {i}\n" for i in range(30)),
    }  # fmt: skip
    for name, text in files.items():
        (wt / name).parent.mkdir(parents=True, exist_ok=True)
        (wt / name).write_text(text)
    old = write_tree(wt)
    (wt / "a").unlink()
    (wt / "a" / "now").mkdir(parents=True)
    (wt / "a" / "now" / "deep").write_text("a folder now\n")
    (wt / "a-b" / "x").write_text("dash changed\n")
    (wt / "d/e/f/g.txt").write_text(files["d/e/f/g.txt"] + "one more\n")
    subprocess.run(["rm", "-r", str(wt / "gone"), str(wt / "turn" / "into")], check=True)
    (wt / "turn" / "into").write_text("a file now\n")
    (wt / "new" / "folder").mkdir(parents=True)
    (wt / "x" / "y").rename(wt / "new" / "folder" / "y")
    new = write_tree(wt)
    for old_side, new_side in ((old, new), (new, old), (None, new), (old, None)):
        sides = [side or git(wt, "hash-object", "-t", "tree", "/dev/null").decode().strip() for side in (old_side, new_side)]
        assert ours(wt, old_side, new_side)["files"] == oracle(wt, *sides)
        expected = git(wt, "diff-tree", "-r", "-M", "-p", *sides).decode()
        assert without_similarity(ours(wt, old_side, new_side, patch=True)["patch"]) == without_similarity(expected)


def test_a_diff_in_a_repository_with_a_sparse_index_matches_git(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    for name in ("in/f.txt", "out/g.txt"):
        (wt / name).parent.mkdir(exist_ok=True)
        (wt / name).write_text("a\nb\n")
    git(wt, "add", "-A")
    git(wt, "commit", "-qm", "one")
    old = write_tree(wt)
    (wt / "in" / "f.txt").write_text("a\nc\n")
    new = write_tree(wt)
    git(wt, "sparse-checkout", "set", "--cone", "--sparse-index", "in")
    assert b"out/\0" in git(wt, "ls-files", "-z", "--sparse")  # a folder entry: libgit2 cannot read this index
    result = ours(wt, old, new, patch=True)
    assert result["files"] == oracle(wt, old, new)
    assert result["patch"] == git(wt, "diff-tree", "-r", "-M", "-p", old, new).decode()


def test_gitattributes_kept_only_in_the_index_apply_until_the_index_drops_them(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "f.txt").write_text("a\nb\n")
    old = write_tree(wt)
    (wt / "f.txt").write_text("a\nc\n")
    new = write_tree(wt)
    (wt / "sub").mkdir()
    for place in (wt, wt / "sub"):
        (place / ".gitattributes").write_text("*.txt -diff\n")
    git(wt, "add", ".gitattributes", "sub/.gitattributes")
    (wt / ".gitattributes").unlink()  # in the index alone: git and libgit2 read it from there
    for binary in (True, False):
        expected = git(wt, "diff-tree", "-r", "-p", old, new).decode()
        assert ("Binary files a/f.txt and b/f.txt differ" in expected) is binary
        assert ours(wt, old, new, patch=True)["patch"] == expected
        assert ours(wt, old, new)["files"][0]["binary"] is binary
        if binary:
            git(wt, "rm", "-q", "--cached", ".gitattributes")
