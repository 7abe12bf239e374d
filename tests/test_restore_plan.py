"""Restore and revert: planning from trees, safe application, crash recovery.

Trees come from git itself (``git add -A && git write-tree`` into a temporary
index), so every round trip is checked against git: after a restore, capturing
the worktree again must give the checkpoint's tree, byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from restore_helpers import capture, temps_left

from snapshotd.errors import FilesystemError, InvalidParams, NotFound
from snapshotd.git.repository import open_repository
from snapshotd.restore import fileops, plan as restore
from snapshotd.restore.fileops import TEMP_PREFIX
from snapshotd.restore.journal import recover
from snapshotd.restore.outcome import RestoreOutcome
from snapshotd.restore.plan import Plan, plan_restore, plan_revert
from snapshotd.restore.prepared import apply_plan
from snapshotd.restore.trees import Entry, flatten_tree

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------
# helpers


def git(
    cwd: Path, *args: str, env: dict[str, str] | None = None, input: bytes | None = None
) -> bytes:
    proc = subprocess.run(
        ["git", "-c", "gc.auto=0", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        input=input,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


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


def snapshot(top: Path) -> dict[str, tuple[Any, ...]]:
    """Every file and link under ``top`` (never following links), without the root .git."""
    found: dict[str, tuple[Any, ...]] = {}
    for folder, dirs, files in os.walk(top):
        rel_folder = os.path.relpath(folder, top)
        if rel_folder == ".":
            dirs[:] = [d for d in dirs if d != ".git"]
        for name in dirs + files:
            full = os.path.join(folder, name)
            rel = os.path.normpath(os.path.join(rel_folder, name))
            st_ = os.lstat(full)
            if stat.S_ISLNK(st_.st_mode):
                found[rel] = ("link", os.readlink(full))
            elif stat.S_ISREG(st_.st_mode):
                with open(full, "rb") as handle:
                    found[rel] = ("file", handle.read(), bool(st_.st_mode & 0o100))
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
    return found


def identity(path: Path) -> tuple[int, int]:
    st_ = os.lstat(path)
    return st_.st_ino, st_.st_mtime_ns





def do_restore(
    wt: Path,
    target: str,
    paths: list[str] | None = None,
    exclude: tuple[str, ...] = (),
) -> tuple[Plan, RestoreOutcome]:
    repo = open_repository(str(wt / ".git"))
    current = capture(wt, exclude)
    plan = plan_restore(repo, current, target, paths, str(wt))
    done = apply_plan(repo, str(wt), plan, str(wt.parent / "journal"))
    assert temps_left(wt) == []
    assert not list((wt.parent / "journal").glob("*.journal"))
    return plan, done


def written(plan: Plan) -> list[str]:
    return [path for path, _ in plan.writes]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Real files outside the worktree that must survive everything."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "victim.txt").write_bytes(b"precious outside data\n")
    (out / "x.txt").write_bytes(b"outside x\n")
    return out


def assert_outside_intact(out: Path) -> None:
    assert snapshot(out) == {
        "victim.txt": ("file", b"precious outside data\n", False),
        "x.txt": ("file", b"outside x\n", False),
    }


# ---------------------------------------------------------------------------
# the full round trip


IGNORE_RULES = "*.log\nbuild/\nignored-dir/\n/cache.tmp\n"
ODD = os.fsdecode(b"caf\xe9 latin1.txt")


def build_state_a(wt: Path, out: Path) -> None:
    (wt / ".gitignore").write_text(IGNORE_RULES)
    (wt / "plain.txt").write_text("hello\n")
    (wt / "keep.txt").write_text("never touched\n")
    (wt / "deep" / "keep").mkdir(parents=True)
    (wt / "deep" / "keep" / "same.txt").write_text("same\n")
    (wt / "deep" / "edit.txt").write_text("deep edit\n")
    (wt / "deep" / "tmp.log").write_text("ignored inside a tracked folder\n")
    (wt / "exec.sh").write_text("#!/bin/sh\necho exec\n")
    (wt / "exec.sh").chmod(0o755)
    (wt / "noexec.sh").write_text("#!/bin/sh\necho plain\n")
    (wt / "delete-me.txt").write_text("deleted later\n")
    (wt / "tolink.txt").write_text("becomes a link\n")
    (wt / "link-to-file").symlink_to("plain.txt")
    (wt / "link-to-dir").symlink_to("deep")
    (wt / "rel-out").symlink_to("../outside/victim.txt")
    (wt / "abs-out").symlink_to(out / "x.txt")
    (wt / "dir2file" / "sub").mkdir(parents=True)
    (wt / "dir2file" / "a.txt").write_text("a\n")
    (wt / "dir2file" / "sub" / "b.txt").write_text("b\n")
    (wt / "file2dir").write_text("a file first\n")
    (wt / "bin.dat").write_bytes(b"\x00\x01\x02\xffbinary\x00no final newline")
    (wt / "ünï").mkdir()
    (wt / "ünï" / "файл 😀.txt").write_text("unicode\n")
    (wt / "name with spaces.txt").write_text("spaces\n")
    (wt / "new\nline.txt").write_text("newline in the name\n")
    (wt / "-leading-dash.txt").write_text("dash\n")
    (wt / ODD).write_text("latin-1 name\n")
    (wt / "app.log").write_text("ignored at A\n")
    (wt / "build").mkdir()
    (wt / "build" / "out.o").write_bytes(b"\x7fELF ignored")
    (wt / "cache.tmp").write_text("ignored cache\n")


def mutate_everything(wt: Path, out: Path) -> None:
    (wt / "plain.txt").write_text("hello, changed\n")
    (wt / "deep" / "edit.txt").write_text("deep edit changed\nand longer\n")
    (wt / "exec.sh").chmod(0o644)
    (wt / "noexec.sh").chmod(0o755)
    (wt / "delete-me.txt").unlink()
    (wt / "tolink.txt").unlink()
    (wt / "tolink.txt").symlink_to("plain.txt")
    (wt / "link-to-file").unlink()
    (wt / "link-to-file").write_text("now a regular file\n")
    (wt / "abs-out").unlink()
    (wt / "abs-out").symlink_to(out / "victim.txt")
    shutil.rmtree(wt / "dir2file")
    (wt / "dir2file").write_text("was a folder\n")
    (wt / "file2dir").unlink()
    (wt / "file2dir" / "inner").mkdir(parents=True)
    (wt / "file2dir" / "inner" / "c.txt").write_text("c\n")
    (wt / "bin.dat").write_bytes(b"\x00\x00changed\x00\xfe")
    (wt / "ünï" / "файл 😀.txt").write_text("unicode changed\n")
    (wt / "ünï" / "новый.txt").write_text("new unicode\n")
    (wt / "name with spaces.txt").unlink()
    (wt / "new\nline.txt").write_text("edited\n")
    (wt / "-leading-dash.txt").chmod(0o755)
    (wt / ODD).write_text("latin-1 name, edited\n")
    (wt / "created.txt").write_text("created after A\n")
    (wt / "newdir" / "a").mkdir(parents=True)
    (wt / "newdir" / "a" / "b.txt").write_text("new tree\n")
    (wt / "newdir2").mkdir()
    (wt / "newdir2" / "file.txt").write_text("captured\n")
    (wt / "newdir2" / "x.log").write_text("ignored in a new folder\n")
    # Ignored content: edited, new, in new ignored folders.
    (wt / "app.log").write_text("ignored, edited after A\n")
    (wt / "debug.log").write_text("new ignored\n")
    (wt / "build" / "new.o").write_bytes(b"new ignored object")
    (wt / "ignored-dir" / "x").mkdir(parents=True)
    (wt / "ignored-dir" / "x" / "y.txt").write_text("in a new ignored folder\n")
    # Untracked and over the size cap: not in the current tree.
    (wt / "big.bin").write_bytes(b"\x01" * 200_000)


IGNORED = {
    "app.log",
    "debug.log",
    "build/out.o",
    "build/new.o",
    "cache.tmp",
    "deep/tmp.log",
    "ignored-dir/x/y.txt",
    "newdir2/x.log",
    "big.bin",
}


def test_round_trip_every_kind_of_change(tmp_path: Path, outside: Path) -> None:
    wt = new_repo(tmp_path)
    build_state_a(wt, outside)
    tree_a = capture(wt)
    state_a = {p: v for p, v in snapshot(wt).items() if p not in IGNORED}
    kept = {
        p: identity(wt / p) for p in ("keep.txt", "deep/keep/same.txt", "link-to-dir", "rel-out")
    }
    noexec_inode = os.lstat(wt / "noexec.sh").st_ino

    mutate_everything(wt, outside)
    before = snapshot(wt)
    plan, done = do_restore(wt, tree_a, exclude=("big.bin",))

    assert done.conflicts == []
    assert capture(wt, exclude=("big.bin",)) == tree_a
    after = snapshot(wt)
    assert {p: v for p, v in after.items() if p not in IGNORED} == state_a
    assert {p: v for p, v in after.items() if p in IGNORED} == {
        p: v for p, v in before.items() if p in IGNORED
    }
    assert {p: identity(wt / p) for p in kept} == kept
    # A mode-only change is a chmod: same inode, exec bit cleared.
    assert os.lstat(wt / "noexec.sh").st_ino == noexec_inode
    assert "noexec.sh" in plan.chmod_only and "exec.sh" in plan.chmod_only
    assert stat.S_IMODE(os.lstat(wt / "exec.sh").st_mode) & 0o111 == 0o111
    assert os.readlink(wt / "abs-out") == str(outside / "x.txt")
    assert os.readlink(wt / "rel-out") == "../outside/victim.txt"
    assert (wt / "newdir2").is_dir() and not (wt / "newdir").exists()
    assert not (wt / "file2dir").is_dir() and (wt / "dir2file").is_dir()
    assert set(done.written) >= {
        "plain.txt",
        "dir2file/a.txt",
        "file2dir",
        "link-to-file",
        "tolink.txt",
    }
    assert "keep.txt" not in done.written and "keep.txt" not in done.deleted
    assert set(done.deleted) >= {
        "created.txt",
        "newdir/a/b.txt",
        "file2dir/inner/c.txt",
        "dir2file",
    }
    assert not any(p in IGNORED for p in done.written + done.deleted)
    assert_outside_intact(outside)

    # Restoring again is a no-op: nothing differs.
    _, again = do_restore(wt, tree_a, exclude=("big.bin",))
    assert (again.written, again.deleted, again.conflicts) == ([], [], [])


def test_restore_forth_and_back(tmp_path: Path, outside: Path) -> None:
    wt = new_repo(tmp_path)
    build_state_a(wt, outside)
    tree_a = capture(wt)
    state_a = snapshot(wt)
    mutate_everything(wt, outside)
    (wt / "big.bin").unlink()
    tree_b = capture(wt)
    state_b = snapshot(wt)
    for target, state_ in ((tree_a, state_a), (tree_b, state_b), (tree_a, state_a)):
        do_restore(wt, target)
        assert capture(wt) == target
        visible = {p: v for p, v in snapshot(wt).items() if p not in IGNORED}
        assert visible == {p: v for p, v in state_.items() if p not in IGNORED}
    assert_outside_intact(outside)


def test_planning_touches_nothing(tmp_path: Path, outside: Path) -> None:
    wt = new_repo(tmp_path)
    build_state_a(wt, outside)
    tree_a = capture(wt)
    mutate_everything(wt, outside)
    before = snapshot(wt)
    repo = open_repository(str(wt / ".git"))
    plan = plan_restore(repo, capture(wt, ("big.bin",)), tree_a, None, str(wt))
    assert plan.writes and plan.deletes
    assert snapshot(wt) == before


# ---------------------------------------------------------------------------
# ignored and over-cap files


def test_ignored_file_in_the_way_is_a_conflict(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / ".gitignore").write_text("")
    (wt / "notes.txt").write_text("captured at A\n")
    (wt / "gen").mkdir()
    (wt / "gen" / "x.txt").write_text("generated at A\n")
    (wt / "out").write_text("a file at A\n")
    tree_a = capture(wt)

    (wt / ".gitignore").write_text("notes.txt\ngen/\n*.log\n")
    (wt / "notes.txt").write_text("now ignored, edited\n")
    (wt / "gen" / "x.txt").write_text("ignored now\n")
    (wt / "gen" / "other.txt").write_text("more ignored\n")
    (wt / "out").unlink()
    (wt / "out").mkdir()
    (wt / "out" / "a.log").write_text("ignored in a folder that stands where a file was\n")
    (wt / "out" / "b.txt").write_text("captured\n")
    before = snapshot(wt)

    _, done = do_restore(wt, tree_a)
    assert {c["path"]: c["reason"] for c in done.conflicts} == {
        "gen/x.txt": restore.REASON_IN_THE_WAY,
        "notes.txt": restore.REASON_IN_THE_WAY,
        "out": restore.REASON_IN_THE_WAY,
    }
    assert done.written == [".gitignore"]
    assert done.deleted == ["out/b.txt"]
    after = snapshot(wt)
    for path in ("notes.txt", "gen/x.txt", "gen/other.txt", "out/a.log"):
        assert after[path] == before[path]
    assert after[".gitignore"] == ("file", b"", False)
    assert "out/b.txt" not in after


def test_ignoring_a_file_after_capture_does_not_delete_it(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "a.txt").write_text("a\n")
    tree_a = capture(wt)
    # .gitignore is created after A: restoring A removes it, but the files it
    # made ignored are not in the current tree and are left alone.
    (wt / ".gitignore").write_text("*.csv\n")
    (wt / "data.csv").write_text("1,2,3\n")
    _, done = do_restore(wt, tree_a)
    assert done.deleted == [".gitignore"] and done.conflicts == []
    assert (wt / "data.csv").read_text() == "1,2,3\n"


def test_oversized_untracked_files_survive(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "data.bin").write_bytes(b"small at A")
    (wt / "src.txt").write_text("x\n")
    tree_a = capture(wt)
    (wt / "data.bin").write_bytes(b"\x02" * 300_000)  # grew over the cap: not captured
    (wt / "dump").mkdir()
    (wt / "dump" / "huge.bin").write_bytes(b"\x03" * 300_000)
    (wt / "src.txt").write_text("y\n")
    _, done = do_restore(wt, tree_a, exclude=("data.bin", "dump/huge.bin"))
    assert done.conflicts == [{"path": "data.bin", "reason": restore.REASON_IN_THE_WAY}]
    assert (wt / "data.bin").read_bytes() == b"\x02" * 300_000
    assert (wt / "dump" / "huge.bin").read_bytes() == b"\x03" * 300_000
    assert (wt / "src.txt").read_text() == "x\n"


def test_identical_files_keep_inode_and_mtime(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    for i in range(50):
        (wt / f"d{i % 5}").mkdir(exist_ok=True)
        (wt / f"d{i % 5}" / f"f{i}.txt").write_text(f"{i}\n")
    tree_a = capture(wt)
    ids = {p: identity(wt / p) for p in snapshot(wt)}
    dir_ids = {d: identity(wt / d) for d in ("d0", "d1", "d2", "d3", "d4")}
    (wt / "d3" / "f3.txt").write_text("changed\n")
    time.sleep(0.01)
    _, done = do_restore(wt, tree_a)
    assert done.written == ["d3/f3.txt"] and done.deleted == []
    now = {p: identity(wt / p) for p in snapshot(wt)}
    assert {p: v for p, v in now.items() if p != "d3/f3.txt"} == {
        p: v for p, v in ids.items() if p != "d3/f3.txt"
    }
    assert {d: identity(wt / d) for d in ("d0", "d1", "d2", "d4")} == {
        d: dir_ids[d] for d in ("d0", "d1", "d2", "d4")
    }


def test_permissions_of_rewritten_files_are_kept(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "secret.txt").write_text("v1\n")
    (wt / "tool").write_text("v1\n")
    (wt / "tool").chmod(0o755)
    tree_a = capture(wt)
    (wt / "secret.txt").write_text("v2\n")
    (wt / "secret.txt").chmod(0o600)
    (wt / "tool").write_text("v2\n")
    (wt / "tool").chmod(0o700)
    (wt / "gone.txt").write_text("x\n")
    do_restore(wt, tree_a)
    assert stat.S_IMODE(os.lstat(wt / "secret.txt").st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(wt / "tool").st_mode) == 0o700
    (wt / "secret.txt").unlink()
    do_restore(wt, tree_a)
    umask = fileops.read_umask()
    assert stat.S_IMODE(os.lstat(wt / "secret.txt").st_mode) == 0o666 & ~umask


# ---------------------------------------------------------------------------
# symlinks: never followed, nothing outside touched


def test_symlinked_folder_pointing_out_is_replaced_not_followed(
    tmp_path: Path, outside: Path
) -> None:
    wt = new_repo(tmp_path)
    (wt / "data").mkdir()
    (wt / "data" / "victim.txt").write_text("inside version\n")
    (wt / "data" / "x.txt").write_text("inside x\n")
    tree_a = capture(wt)
    # The checkpoint's folder is now a symlink to a real folder outside.
    shutil.rmtree(wt / "data")
    (wt / "data").symlink_to(outside)
    _, done = do_restore(wt, tree_a)
    assert done.deleted == ["data"] and done.written == ["data/victim.txt", "data/x.txt"]
    assert not (wt / "data").is_symlink() and (wt / "data").is_dir()
    assert (wt / "data" / "victim.txt").read_text() == "inside version\n"
    assert_outside_intact(outside)
    assert capture(wt) == tree_a


def test_symlink_where_a_folder_was_is_restored_as_link(tmp_path: Path, outside: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "ln").symlink_to(outside)
    (wt / "abs").symlink_to(outside / "victim.txt")
    tree_a = capture(wt)
    # The link became a real folder whose files share names with the outside ones.
    (wt / "ln").unlink()
    (wt / "ln").mkdir()
    (wt / "ln" / "victim.txt").write_text("inside, to be deleted\n")
    (wt / "ln" / "new.txt").write_text("new\n")
    (wt / "abs").unlink()
    _, done = do_restore(wt, tree_a)
    assert set(done.deleted) == {"ln/victim.txt", "ln/new.txt"}
    assert done.written == ["abs", "ln"]
    assert os.readlink(wt / "ln") == str(outside)
    assert os.readlink(wt / "abs") == str(outside / "victim.txt")
    assert_outside_intact(outside)
    assert capture(wt) == tree_a


def test_unrecorded_symlink_in_the_way_is_a_conflict(tmp_path: Path, outside: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / ".gitignore").write_text("")
    (wt / "ext").mkdir()
    (wt / "ext" / "victim.txt").write_text("inside\n")
    tree_a = capture(wt)
    (wt / ".gitignore").write_text("ext\n")
    shutil.rmtree(wt / "ext")
    (wt / "ext").symlink_to(outside)  # ignored, so not in the current tree
    _, done = do_restore(wt, tree_a)
    assert done.conflicts == [{"path": "ext/victim.txt", "reason": restore.REASON_SYMLINK}]
    assert os.readlink(wt / "ext") == str(outside)
    assert_outside_intact(outside)


def test_handmade_plan_through_a_symlink_touches_nothing_outside(
    tmp_path: Path, outside: Path
) -> None:
    wt = new_repo(tmp_path)
    (wt / "ln").symlink_to(outside)
    (wt / "real").mkdir()
    (wt / "real" / "inner").symlink_to(outside)
    (wt / "afile").write_text("a plain file\n")
    repo = open_repository(str(wt / ".git"))
    blob = str(repo.create_blob(b"should never land outside\n"))
    plan = Plan(
        writes=[
            ("ln/victim.txt", Entry(blob, 0o100644)),
            ("ln/brand-new.txt", Entry(blob, 0o100644)),
            ("real/inner/x.txt", Entry(blob, 0o100755)),
            ("afile/x.txt", Entry(blob, 0o100644)),
            ("ok.txt", Entry(blob, 0o100644)),
        ],
        deletes=["ln/victim.txt", "real/inner/x.txt", "ln/x.txt"],
    )
    done = apply_plan(repo, str(wt), plan, str(tmp_path / "journal"))
    assert_outside_intact(outside)
    assert done.written == ["ok.txt"] and done.deleted == []
    assert {c["path"]: c["reason"] for c in done.conflicts} == {
        "afile/x.txt": restore.REASON_FILE,
        "ln/brand-new.txt": restore.REASON_SYMLINK,
        "ln/victim.txt": restore.REASON_SYMLINK,
        "ln/x.txt": restore.REASON_SYMLINK,
        "real/inner/x.txt": restore.REASON_SYMLINK,
    }
    assert os.readlink(wt / "ln") == str(outside)
    assert (wt / "afile").read_text() == "a plain file\n"
    assert temps_left(wt) == [] and temps_left(outside) == []


def test_disk_changing_between_plan_and_apply(tmp_path: Path, outside: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "d").mkdir()
    (wt / "d" / "victim.txt").write_text("v1\n")
    tree_a = capture(wt)
    (wt / "d" / "victim.txt").write_text("v2\n")
    (wt / "d" / "x.txt").write_text("new\n")
    repo = open_repository(str(wt / ".git"))
    plan = plan_restore(repo, capture(wt), tree_a, None, str(wt))
    assert written(plan) == ["d/victim.txt"] and plan.deletes == ["d/x.txt"]
    # Someone swaps the folder for a symlink pointing out before the apply.
    shutil.rmtree(wt / "d")
    (wt / "d").symlink_to(outside)
    done = apply_plan(repo, str(wt), plan, str(tmp_path / "journal"))
    assert_outside_intact(outside)
    assert done.written == [] and done.deleted == []
    assert done.conflicts == [
        {"path": "d/victim.txt", "reason": restore.REASON_SYMLINK},
        {"path": "d/x.txt", "reason": restore.REASON_SYMLINK},
    ]


# ---------------------------------------------------------------------------
# subsets, nested repositories, validation


def test_subset_restore_leaves_siblings_alone(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    for rel in ("src/a.py", "src/b.py", "src/sub/c.py", "docs/d.md", "README", "srcx/e.py"):
        (wt / rel).parent.mkdir(parents=True, exist_ok=True)
        (wt / rel).write_text(f"{rel} at A\n")
    tree_a = capture(wt)
    for rel in ("src/a.py", "src/sub/c.py", "docs/d.md", "README", "srcx/e.py"):
        (wt / rel).write_text(f"{rel} edited\n")
    (wt / "src" / "new.py").write_text("new\n")
    (wt / "docs" / "new.md").write_text("new\n")
    _, done = do_restore(wt, tree_a, paths=["src"])
    assert done.written == ["src/a.py", "src/sub/c.py"] and done.deleted == ["src/new.py"]
    assert (wt / "src" / "a.py").read_text() == "src/a.py at A\n"
    for rel in ("docs/d.md", "README", "srcx/e.py"):
        assert (wt / rel).read_text() == f"{rel} edited\n"
    assert (wt / "docs" / "new.md").exists()

    _, done = do_restore(wt, tree_a, paths=["docs/d.md"])
    assert done.written == ["docs/d.md"] and done.deleted == []
    assert (wt / "docs" / "new.md").exists() and (wt / "README").read_text() == "README edited\n"


def test_subset_restore_does_not_remove_what_is_outside_the_selection(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "d").mkdir()
    (wt / "d" / "f").write_text("f at A\n")
    tree_a = capture(wt)
    shutil.rmtree(wt / "d")
    (wt / "d").write_text("d is a file now\n")
    _, done = do_restore(wt, tree_a, paths=["d/f"])
    assert done.conflicts == [{"path": "d/f", "reason": restore.REASON_OUTSIDE_SELECTION}]
    assert (wt / "d").read_text() == "d is a file now\n"


def test_nested_repositories_are_never_emptied(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    nested_repo(wt / "sub", "first")
    (wt / "file").write_text("x\n")
    tree_a = capture(wt)
    nested_repo(wt / "sub", "second")  # moved to another commit
    nested_repo(wt / "other", "created after A")
    before = snapshot(wt)
    _, done = do_restore(wt, tree_a)
    assert {c["path"]: c["reason"] for c in done.conflicts} == {
        "other": restore.REASON_NESTED_KEPT,
        "sub": restore.REASON_NESTED_COMMIT,
    }
    assert done.written == [] and done.deleted == []
    assert snapshot(wt) == before

    # A gitlink whose folder is gone comes back as an empty folder.
    shutil.rmtree(wt / "sub")
    _, done = do_restore(wt, tree_a)
    assert done.written == ["sub"]
    assert (wt / "sub").is_dir() and os.listdir(wt / "sub") == []


def test_unknown_object_touches_nothing(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "a.txt").write_text("a\n")
    (wt / "b.txt").write_text("b\n")
    repo = open_repository(str(wt / ".git"))
    good = str(repo.create_blob(b"good\n"))
    before = snapshot(wt)
    plan = Plan(
        writes=[("a.txt", Entry(good, 0o100644)), ("c.txt", Entry("1" * 40, 0o100644))],
        deletes=["b.txt"],
    )
    with pytest.raises(NotFound):
        apply_plan(repo, str(wt), plan, str(tmp_path / "journal"))
    assert snapshot(wt) == before
    with pytest.raises(NotFound):
        plan_restore(repo, capture(wt), "2" * 40, None, str(wt))


@pytest.mark.parametrize(
    "bad", ["../escape.txt", ".git/config", "a/../../x", "/abs", "a//b", "sub/.GIT/x"]
)
def test_unsafe_plan_paths_are_refused(tmp_path: Path, bad: str) -> None:
    wt = new_repo(tmp_path)
    (wt / "a.txt").write_text("a\n")
    repo = open_repository(str(wt / ".git"))
    blob = str(repo.create_blob(b"x"))
    before = snapshot(wt)
    with pytest.raises(InvalidParams):
        apply_plan(
            repo,
            str(wt),
            Plan(writes=[("a.txt", Entry(blob, 0o100644)), (bad, Entry(blob, 0o100644))]),
            str(tmp_path / "j"),
        )
    with pytest.raises(InvalidParams):
        apply_plan(repo, str(wt), Plan(deletes=["a.txt", bad]), str(tmp_path / "j"))
    assert snapshot(wt) == before


def test_unsafe_names_in_a_tree_are_conflicts(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "a.txt").write_text("a\n")
    current = capture(wt)
    blob = git(wt, "hash-object", "-w", "--stdin", input=b"evil hook\n").decode().strip()
    hooks = (
        git(wt, "mktree", input=f"100755 blob {blob}\tpost-checkout\n".encode()).decode().strip()
    )
    entries = f"040000 tree {hooks}\t.git\n100644 blob {blob}\t..\n100644 blob {blob}\tok.txt\n"
    evil = git(wt, "mktree", input=entries.encode()).decode().strip()
    repo = open_repository(str(wt / ".git"))
    plan = plan_restore(repo, current, evil, None, str(wt))
    assert written(plan) == ["ok.txt"] and plan.deletes == ["a.txt"]
    assert {c["path"] for c in plan.conflicts} == {".git", ".."}
    apply_plan(repo, str(wt), plan, str(tmp_path / "journal"))
    assert not (wt / ".git" / "post-checkout").exists()


def test_flatten_tree_matches_ls_tree(tmp_path: Path, outside: Path) -> None:
    wt = new_repo(tmp_path)
    build_state_a(wt, outside)
    nested_repo(wt / "nest", "n")
    tree = capture(wt)
    listing = git(wt, "ls-tree", "-r", "-z", tree).split(b"\0")
    expected = {}
    for line in filter(None, listing):
        meta, path = line.split(b"\t", 1)
        mode, _, oid = meta.decode().split()
        expected[os.fsdecode(path)] = Entry(oid, int(mode, 8))
    assert flatten_tree(open_repository(str(wt / ".git")), tree) == expected
    assert flatten_tree(open_repository(str(wt / ".git")), None) == {}


# ---------------------------------------------------------------------------
# revert


def test_revert_two_agents(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    for name in ("a.txt", "b.txt", "c.txt", "d.txt", "e.sh"):
        (wt / name).write_text(f"{name} v1\n")
    t0 = capture(wt)
    # Agent 1's turn.
    (wt / "a.txt").write_text("a.txt by agent 1\n")
    (wt / "c.txt").write_text("c.txt by agent 1\n")
    (wt / "d.txt").unlink()
    (wt / "e.sh").chmod(0o755)
    (wt / "new").mkdir()
    (wt / "new" / "n.txt").write_text("created by agent 1\n")
    t1 = capture(wt)
    # Agent 2, meanwhile: a disjoint file and an overlapping one.
    (wt / "b.txt").write_text("b.txt by agent 2\n")
    (wt / "a.txt").write_text("a.txt by agent 2, on top of agent 1\n")
    (wt / "c.txt").write_text("c.txt v1\n")  # already back to its start

    repo = open_repository(str(wt / ".git"))
    current = capture(wt)
    plan = plan_revert(repo, current, t0, t1, None, False, str(wt))
    assert plan.conflicts == [{"path": "a.txt", "reason": restore.REASON_CHANGED}]
    assert written(plan) == ["d.txt", "e.sh"] and plan.deletes == ["new/n.txt"]
    assert plan.chmod_only == {"e.sh"}
    apply_plan(repo, str(wt), plan, str(tmp_path / "journal"))
    assert (wt / "a.txt").read_text() == "a.txt by agent 2, on top of agent 1\n"
    assert (wt / "b.txt").read_text() == "b.txt by agent 2\n"
    assert (wt / "c.txt").read_text() == "c.txt v1\n"
    assert (wt / "d.txt").read_text() == "d.txt v1\n"
    assert not os.access(wt / "e.sh", os.X_OK)
    assert not (wt / "new").exists()

    forced = plan_revert(repo, capture(wt), t0, t1, None, True, str(wt))
    assert written(forced) == ["a.txt"] and forced.conflicts == []
    apply_plan(repo, str(wt), forced, str(tmp_path / "journal"))
    assert (wt / "a.txt").read_text() == "a.txt v1\n"
    assert (wt / "b.txt").read_text() == "b.txt by agent 2\n"


def test_revert_with_paths_and_deleted_since(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "x").mkdir()
    (wt / "x" / "1.txt").write_text("1\n")
    (wt / "y.txt").write_text("y\n")
    t0 = capture(wt)
    (wt / "x" / "1.txt").write_text("1 changed\n")
    (wt / "y.txt").write_text("y changed\n")
    t1 = capture(wt)
    (wt / "y.txt").unlink()  # deleted since the turn: a conflict, not a resurrection
    repo = open_repository(str(wt / ".git"))
    plan = plan_revert(repo, capture(wt), t0, t1, ["x"], False, str(wt))
    assert written(plan) == ["x/1.txt"] and plan.conflicts == []
    plan = plan_revert(repo, capture(wt), t0, t1, None, False, str(wt))
    assert plan.conflicts == [{"path": "y.txt", "reason": restore.REASON_CHANGED}]
    plan = plan_revert(repo, capture(wt), t0, t1, None, True, str(wt))
    assert written(plan) == ["x/1.txt", "y.txt"]
    apply_plan(repo, str(wt), plan, str(tmp_path / "journal"))
    assert capture(wt) == t0


def test_revert_never_overwrites_ignored_files_even_forced(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / ".gitignore").write_text("")
    t0 = capture(wt)
    (wt / "gen.txt").write_text("turn output\n")
    t1 = capture(wt)
    # Revert a turn that removed gen.txt (t1 to t0): it would bring gen.txt
    # back, but gen.txt is now ignored user data.
    t_from, t_to = t1, t0
    (wt / ".gitignore").write_text("gen.txt\n")
    (wt / "gen.txt").write_text("now ignored, user data\n")
    repo = open_repository(str(wt / ".git"))
    plan = plan_revert(repo, capture(wt), t_from, t_to, ["gen.txt"], True, str(wt))
    assert plan.conflicts == [{"path": "gen.txt", "reason": restore.REASON_IN_THE_WAY}]
    apply_plan(repo, str(wt), plan, str(tmp_path / "journal"))
    assert (wt / "gen.txt").read_text() == "now ignored, user data\n"


# ---------------------------------------------------------------------------
# crashes and failures


def test_recover_removes_leftovers_from_a_journal(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    (wt / "src").mkdir()
    (wt / "src" / "a.py").write_text("target stays\n")
    (wt / "src" / f"{TEMP_PREFIX}aaaa").write_text("half writ")
    (wt / f"{TEMP_PREFIX}bbbb").symlink_to("somewhere")
    (wt / f"{TEMP_PREFIX}unlisted").write_text("not in any journal\n")
    journal = tmp_path / "journal"
    journal.mkdir()
    record = {
        "version": 1,
        "workdir": str(wt),
        "entries": [
            {"target": "src/a.py", "temp": f"src/{TEMP_PREFIX}aaaa"},
            {"target": "link", "temp": f"{TEMP_PREFIX}bbbb"},
            {"target": "never", "temp": f"missing/{TEMP_PREFIX}cccc"},
            {"target": "x", "temp": "src/a.py"},  # not a temporary name: never removed
            {"target": "y", "temp": f"../{TEMP_PREFIX}dddd"},
        ],
    }
    (journal / "apply-1.journal").write_text(json.dumps(record))
    (tmp_path / "other").mkdir()  # another worktree, there: its journal is left alone (one whose folder is gone moved)
    (journal / "apply-2.journal").write_text(
        json.dumps({**record, "workdir": str(tmp_path / "other")})
    )
    (journal / ".journal-tmp-zz").write_text("{")
    (tmp_path / f"{TEMP_PREFIX}dddd").write_text("outside the worktree\n")

    cleaned = recover(str(journal), str(wt))
    assert cleaned == [TEMP_PREFIX + "bbbb", f"src/{TEMP_PREFIX}aaaa"]
    assert temps_left(wt) == [f"{TEMP_PREFIX}unlisted"]
    assert (wt / "src" / "a.py").read_text() == "target stays\n"
    assert (tmp_path / f"{TEMP_PREFIX}dddd").exists()
    assert sorted(os.listdir(journal)) == ["apply-2.journal"]
    assert recover(str(journal), str(wt)) == []
    assert recover(str(tmp_path / "no-journal-here"), str(wt)) == []


_CHILD = r"""
import json, os, sys, time
from snapshotd.git.repository import open_repository
from snapshotd.restore import fileops, plan as restore, prepared

with open(sys.argv[1]) as handle:
    args = json.load(handle)
stop = args["stop_prefix"].encode()
real = fileops.write_all

def slow(fd, data):
    if bytes(data[: len(stop)]) == stop:
        os.write(fd, bytes(data)[: len(data) // 2])
        os.fsync(fd)
        open(args["marker"], "w").close()
        time.sleep(120)
    real(fd, data)

fileops.write_all = slow
repo = open_repository(os.path.join(args["workdir"], ".git"))
plan = restore.plan_restore(repo, args["current"], args["target"], None, args["workdir"])
prepared.apply_plan(repo, args["workdir"], plan, args["journal"])
"""


def test_kill_during_apply_then_recover(tmp_path: Path) -> None:
    wt = new_repo(tmp_path)
    big = b"".join(b"line %d of the big file\n" % i for i in range(20000))
    files = {f"f{i}.txt": f"file {i} at A\n".encode() for i in range(6)}
    files["m/big.txt"] = big
    for rel, data in files.items():
        (wt / rel).parent.mkdir(exist_ok=True)
        (wt / rel).write_bytes(data)
    tree_a = capture(wt)
    edited = {rel: b"edited " + data for rel, data in files.items()}
    for rel, data in edited.items():
        (wt / rel).write_bytes(data)
    current = capture(wt)
    journal = tmp_path / "journal"
    marker = tmp_path / "marker"
    args = {
        "workdir": str(wt),
        "current": current,
        "target": tree_a,
        "journal": str(journal),
        "marker": str(marker),
        "stop_prefix": "line 0 of the big file",
    }
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps(args))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(args_file)], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, "the child ended before it was stopped"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL

    leftovers = temps_left(wt)
    # Every copy is written before the first rename: the six small files' and the big file's, half written.
    assert sorted(os.path.dirname(p) for p in leftovers) == [""] * 6 + ["m"]
    assert not any((wt / p).is_dir() for p in leftovers)
    assert len(list(journal.glob("*.journal"))) == 1
    for rel in files:
        assert (wt / rel).read_bytes() == edited[rel]  # nothing replaced yet, nothing torn

    assert recover(str(journal), str(wt)) == leftovers
    assert temps_left(wt) == []
    assert list(journal.glob("*.journal")) == []
    do_restore(wt, tree_a)
    assert capture(wt) == tree_a
    assert snapshot(wt) == {rel: ("file", data, False) for rel, data in files.items()}


def test_filesystem_error_midway_leaves_no_temp_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wt = new_repo(tmp_path)
    for i in range(4):
        (wt / f"f{i}.txt").write_text(f"{i} at A\n")
    tree_a = capture(wt)
    for i in range(4):
        (wt / f"f{i}.txt").write_text(f"{i} edited\n")
    repo = open_repository(str(wt / ".git"))
    plan = plan_restore(repo, capture(wt), tree_a, None, str(wt))
    real = fileops.write_all
    calls = {"n": 0}

    def failing(fd: int, data: bytes) -> None:
        if data.endswith(b" at A\n"):
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError(28, os.strerror(28))
        real(fd, data)

    monkeypatch.setattr(fileops, "write_all", failing)
    inodes = [(wt / f"f{i}.txt").stat().st_ino for i in range(4)]
    with pytest.raises(FilesystemError) as info:
        apply_plan(repo, str(wt), plan, str(tmp_path / "journal"))
    assert info.value.data["path"] == "f2.txt" and info.value.data["errno"] == "ENOSPC"
    assert "f2.txt" in info.value.message and "disk is full" in info.value.message
    assert "Nothing was changed" in info.value.message
    assert temps_left(wt) == []
    assert list((tmp_path / "journal").glob("*")) == []
    # The two files already written were put back: the same files, not copies.
    contents = [(wt / f"f{i}.txt").read_text() for i in range(4)]
    assert contents == [f"{i} edited\n" for i in range(4)]
    assert [(wt / f"f{i}.txt").stat().st_ino for i in range(4)] == inodes


# ---------------------------------------------------------------------------
# property: any two states round-trip through restore


_UNIVERSE = ["a", "b", "d", "d/a", "d/b", "d/e", "d/e/f", "e", "e/x y", "ü"]
_LEAF = st.one_of(
    st.tuples(st.just("file"), st.binary(max_size=12), st.booleans()),
    st.tuples(st.just("link"), st.sampled_from(["a", "d", "../outside", "/nowhere", "d/e/f"])),
)
_STATE = st.dictionaries(st.sampled_from(_UNIVERSE), _LEAF, max_size=8)
_IGNORED = st.sets(st.sampled_from(["z.log", "d/z.log", "d/e/z.log", "q/z.log"]), max_size=3)


def _consistent(state: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    """Drop paths that would need a leaf to also be a folder."""
    kept: dict[str, tuple[Any, ...]] = {}
    for path in sorted(state, key=lambda p: (p.count("/"), p)):
        parts = path.split("/")
        if any("/".join(parts[:i]) in kept for i in range(1, len(parts))):
            continue
        if any(other.startswith(path + "/") for other in kept):
            continue
        kept[path] = state[path]
    return kept


def _materialize(wt: Path, state: dict[str, tuple[Any, ...]], ignored: set[str]) -> None:
    for name in os.listdir(wt):
        if name != ".git":
            full = wt / name
            if full.is_dir() and not full.is_symlink():
                shutil.rmtree(full)
            else:
                full.unlink()
    (wt / ".gitignore").write_text("*.log\n")
    for path, leaf in state.items():
        full = wt / path
        full.parent.mkdir(parents=True, exist_ok=True)
        if leaf[0] == "file":
            full.write_bytes(leaf[1])
            full.chmod(0o755 if leaf[2] else 0o644)
        else:
            full.symlink_to(leaf[1])
    for path in ignored:
        # Placed only where real folders (or nothing) lead to it: the test must
        # not write through its own symlinks either.
        parts = path.split("/")
        ancestors = [wt.joinpath(*parts[:i]) for i in range(1, len(parts))]
        if any(a.is_symlink() or (a.exists() and not a.is_dir()) for a in ancestors):
            continue
        if (wt / path).exists() or (wt / path).is_symlink():
            continue
        (wt / path).parent.mkdir(parents=True, exist_ok=True)
        (wt / path).write_bytes(b"ignored " + path.encode())


def _expected(state: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    return {p: (("file", v[1], v[2]) if v[0] == "file" else v) for p, v in state.items()}


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_STATE, _STATE, _IGNORED)
def test_any_two_states_round_trip(
    tmp_path_factory: pytest.TempPathFactory,
    first: dict[str, tuple[Any, ...]],
    second: dict[str, tuple[Any, ...]],
    ignored: set[str],
) -> None:
    base = tmp_path_factory.mktemp("prop")
    wt = new_repo(base)
    (base / "outside").mkdir()
    (base / "outside" / "keep").write_text("outside\n")
    first, second = _consistent(first), _consistent(second)
    _materialize(wt, first, set())
    tree_a = capture(wt)
    _materialize(wt, second, ignored)
    present_ignored = {p: v for p, v in snapshot(wt).items() if p.endswith(".log")}
    _, done = do_restore(wt, tree_a)
    after = snapshot(wt)
    # Ignored files always survive, byte for byte.
    assert {p: v for p, v in after.items() if p.endswith(".log")} == present_ignored
    assert snapshot(base / "outside") == {"keep": ("file", b"outside\n", False)}
    if not done.conflicts:
        assert capture(wt) == tree_a
        visible = {p: v for p, v in after.items() if not p.endswith(".log") and p != ".gitignore"}
        assert visible == _expected(first)
    else:
        # A conflict only ever comes from an ignored file holding the spot.
        for conflict in done.conflicts:
            path = conflict["path"]
            assert any(
                p == path
                or p.startswith(path + "/")
                or path.startswith(p + "/")
                or path.startswith(p.rsplit("/", 1)[0] + "/")
                for p in present_ignored
            ), (conflict, present_ignored)


# ---------------------------------------------------------------------------
# the second look before each rename: by stat behind a fence, else by content


def _reads_counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names the applier reads from disk to hash, from now on."""
    from snapshotd.restore import recorded as recorded_mod

    names: list[str] = []
    real = recorded_mod.read_at

    def counting(dir_fd: int, name: str) -> bytes | None:
        names.append(name)
        return real(dir_fd, name)

    monkeypatch.setattr(recorded_mod, "read_at", counting)
    return names


def _prepared_restore(tmp_path: Path) -> tuple[Path, Any, str, Plan]:
    wt = new_repo(tmp_path)
    for name in ("a.txt", "b.txt"):
        (wt / name).write_text(f"{name} at A\n")
    tree_a = capture(wt)
    for name in ("a.txt", "b.txt"):
        (wt / name).write_text(f"{name} edited\n")
    repo = open_repository(str(wt / ".git"))
    plan = plan_restore(repo, capture(wt), tree_a, None, str(wt))
    assert written(plan) == ["a.txt", "b.txt"]
    return wt, repo, str(tmp_path / "journal"), plan


def test_a_file_older_than_the_fence_is_not_read_again_while_its_stat_is_the_same(tmp_path, monkeypatch):
    from snapshotd.capture.state import make_fence
    from snapshotd.restore.prepared import prepared_plan

    wt, repo, journal, plan = _prepared_restore(tmp_path)
    time.sleep(0.05)  # past the file system's clock tick: the edits are older than the fence
    (tmp_path / "fence").mkdir()
    reads = _reads_counted(monkeypatch)
    with prepared_plan(repo, str(wt), plan, journal) as prepared:
        assert prepared.stale(make_fence(str(tmp_path / "fence"))) == []
        assert sorted(reads) == ["a.txt", "b.txt"]
        (wt / "b.txt").write_text("b.txt edited again\n")  # after the look: another stat
        done = prepared.apply()
    assert sorted(reads) == ["a.txt", "b.txt", "b.txt"]  # a.txt trusted by its stat, b.txt read and found changed
    assert done.written == ["a.txt"] and (wt / "a.txt").read_text() == "a.txt at A\n"
    assert done.conflicts == [{"path": "b.txt", "reason": restore.REASON_CHANGED_ON_DISK}]
    assert (wt / "b.txt").read_text() == "b.txt edited again\n"


def test_a_file_as_new_as_the_fence_is_read_again_before_it_is_replaced(tmp_path, monkeypatch):
    from snapshotd.restore.prepared import prepared_plan

    wt, repo, journal, plan = _prepared_restore(tmp_path)
    fence = min(max(os.lstat(wt / name).st_mtime_ns, os.lstat(wt / name).st_ctime_ns) for name in ("a.txt", "b.txt"))
    reads = _reads_counted(monkeypatch)
    with prepared_plan(repo, str(wt), plan, journal) as prepared:
        # a fence no later than the edits (written in its clock tick): a same-tick write could keep their stat
        assert prepared.stale(fence) == []
        done = prepared.apply()
    assert sorted(reads) == ["a.txt", "a.txt", "b.txt", "b.txt"]
    assert done.written == ["a.txt", "b.txt"]
