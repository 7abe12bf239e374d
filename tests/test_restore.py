"""Restore through the engine: round trips checked byte for byte and against git.

Every test goes through ``Engine.call`` as a client would. The worktree is
compared with a listing taken at checkpoint time (content, exec bit, link
target, empty folders), and the tree a fresh capture gives is compared with
git's own answer (``oracle_tree``). Files outside the worktree that a symlink
points at must come out of every restore byte-identical.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from oracle import oracle_tree
from repo_helpers import commit_all, git, git_run, user_state, worktree_listing
from restore_helpers import temps_left

from snapshotd.engine.core import Engine
from snapshotd.errors import (
    GitError,
    InvalidParams,
    NotFound,
    PathOutsideWorktree,
    WorktreeMismatch,
)
from snapshotd.restore.fileops import TEMP_PREFIX

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------
# helpers


def tree_state(root: Path) -> dict[str, tuple[Any, ...]]:
    """Everything under ``root`` but its top ``.git``, never following a symlink.

    Files give ``("file", bytes, executable)``, symlinks ``("link", target)``
    and empty folders ``("dir",)`` (a folder with content shows through it).
    """
    found: dict[str, tuple[Any, ...]] = {}
    for folder, dirs, files in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        if rel_folder == ".":
            dirs[:] = [d for d in dirs if d != ".git"]
            files = [f for f in files if f != ".git"]  # a linked worktree's .git file
        elif not dirs and not files:
            found[rel_folder] = ("dir",)
        for name in dirs + files:
            full = os.path.join(folder, name)
            rel = os.path.normpath(os.path.join(rel_folder, name))
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as handle:
                    found[rel] = ("file", handle.read(), bool(st.st_mode & 0o100))
    return found





def split(state: dict[str, tuple[Any, ...]], ignored: Callable[[str], bool]) -> tuple[dict, dict]:
    visible = {p: v for p, v in state.items() if not ignored(p)}
    hidden = {p: v for p, v in state.items() if ignored(p)}
    return visible, hidden


async def checkpoint(engine: Engine, path: Path, **params: Any) -> dict[str, Any]:
    return (await engine.call("checkpoint", {"path": str(path), **params}))["checkpoint"]


async def restore(engine: Engine, path: Path, checkpoint_id: str, **params: Any) -> dict[str, Any]:
    return await engine.call("restore", {"checkpoint": checkpoint_id, "path": str(path), **params})


async def list_ids(engine: Engine, path: Path) -> list[str]:
    listed = (await engine.call("list", {"path": str(path)}))["checkpoints"]
    return [c["id"] for c in listed]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Real files outside every worktree; symlinks in the tests point here."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "victim.txt").write_bytes(b"precious outside data\n")
    (out / "x.txt").write_bytes(b"outside x\n")
    (out / "a.txt").write_bytes(b"outside a, same name as a worktree file\n")
    (out / "sub").mkdir()
    (out / "sub" / "deep.txt").write_bytes(b"outside deep\n")
    return out


OUTSIDE_STATE = {
    "victim.txt": ("file", b"precious outside data\n", False),
    "x.txt": ("file", b"outside x\n", False),
    "a.txt": ("file", b"outside a, same name as a worktree file\n", False),
    "sub/deep.txt": ("file", b"outside deep\n", False),
}


# ---------------------------------------------------------------------------
# the full round trip


IGNORE_RULES = "*.log\n/build/\n/ignored-new/\n/cache.tmp\n"
ODD = os.fsdecode(b"caf\xe9 latin-1.txt")


def ignored(path: str) -> bool:
    return (
        path.endswith(".log")
        or path.startswith(("build/", "ignored-new/"))
        or path in ("build", "ignored-new", "cache.tmp")
    )


def build_state_a(wt: Path, out: Path, *, latin1: bool = True) -> None:
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
    if latin1:
        (wt / ODD).write_text("latin-1 name\n")
    (wt / "app.log").write_text("ignored at A\n")
    (wt / "old.log").write_text("ignored, deleted later\n")
    (wt / "build").mkdir()
    (wt / "build" / "out.o").write_bytes(b"\x7fELF ignored")
    (wt / "cache.tmp").write_text("ignored cache\n")


def commit_part(wt: Path) -> None:
    """Commit some of state A so tracked and untracked files both take part."""
    git(wt, "add", ".gitignore", "plain.txt", "keep.txt", "deep", "exec.sh", "dir2file", "bin.dat")
    git(wt, "add", "tolink.txt", "link-to-file", "file2dir", "ünï", "name with spaces.txt")
    git(wt, "commit", "-q", "-m", "part of A")


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
    if (wt / ODD).exists():
        (wt / ODD).write_text("latin-1 name, edited\n")
    (wt / "created.txt").write_text("created after A\n")
    (wt / "newdir" / "a").mkdir(parents=True)
    (wt / "newdir" / "a" / "b.txt").write_text("new tree\n")
    (wt / "newdir2").mkdir()
    (wt / "newdir2" / "file.txt").write_text("captured\n")
    (wt / "newdir2" / "x.log").write_text("ignored in a new folder\n")
    # Ignored content: edited, created, deleted, and a new ignored folder.
    (wt / "app.log").write_text("ignored, edited after A\n")
    (wt / "old.log").unlink()
    (wt / "debug.log").write_text("new ignored\n")
    (wt / "build" / "new.o").write_bytes(b"new ignored object")
    (wt / "ignored-new" / "x").mkdir(parents=True)
    (wt / "ignored-new" / "x" / "y.txt").write_text("in a new ignored folder\n")


async def round_trip(engine: Engine, wt: Path, out: Path) -> None:
    cp_a = await checkpoint(engine, wt, session="agent", label="A")
    assert cp_a["tree"] == oracle_tree(wt)
    state_a = tree_state(wt)
    ids_before = await list_ids(engine, wt)

    mutate_everything(wt, out)
    state_b = tree_state(wt)
    tree_b = oracle_tree(wt)

    result = await restore(engine, wt, cp_a["id"])
    assert "skipped" not in result, result["skipped"]
    safety = result["safety_checkpoint"]
    assert safety is not None and safety["tree"] == tree_b
    assert safety["label"] == f"before restore {cp_a['id'][:12]}"
    assert not any(ignored(p) for p in result["written"] + result["deleted"])
    assert "keep.txt" not in result["written"]
    assert {"plain.txt", "dir2file/a.txt", "file2dir", "tolink.txt", "bin.dat"} <= set(
        result["written"]
    )
    assert (ODD in result["written"]) == (ODD in state_a)
    assert {"created.txt", "newdir/a/b.txt", "file2dir/inner/c.txt", "dir2file"} <= set(
        result["deleted"]
    )

    visible_a, _ = split(state_a, ignored)
    _, hidden_b = split(state_b, ignored)
    assert tree_state(wt) == {**visible_a, **hidden_b}
    assert oracle_tree(wt) == cp_a["tree"]
    assert tree_state(out) == OUTSIDE_STATE
    again = await checkpoint(engine, wt, session="agent")
    assert again["tree"] == cp_a["tree"]

    # The old checkpoints are all still there, and the restore can be undone.
    assert set(ids_before) <= set(await list_ids(engine, wt))
    back = await restore(engine, wt, safety["id"])
    assert "skipped" not in back
    assert tree_state(wt) == state_b
    assert oracle_tree(wt) == tree_b
    assert (await checkpoint(engine, wt, session="agent"))["tree"] == tree_b
    assert tree_state(out) == OUTSIDE_STATE
    assert temps_left(wt) == []


@pytest.mark.parametrize("kind", ["git", "plain"])
async def test_round_trip_every_kind_of_change(engine, tmp_path, outside, kind):
    wt = tmp_path / "wt"
    wt.mkdir()
    build_state_a(wt, outside)
    if kind == "git":
        git(wt, "init", "-q")
        commit_part(wt)
    await round_trip(engine, wt, outside)
    if kind == "git":
        assert git(wt, "log", "--format=%s") == "part of A"


@pytest.mark.parametrize("kind", ["git", "plain"])
@pytest.mark.needs("inotify")
async def test_round_trip_with_warm_captures(watched_engine, tmp_path, outside, kind):
    wt = tmp_path / "wt"
    wt.mkdir()
    # No name that is not UTF-8 here: watchfiles cannot report one, and the watch would stop.
    build_state_a(wt, outside, latin1=False)
    if kind == "git":
        git(wt, "init", "-q")
        commit_part(wt)
    await checkpoint(watched_engine, wt, session="warm-up")  # the watcher starts here
    await round_trip(watched_engine, wt, outside)
    assert watched_engine.counters["captures.watch"] >= 3


async def test_restore_forth_and_back_between_checkpoints(engine, tmp_path):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    states = []
    for index in range(4):
        (wt / f"f{index}.txt").write_text(f"added at step {index}\n")
        (wt / "shared.txt").write_text(f"shared at step {index}\n")
        if index == 2:
            (wt / "f0.txt").unlink()
        states.append((await checkpoint(engine, wt), tree_state(wt)))
    for index in (0, 3, 1, 2, 0):
        cp, expected = states[index]
        await restore(engine, wt, cp["id"])
        assert tree_state(wt) == expected
        assert oracle_tree(wt) == cp["tree"]


# ---------------------------------------------------------------------------
# CRLF and attributes


CRLF_FILES = {
    "a.txt": b"one\r\ntwo\r\n",
    "dir/b.txt": b"b line\r\nno final newline",
    "bin.dat": b"\x00binary\r\n\x00",
}


@pytest.mark.parametrize("setup", ["autocrlf", "attributes", "global autocrlf"])
async def test_crlf_files_come_back_byte_identical(engine, tmp_path, setup, monkeypatch):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    if setup == "autocrlf":
        git(wt, "config", "core.autocrlf", "true")
    elif setup == "global autocrlf":  # where libgit2's own search does not look
        (tmp_path / "global").write_text("[core]\n\tautocrlf = true\n")
        monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "global"))
    else:
        (wt / ".gitattributes").write_text("* text eol=crlf\n*.dat binary\n")
    for rel, data in CRLF_FILES.items():
        (wt / rel).parent.mkdir(parents=True, exist_ok=True)
        (wt / rel).write_bytes(data)
    commit_all(wt, "crlf")
    (wt / "untracked.txt").write_bytes(b"untracked\r\ncrlf\r\n")
    # What git itself writes for these files on checkout.
    git(wt, "rm", "-q", "--cached", "-r", ".")
    git(wt, "reset", "-q", "--hard")
    (wt / "untracked.txt").write_bytes(b"untracked\r\ncrlf\r\n")
    state_a = tree_state(wt)
    for rel, data in CRLF_FILES.items():
        assert state_a[rel][1] == data
    cp_a = await checkpoint(engine, wt)
    assert cp_a["tree"] == oracle_tree(wt)
    # Blobs are stored normalized (LF), as git stores them.
    assert b"\r" not in git_run(wt, "cat-file", "blob", f"{cp_a['id']}:a.txt").stdout

    (wt / "a.txt").write_bytes(b"one\r\nchanged\r\n")
    (wt / "dir" / "b.txt").unlink()
    (wt / "untracked.txt").write_bytes(b"edited\r\n")
    (wt / "bin.dat").write_bytes(b"\x00other")
    result = await restore(engine, wt, cp_a["id"])
    assert sorted(result["written"]) == ["a.txt", "bin.dat", "dir/b.txt", "untracked.txt"]
    assert tree_state(wt) == state_a
    assert oracle_tree(wt) == cp_a["tree"]
    assert git(wt, "status", "--porcelain") == "?? untracked.txt"

    # git checkout of the checkpoint into a fresh worktree writes the same bytes.
    other = tmp_path / "other"
    git(wt, "worktree", "add", "-q", "--detach", str(other), cp_a["id"])
    for rel in [*CRLF_FILES, "untracked.txt"]:
        assert (other / rel).read_bytes() == (wt / rel).read_bytes(), rel


async def test_attributes_changed_by_the_restore_apply_to_its_files(engine, tmp_path):
    """The restored ``.gitattributes`` decides the line endings, as with git checkout."""
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / ".gitattributes").write_text("*.txt text eol=crlf\n")
    (wt / "a.txt").write_bytes(b"crlf\r\nfile\r\n")
    (wt / "sub").mkdir()
    (wt / "sub" / ".gitattributes").write_text("*.md text eol=crlf\n")
    (wt / "sub" / "c.md").write_bytes(b"md\r\n")
    state_a = tree_state(wt)
    cp_a = await checkpoint(engine, wt)
    (wt / ".gitattributes").unlink()
    shutil.rmtree(wt / "sub")
    (wt / "a.txt").write_bytes(b"lf\nnow\n")
    await restore(engine, wt, cp_a["id"])
    assert tree_state(wt) == state_a



async def test_files_under_attributes_the_restore_removes_are_restored_too(engine, tmp_path):
    """A file git cleaned under a ``.gitattributes`` the restore deletes is still seen as unchanged.

    The deletes run in path order, so ``.gitattributes`` goes before the files
    it rules; whether those still hold what the safety checkpoint recorded is
    decided under the attributes they were captured with, not those left on disk.
    """
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "kept").mkdir()
    (wt / "kept" / "a.txt").write_bytes(b"raw\r\n")
    state_a = tree_state(wt)
    cp_a = await checkpoint(engine, wt)
    for folder in ("added", "kept"):
        (wt / folder).mkdir(exist_ok=True)
        (wt / folder / ".gitattributes").write_text("* text eol=crlf\n")
    (wt / "added" / "all-crlf").write_bytes(b"one\r\ntwo\r\n")
    (wt / "kept" / "a.txt").write_bytes(b"edited\r\n")
    cp_b = await checkpoint(engine, wt)
    assert cp_b["tree"] == oracle_tree(wt)
    result = await restore(engine, wt, cp_a["id"])
    assert "skipped" not in result
    assert result["deleted"] == ["added/.gitattributes", "added/all-crlf", "kept/.gitattributes"]
    assert result["written"] == ["kept/a.txt"]
    assert tree_state(wt) == state_a


async def test_smudge_filters_run_and_a_failing_one_changes_nothing(engine, tmp_path):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    git(wt, "config", "filter.upper.clean", "tr A-Z a-z")
    git(wt, "config", "filter.upper.smudge", "tr a-z A-Z")
    git(wt, "config", "filter.upper.required", "true")
    (wt / ".gitattributes").write_text("*.up filter=upper\n*.boom filter=boom\n")
    (wt / "a.up").write_text("SHOUTED ON DISK\n")
    (wt / "b.txt").write_text("b\n")
    cp_a = await checkpoint(engine, wt)
    assert git(wt, "cat-file", "blob", f"{cp_a['id']}:a.up") == "shouted on disk"
    (wt / "a.up").write_text("CHANGED\n")
    await restore(engine, wt, cp_a["id"])
    assert (wt / "a.up").read_text() == "SHOUTED ON DISK\n"

    # A required filter that fails: an error, and nothing changed, not even a checkpoint added.
    git(wt, "config", "filter.boom.clean", "cat")
    git(wt, "config", "filter.boom.smudge", "false")
    git(wt, "config", "filter.boom.required", "true")
    (wt / "c.boom").write_text("boom\n")
    cp_b = await checkpoint(engine, wt)
    (wt / "c.boom").write_text("edited\n")
    (wt / "b.txt").write_text("edited\n")
    (wt / "new.txt").write_text("new\n")
    ids = await list_ids(engine, wt)
    before = worktree_listing(wt)
    with pytest.raises(GitError):
        await restore(engine, wt, cp_b["id"])
    assert worktree_listing(wt) == before
    assert await list_ids(engine, wt) == ids
    journal_dir = wt / ".git" / "snapshotd" / "journal"
    assert list(journal_dir.iterdir()) == []


# ---------------------------------------------------------------------------
# symlinks never lead a restore out of the worktree


async def test_folder_replaced_by_a_symlink_pointing_outside(engine, tmp_path, outside):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "d" / "sub").mkdir(parents=True)
    (wt / "d" / "a.txt").write_text("worktree a\n")
    (wt / "d" / "sub" / "deep.txt").write_text("worktree deep\n")
    (wt / "d" / "victim.txt").write_text("worktree victim\n")
    commit_all(wt)
    state_a = tree_state(wt)
    cp_a = await checkpoint(engine, wt)

    shutil.rmtree(wt / "d")
    (wt / "d").symlink_to(outside)  # same names inside: a follower would overwrite them
    state_b = tree_state(wt)
    cp_b = await checkpoint(engine, wt)
    result = await restore(engine, wt, cp_a["id"])
    assert "skipped" not in result
    assert tree_state(outside) == OUTSIDE_STATE
    assert tree_state(wt) == state_a
    assert oracle_tree(wt) == cp_a["tree"]

    # And back: the folder's files are removed, never through the link.
    back = await restore(engine, wt, cp_b["id"])
    assert "skipped" not in back
    assert tree_state(wt) == state_b
    assert tree_state(outside) == OUTSIDE_STATE


async def test_symlink_in_the_checkpoint_where_a_real_folder_now_is(engine, tmp_path, outside):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "keep.txt").write_text("keep\n")
    (wt / "l").symlink_to(outside)
    (wt / "rel").symlink_to("../outside/sub")
    state_a = tree_state(wt)
    cp_a = await checkpoint(engine, wt)

    for name in ("l", "rel"):
        (wt / name).unlink()
        (wt / name / "sub").mkdir(parents=True)
        (wt / name / "a.txt").write_text("inside the worktree\n")
        (wt / name / "sub" / "deep.txt").write_text("inside, deep\n")
        (wt / name / "victim.txt").write_text("inside victim\n")
    state_b = tree_state(wt)
    cp_b = await checkpoint(engine, wt)
    result = await restore(engine, wt, cp_a["id"])
    assert "skipped" not in result
    assert tree_state(wt) == state_a
    assert tree_state(outside) == OUTSIDE_STATE

    back = await restore(engine, wt, cp_b["id"])
    assert "skipped" not in back
    assert tree_state(wt) == state_b
    assert tree_state(outside) == OUTSIDE_STATE

    # An ignored file in the real folder keeps the spot: the link is not restored.
    (wt / ".gitignore").write_text("*.log\n")
    (wt / "l" / "notes.log").write_text("ignored, the user's\n")
    skipped = await restore(engine, wt, cp_a["id"], paths=["l"])
    assert [c["path"] for c in skipped["skipped"]] == ["l"]
    assert (wt / "l" / "notes.log").read_text() == "ignored, the user's\n"
    assert tree_state(outside) == OUTSIDE_STATE


async def test_hard_links_to_files_outside_are_replaced_never_written_through(
    engine, tmp_path, outside
):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "mode.txt").write_bytes(b"outside x\n")
    (wt / "mode.txt").chmod(0o755)
    (wt / "content.txt").write_text("worktree content\n")
    cp_a = await checkpoint(engine, wt)
    for name, target in (("mode.txt", "x.txt"), ("content.txt", "victim.txt")):
        (wt / name).unlink()
        os.link(outside / target, wt / name)  # same bytes as mode.txt at A, mode 644
    modes = {p.name: p.stat().st_mode for p in outside.iterdir()}
    result = await restore(engine, wt, cp_a["id"])
    assert sorted(result["written"]) == ["content.txt", "mode.txt"]
    assert tree_state(outside) == OUTSIDE_STATE
    assert {p.name: p.stat().st_mode for p in outside.iterdir()} == modes
    assert tree_state(wt) == {
        "mode.txt": ("file", b"outside x\n", True),
        "content.txt": ("file", b"worktree content\n", False),
    }


# ---------------------------------------------------------------------------
# ignored files, the size cap, and the user's own git state


async def test_older_gitignore_never_exposes_ignored_files(engine, tmp_path):
    """Cline #14367: restoring .gitignore first and cleaning then deleted ignored files."""
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / ".gitignore").write_text("*.log\n")
    (wt / "app.py").write_text("print(1)\n")
    (wt / "was-visible.env").write_text("captured at A\n")
    cp_a = await checkpoint(engine, wt)

    (wt / ".gitignore").write_text("*.log\n*.env\nsecrets/\n")
    (wt / "app.py").write_text("print(2)\n")
    (wt / "secret.env").write_text("API_KEY=not in any checkpoint\n")
    (wt / "was-visible.env").write_text("ignored now, edited since\n")
    (wt / "secrets").mkdir()
    (wt / "secrets" / "key.pem").write_text("-----BEGIN-----\n")
    result = await restore(engine, wt, cp_a["id"])
    assert (wt / ".gitignore").read_text() == "*.log\n"
    assert (wt / "app.py").read_text() == "print(1)\n"
    assert (wt / "secret.env").read_text() == "API_KEY=not in any checkpoint\n"
    assert (wt / "secrets" / "key.pem").read_text() == "-----BEGIN-----\n"
    # Ignored until this restore: left alone and reported, never overwritten.
    assert (wt / "was-visible.env").read_text() == "ignored now, edited since\n"
    assert [c["path"] for c in result["skipped"]] == ["was-visible.env"]
    assert sorted(result["written"]) == [".gitignore", "app.py"]
    assert result["deleted"] == []
    # What the older .gitignore no longer hides is listed, with the reason.
    assert [k["path"] for k in result["kept"]] == ["secret.env", "secrets/"]
    assert all("ignored when the restore began" in k["reason"] for k in result["kept"])
    # Back again (undo): what the restored .gitignore ignores again stays, and is listed; the still-ignored
    # file is not: nothing changed for it.
    (wt / "build.log").write_text("ignored before and after\n")
    back = await restore(engine, wt, result["safety_checkpoint"]["id"])
    assert (wt / ".gitignore").read_text() == "*.log\n*.env\nsecrets/\n"
    assert (wt / "secret.env").read_text() == "API_KEY=not in any checkpoint\n"
    assert (wt / "secrets" / "key.pem").read_text() == "-----BEGIN-----\n"
    assert (wt / "was-visible.env").read_text() == "ignored now, edited since\n"
    assert back["deleted"] == []
    assert [k["path"] for k in back["kept"]] == ["secret.env", "secrets/key.pem", "was-visible.env"]
    assert all("ignored by the restored checkpoint's own rules" in k["reason"] for k in back["kept"])


async def test_the_restored_rules_of_a_files_own_folders_spare_it_and_a_siblings_do_not(engine, tmp_path):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "sub" / "deep").mkdir(parents=True)
    (wt / "other").mkdir()
    (wt / "sub" / ".gitignore").write_text("*.tmp\n")
    (wt / "other" / ".gitignore").write_text("*.keep\n")
    (wt / "sub" / "a.txt").write_text("a\n")
    cp_a = await checkpoint(engine, wt)

    (wt / "sub" / ".gitignore").write_text("# nothing ignored here now\n")
    (wt / "sub" / "x.tmp").write_text("captured now, ignored at A\n")
    (wt / "sub" / "deep" / "z.tmp").write_text("captured now, ignored at A\n")
    (wt / "sub" / "y.keep").write_text("made since A; other/'s rules are not sub/'s\n")
    result = await restore(engine, wt, cp_a["id"])
    assert (wt / "sub" / ".gitignore").read_text() == "*.tmp\n"
    assert result["deleted"] == ["sub/y.keep"] and not (wt / "sub" / "y.keep").exists()
    assert (wt / "sub" / "x.tmp").is_file() and (wt / "sub" / "deep" / "z.tmp").is_file()
    assert [k["path"] for k in result["kept"]] == ["sub/deep/z.tmp", "sub/x.tmp"]
    assert all("ignored by the restored checkpoint's own rules" in k["reason"] for k in result["kept"])


async def test_subfolder_restore_leaves_siblings_and_parent_alone(engine, tmp_path):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    for rel in ("top.txt", "sub/a.txt", "sub/inner/b.txt", "sibling/c.txt", "sub2/d.txt"):
        (wt / rel).parent.mkdir(parents=True, exist_ok=True)
        (wt / rel).write_text(f"{rel} at A\n")
    state_a = tree_state(wt)
    cp_a = await checkpoint(engine, wt)
    for rel in ("top.txt", "sub/a.txt", "sub/inner/b.txt", "sibling/c.txt", "sub2/d.txt"):
        (wt / rel).write_text(f"{rel} edited\n")
    (wt / "sub" / "new.txt").write_text("new in sub\n")
    (wt / "sibling" / "new.txt").write_text("new in sibling\n")
    (wt / "sub-new.txt").write_text("a name starting like the folder\n")
    state_b = tree_state(wt)

    for paths in (["sub"], [str(wt / "sub")], ["sub/"]):
        result = await engine.call(
            "restore", {"checkpoint": cp_a["id"], "path": str(wt / "sub"), "paths": paths}
        )
        expected = {p: v for p, v in state_b.items() if not p.startswith("sub/")}
        expected.update({p: v for p, v in state_a.items() if p.startswith("sub/")})
        assert tree_state(wt) == expected
        if paths == ["sub"]:
            assert sorted(result["written"]) == ["sub/a.txt", "sub/inner/b.txt"]
            assert result["deleted"] == ["sub/new.txt"]
        else:
            assert result["written"] == result["deleted"] == []

    # Opening from a subfolder without ``paths`` means the whole worktree.
    await restore(engine, wt / "sibling", cp_a["id"])
    assert tree_state(wt) == state_a


async def test_head_branches_and_index_never_move(engine, tmp_path):
    """Cline #13550: a restore that moves HEAD orphans the user's commits."""
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "a.txt").write_text("a v1\n")
    (wt / "b.txt").write_text("b v1\n")
    commit_all(wt, "one")
    git(wt, "branch", "side")
    cp_a = await checkpoint(engine, wt)
    state_a = tree_state(wt)

    (wt / "a.txt").write_text("a v2, committed by the user\n")
    (wt / "c.txt").write_text("new and committed\n")
    user_commit = commit_all(wt, "two")
    (wt / "b.txt").write_text("b staged\n")
    git(wt, "add", "b.txt")
    (wt / "b.txt").write_text("b staged then edited\n")
    before = user_state(wt, with_worktree=False)
    time.sleep(0.01)  # so that any rewrite would show in an mtime

    await restore(engine, wt, cp_a["id"])
    assert tree_state(wt) == state_a
    assert user_state(wt, with_worktree=False) == before
    assert git(wt, "rev-parse", "HEAD") == user_commit
    assert git(wt, "show", "HEAD:c.txt") == "new and committed"
    # The user's staged version is still staged.
    assert git(wt, "show", ":b.txt") == "b staged"


async def test_branch_switch_and_detached_head_since_the_checkpoint(engine, tmp_path):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "a.txt").write_text("a on main\n")
    commit_all(wt, "main")
    (wt / "a.txt").write_text("uncommitted on main\n")
    (wt / "wip.txt").write_text("work in progress\n")
    cp_a = await checkpoint(engine, wt)
    state_a = tree_state(wt)
    assert cp_a["base"] == git(wt, "rev-parse", "HEAD")

    git(wt, "stash", "-q", "-u")
    git(wt, "switch", "-q", "-c", "feature")
    (wt / "a.txt").write_text("a on feature\n")
    (wt / "feature.txt").write_text("feature only\n")
    feature = commit_all(wt, "feature")
    git(wt, "checkout", "-q", "--detach", feature)
    before = user_state(wt, with_worktree=False)

    await restore(engine, wt, cp_a["id"])
    assert tree_state(wt) == state_a
    assert user_state(wt, with_worktree=False) == before
    assert git(wt, "rev-parse", "HEAD") == feature
    assert git_run(wt, "symbolic-ref", "-q", "HEAD", check=False).returncode != 0  # still detached
    assert git(wt, "stash", "list").count("\n") == 0 and git(wt, "stash", "list") != ""


async def test_checkpoints_restore_after_git_gc_and_a_new_engine(engine, tmp_path):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "tracked.txt").write_text("tracked\n")
    commit_all(wt)
    (wt / "untracked.bin").write_bytes(os.urandom(3000))
    state_a = tree_state(wt)
    cp_a = await checkpoint(engine, wt)
    (wt / "untracked.bin").unlink()
    (wt / "tracked.txt").write_text("edited\n")
    git(wt, "gc", "-q", "--prune=now")
    fresh = Engine()
    await restore(fresh, wt, cp_a["id"][:12])
    assert tree_state(wt) == state_a


async def test_identical_files_keep_mtime_and_inode(engine, tmp_path):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    for index in range(20):
        (wt / "src" / f"m{index}.py").parent.mkdir(exist_ok=True)
        (wt / "src" / f"m{index}.py").write_text(f"module {index}\n")
    (wt / "link").symlink_to("src")
    cp_a = await checkpoint(engine, wt)
    before = {p: os.lstat(wt / p) for p in ["link", *(f"src/m{i}.py" for i in range(20))]}
    (wt / "src" / "m3.py").write_text("edited\n")
    (wt / "src" / "m5.py").write_text("module 5\n")  # rewritten, same bytes
    time.sleep(0.01)  # so that any rewrite would show in an mtime
    result = await restore(engine, wt, cp_a["id"])
    assert result["written"] == ["src/m3.py"]
    for rel, st in before.items():
        now = os.lstat(wt / rel)
        if rel == "src/m3.py":
            continue
        if rel == "src/m5.py":
            assert now.st_ino == st.st_ino  # its content already matched: not replaced
            continue
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), rel


@pytest.mark.parametrize("kind", ["git", "plain"])
async def test_no_git_identity_anywhere(tmp_path, monkeypatch, kind):
    """Peers fell back to HEAD when commits failed, and the next rewind deleted work."""
    home = tmp_path / "bare-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("AUTHOR", "COMMITTER"):
        for part in ("NAME", "EMAIL", "DATE"):
            monkeypatch.delenv(f"GIT_{name}_{part}", raising=False)
    monkeypatch.delenv("EMAIL", raising=False)
    wt = tmp_path / "wt"
    wt.mkdir()
    (wt / "a.txt").write_text("a\n")
    if kind == "git":
        git(wt, "init", "-q")
        git(wt, "-c", "user.name=Once", "-c", "user.email=once@example.invalid", "add", "a.txt")
        git(wt, "-c", "user.name=Once", "-c", "user.email=once@example.invalid", "commit", "-qm", "one")
        # Nothing configured: git itself refuses to commit without guessing.
        probe = git_run(wt, "-c", "user.useConfigOnly=true", "commit", "--allow-empty", "-qm", "x", check=False)
        assert probe.returncode != 0 and b"identity" in probe.stderr.lower()
    engine = Engine()
    cp_a = await checkpoint(engine, wt)
    assert cp_a["tree"] == oracle_tree(wt)
    (wt / "a.txt").write_text("changed\n")
    (wt / "b.txt").write_text("new\n")
    result = await restore(engine, wt, cp_a["id"])
    assert result["safety_checkpoint"] is not None
    assert tree_state(wt) == {"a.txt": ("file", b"a\n", False)}
    await restore(engine, wt, result["safety_checkpoint"]["id"])
    assert tree_state(wt) == {
        "a.txt": ("file", b"changed\n", False),
        "b.txt": ("file", b"new\n", False),
    }


async def test_untracked_files_over_the_size_cap_are_never_touched(tmp_path):
    engine = Engine(size_cap=1000)
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "tracked-big.bin").write_bytes(b"t" * 5000)
    commit_all(wt)
    (wt / "small.txt").write_text("small\n")
    (wt / "big.bin").write_bytes(b"a" * 5000)
    (wt / "grows.txt").write_text("small at A\n")
    (wt / "gone-big.bin").write_bytes(b"g" * 5000)
    result = await engine.call("checkpoint", {"path": str(wt)})
    cp_a = result["checkpoint"]
    assert sorted(result["stats"]["skipped"]) == ["big.bin", "gone-big.bin"]
    assert cp_a["tree"] == oracle_tree(wt, size_cap=1000)

    (wt / "tracked-big.bin").write_bytes(b"T" * 6000)
    (wt / "big.bin").write_bytes(b"b" * 7000)
    (wt / "grows.txt").write_bytes(b"x" * 3000)
    (wt / "gone-big.bin").unlink()
    (wt / "new-big.bin").write_bytes(b"n" * 4000)
    (wt / "dir").mkdir()
    (wt / "dir" / "huge.bin").write_bytes(b"h" * 4000)
    (wt / "small.txt").write_text("edited\n")
    result = await restore(engine, wt, cp_a["id"])
    assert (wt / "small.txt").read_text() == "small\n"
    assert (wt / "tracked-big.bin").read_bytes() == b"t" * 5000  # tracked: always captured
    assert (wt / "big.bin").read_bytes() == b"b" * 7000
    assert (wt / "new-big.bin").read_bytes() == b"n" * 4000
    assert (wt / "dir" / "huge.bin").read_bytes() == b"h" * 4000
    assert not (wt / "gone-big.bin").exists()
    # Small at A, over the cap now: not in the current capture, so left alone.
    assert (wt / "grows.txt").read_bytes() == b"x" * 3000
    assert [c["path"] for c in result["skipped"]] == ["grows.txt"]


# ---------------------------------------------------------------------------
# previews and refusals change nothing


async def test_dry_run_reports_and_changes_nothing(engine, tmp_path):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "a.txt").write_text("a\n")
    (wt / "gone.txt").write_text("deleted later\n")
    cp_a = await checkpoint(engine, wt)
    (wt / "a.txt").write_text("edited\n")
    (wt / "gone.txt").unlink()
    (wt / "new.txt").write_text("new\n")
    ids = await list_ids(engine, wt)
    before = worktree_listing(wt)
    refs = git(wt, "for-each-ref")

    result = await restore(engine, wt, cp_a["id"], dry_run=True)
    assert result == {"safety_checkpoint": None, "written": ["a.txt", "gone.txt"], "deleted": ["new.txt"], "kept": []}
    assert worktree_listing(wt) == before
    assert await list_ids(engine, wt) == ids
    assert git(wt, "for-each-ref") == refs

    real = await restore(engine, wt, cp_a["id"])
    assert (real["written"], real["deleted"]) == (result["written"], result["deleted"])


async def test_bad_checkpoint_ids_fail_before_anything_is_touched(engine, tmp_path):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "a.txt").write_text("a\n")
    cp_a = await checkpoint(engine, wt)
    (wt / "a.txt").write_text("edited\n")
    before = worktree_listing(wt)
    refs = git(wt, "for-each-ref")
    blob = git(wt, "rev-parse", f"{cp_a['id']}:a.txt")
    for bad in ("0000000", "f" * 40, cp_a["tree"], blob):
        with pytest.raises(NotFound):
            await restore(engine, wt, bad)
    for bad in (cp_a["id"][:6], "abc", "", "not hex!"):  # no reference at all: refused with why
        with pytest.raises(InvalidParams, match=r"too short|not a checkpoint reference|is required"):
            await restore(engine, wt, bad)
    for bad in (None, 12, ["x"]):
        with pytest.raises(InvalidParams):
            await engine.call("restore", {"checkpoint": bad, "path": str(wt)})
    with pytest.raises(InvalidParams):
        await restore(engine, wt, cp_a["id"], paths="a.txt")
    assert worktree_listing(wt) == before
    assert git(wt, "for-each-ref") == refs
    # A deleted checkpoint is gone for restore too.
    await engine.call("delete", {"checkpoints": [cp_a["id"]]})
    with pytest.raises(NotFound):
        await restore(engine, wt, cp_a["id"])
    assert worktree_listing(wt) == before


async def test_paths_outside_the_worktree_are_refused(engine, tmp_path, outside):
    wt = tmp_path / "wt"
    wt.mkdir()
    git(wt, "init", "-q")
    (wt / "a.txt").write_text("a\n")
    (wt / "out").symlink_to(outside)
    cp_a = await checkpoint(engine, wt)
    (wt / "a.txt").write_text("edited\n")
    before = worktree_listing(wt)
    for bad in ("../outside", str(outside), "/etc/passwd", "a/../../x", ".git/config", ".GIT"):
        with pytest.raises(PathOutsideWorktree):
            await restore(engine, wt, cp_a["id"], paths=["a.txt", bad])
    assert worktree_listing(wt) == before
    assert tree_state(outside) == OUTSIDE_STATE
    # Through a symlink inside the worktree: selected lexically, nothing followed.
    result = await restore(engine, wt, cp_a["id"], paths=["out/x.txt"])
    assert result["written"] == result["deleted"] == []
    assert tree_state(outside) == OUTSIDE_STATE


async def test_restore_into_another_worktree(engine, tmp_path):
    main = tmp_path / "main"
    main.mkdir()
    git(main, "init", "-q")
    (main / "a.txt").write_text("main a\n")
    commit_all(main)
    linked = tmp_path / "linked"
    git(main, "worktree", "add", "-q", "-b", "other", str(linked))
    (main / "a.txt").write_text("main a, edited\n")
    (main / "only-main.txt").write_text("main only\n")
    cp_main = await checkpoint(engine, main)
    (linked / "a.txt").write_text("linked edit\n")
    (linked / "only-linked.txt").write_text("linked only\n")
    before = worktree_listing(linked)

    with pytest.raises(WorktreeMismatch):
        await restore(engine, linked, cp_main["id"])
    with pytest.raises(WorktreeMismatch):
        await engine.call("restore", {"checkpoint": cp_main["id"], "path": str(linked), "dry_run": True})
    assert worktree_listing(linked) == before

    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    git(unrelated, "init", "-q")
    (unrelated / "u.txt").write_text("u\n")
    with pytest.raises(WorktreeMismatch):
        await restore(engine, unrelated, cp_main["id"])
    assert (unrelated / "u.txt").read_text() == "u\n"

    result = await restore(engine, linked, cp_main["id"], allow_other_worktree=True)
    linked_id = (await engine.call("open", {"path": str(linked)}))["worktree"]["id"]
    assert result["safety_checkpoint"]["worktree"] == linked_id
    assert tree_state(linked) == {
        "a.txt": ("file", b"main a, edited\n", False),
        "only-main.txt": ("file", b"main only\n", False),
    }
    assert git(linked, "rev-parse", "--abbrev-ref", "HEAD") == "other"


# ---------------------------------------------------------------------------
# kill -9 in the middle of a large restore


_CHILD = r"""
import sys
import trio
from snapshotd.engine.core import Engine

async def main():
    engine = Engine()
    await engine.call("restore", {"checkpoint": sys.argv[2], "path": sys.argv[1]})
    print("finished", flush=True)

trio.run(main)
"""

FILES = 3000
SIZE = 20 * 1024


def _content(index: int, version: str) -> bytes:
    line = f"{version} file {index:05d} ".encode()
    return (line * (SIZE // len(line) + 1))[:SIZE]


async def large_worktree(engine: Engine, wt: Path, files: int) -> tuple[dict, dict, dict]:
    """``files`` files checkpointed, then all rewritten; returns the checkpoint and both states."""
    wt.mkdir()
    git(wt, "init", "-q")
    for index in range(files):
        folder = wt / f"d{index % 30:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"f{index:05d}.txt").write_bytes(_content(index, "old"))
    cp_old = await checkpoint(engine, wt, session="turns")
    old_state = tree_state(wt)
    for index in range(files):
        (wt / f"d{index % 30:02d}" / f"f{index:05d}.txt").write_bytes(_content(index, "new"))
    return cp_old, old_state, tree_state(wt)


def start_restore_child(wt: Path, checkpoint_id: str) -> subprocess.Popen[bytes]:
    """A separate process restoring ``checkpoint_id`` with an embedded engine."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(wt), checkpoint_id], cwd=ROOT, env=env, stdout=subprocess.PIPE
    )


def wait_for_writing(
    child: subprocess.Popen[bytes], wt: Path, journal_dir: Path, *, first_done: bool = False
) -> None:
    """Return once the child's restore has started replacing files.

    Its journal exists from the start; the first file it writes is
    ``d00/f00000.txt`` (writes go in path order), through a temporary name.
    With ``first_done``, wait until that file holds its restored content.
    """
    first = wt / "d00" / "f00000.txt"
    old = _content(0, "old")
    deadline = time.monotonic() + 60
    while True:
        assert child.poll() is None, "the child finished before it could be stopped"
        assert time.monotonic() < deadline, "the restore never started writing"
        if first.read_bytes() == old:
            return
        if (
            not first_done
            and journal_dir.is_dir()
            and any(journal_dir.glob("*.journal"))
            and any(name.startswith(TEMP_PREFIX) for name in os.listdir(first.parent))
        ):
            return
        time.sleep(0.002)


def wait_until_stopped(pid: int) -> None:
    """Return once the process is really stopped (SIGSTOP lands asynchronously)."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("T", "t"):
        assert time.monotonic() < deadline, "the child did not stop"
        time.sleep(0.001)


@pytest.mark.slow
async def test_kill_during_a_large_restore(engine, tmp_path):
    wt = tmp_path / "wt"
    cp_old, old_state, new_state = await large_worktree(engine, wt, FILES)
    new_tree = oracle_tree(wt)
    journal_dir = Path(git(wt, "rev-parse", "--path-format=absolute", "--git-dir")) / "snapshotd" / "journal"

    child = start_restore_child(wt, cp_old["id"])
    try:
        wait_for_writing(child, wt, journal_dir, first_done=True)
        time.sleep(0.06)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        assert child.stdout is not None
        output = child.stdout.read()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL and b"finished" not in output
    torn = tree_state(wt)
    old_count = sum(1 for p, v in torn.items() if v == old_state.get(p))
    assert 0 < old_count < FILES, "the kill did not land in the middle of the restore"

    fresh = Engine()
    await fresh.call("open", {"path": str(wt)})  # runs the crash recovery
    assert temps_left(wt) == []
    assert not list(journal_dir.glob("*.journal"))
    after = tree_state(wt)
    assert after.keys() == old_state.keys()
    for rel, value in after.items():
        assert value in (old_state[rel], new_state[rel]), rel

    # Nothing blocks: a checkpoint works and matches git.
    mid = await checkpoint(fresh, wt, session="turns")
    assert mid["tree"] == oracle_tree(wt)

    listed = (await fresh.call("list", {"path": str(wt)}))["checkpoints"]
    safety = [c for c in listed if c["label"] == f"before restore {cp_old['id'][:12]}"]
    assert [c["tree"] for c in safety] == [new_tree]
    # Back to the state before the interrupted restore: only the files it
    # already replaced are written again.
    result = await restore(fresh, wt, safety[0]["id"])
    assert len(result["written"]) == old_count and result["deleted"] == []
    assert tree_state(wt) == new_state
    assert oracle_tree(wt) == new_tree
    assert temps_left(wt) == []


async def test_opening_the_worktree_during_a_restore_leaves_that_restore_alone(engine, tmp_path):
    """Crash recovery runs when a worktree is opened; it must not take a live restore's files."""
    wt = tmp_path / "wt"
    cp_old, old_state, _ = await large_worktree(engine, wt, 600)
    journal_dir = Path(git(wt, "rev-parse", "--path-format=absolute", "--git-dir")) / "snapshotd" / "journal"

    child = start_restore_child(wt, cp_old["id"])
    try:
        wait_for_writing(child, wt, journal_dir)
        os.kill(child.pid, signal.SIGSTOP)
        wait_until_stopped(child.pid)
        journals = sorted(journal_dir.glob("*.journal"))
        temps = temps_left(wt)
        await Engine().call("open", {"path": str(wt)})  # a second process meeting the worktree
        assert sorted(journal_dir.glob("*.journal")) == journals
        assert temps_left(wt) == temps
        os.kill(child.pid, signal.SIGCONT)
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
        child.wait()
        assert child.stdout is not None
        output = child.stdout.read()
        child.stdout.close()
    assert b"finished" in output
    assert tree_state(wt) == old_state
    assert temps_left(wt) == [] and not list(journal_dir.glob("*.journal"))
