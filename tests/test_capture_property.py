"""Random interleavings of worktree edits, git commands and captures, checked against git.

Each example starts from a tiny repository and applies a list of operations:
writes (often the same size as before, to hit racy timestamps), deletions,
folders made and removed, mode flips, symlinks, renames, new ignore rules,
folders moved in whole with ignore rules of their own,
``git add``, ``git commit -am`` and ``git rm --cached``, with captures in
between. After every capture the tree must equal the oracle's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
from capture_helpers import explain_trees, make_engine
from hypothesis import HealthCheck, given, settings, strategies as st
from oracle import oracle_tree
from repo_helpers import git_run, init_repo

from snapshotd.engine.core import Engine

FILES = ["a.txt", "b.txt", "d1/c.txt", "d1/d2/e.txt", "d3/f.txt", "g.log", "d1/h.log", "d4/x/y"]
DIRS = ["d1", "d1/d2", "d3", "d4", "d4/x"]
PATHS = FILES + DIRS
# Pairs of equal size (x/y, xy/yx) make same-size rewrites common.
CONTENTS = [b"", b"x\n", b"y\n", b"xy\n", b"yx\n", b"\x00bin\n", b"a longer line\n", b"cr\r\n"]
IGNORE_RULES = ["*.log", "d3/", "b.txt", "!g.log", "d1/d2/", "*.txt", "!d1/c.txt", "y"]
LINK_TARGETS = ["a.txt", "d1", "missing", "../outside", "d1/c.txt", "."]
# Folders made outside the worktree and moved in whole: one event, their own ignore rules with them.
MOVED_IN = {
    "logs": {".gitignore": "!*.log\n", "k.log": "k\n", "z.txt": "z\n"},
    "picky": {".gitignore": "*.txt\n!keep.txt\nsub/\n", "keep.txt": "", "drop.txt": "", "sub/x.txt": "x\n"},
    "plain": {"p.txt": "p\n", "q/r.log": "r\n", "q/s/t.txt": "t\n"},
    "empty-rules": {".gitignore": "", "u.log": "u\n", "w/v.txt": "v\n"},
}

Op = tuple[Any, ...]

operations = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(FILES), st.sampled_from(CONTENTS)),
    st.tuples(st.just("write"), st.sampled_from(FILES), st.sampled_from(CONTENTS)),
    st.tuples(st.just("delete"), st.sampled_from(PATHS)),
    st.tuples(st.just("mkdir"), st.sampled_from(DIRS), st.integers(1, 3)),
    st.tuples(st.just("rmtree"), st.sampled_from(DIRS)),
    st.tuples(st.just("chmod"), st.sampled_from(FILES), st.booleans()),
    st.tuples(st.just("symlink"), st.sampled_from(PATHS), st.sampled_from(LINK_TARGETS)),
    st.tuples(st.just("rename"), st.sampled_from(PATHS), st.sampled_from(PATHS)),
    st.tuples(st.just("ignore"), st.sampled_from(IGNORE_RULES)),
    st.tuples(st.just("unignore")),
    st.tuples(st.just("move_in"), st.sampled_from(DIRS), st.sampled_from(sorted(MOVED_IN))),
    st.tuples(st.just("git_add"), st.sampled_from(PATHS)),
    st.tuples(st.just("git_add_force"), st.sampled_from(FILES)),
    st.tuples(st.just("git_commit_am")),
    st.tuples(st.just("git_rm_cached"), st.sampled_from(FILES)),
    st.tuples(st.just("capture")),
    st.tuples(st.just("capture")),
)


def _clear(path: Path) -> None:
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _ensure_parent(root: Path, rel: str) -> None:
    cur = root
    for part in Path(rel).parts[:-1]:
        cur = cur / part
        if os.path.lexists(cur) and (cur.is_symlink() or not cur.is_dir()):
            _clear(cur)
        cur.mkdir(exist_ok=True)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def apply(root: Path, op: Op) -> None:
    """Apply one operation; impossible ones (renaming what is not there) do nothing."""
    kind = op[0]
    if kind == "write":
        _, rel, content = op
        _ensure_parent(root, rel)
        path = root / rel
        if path.is_symlink() or path.is_dir():
            _clear(path)
        with open(path, "wb") as fh:  # in place: same inode when the file exists
            fh.write(content)
    elif kind in ("delete", "rmtree"):
        _clear(root / op[1])
    elif kind == "mkdir":
        _, rel, count = op
        _ensure_parent(root, rel + "/x")
        for i in range(count):
            (root / rel / f"n{i}.txt").write_bytes(f"{rel} {i}\n".encode())
    elif kind == "chmod":
        _, rel, executable = op
        path = root / rel
        if path.is_file() and not path.is_symlink():
            path.chmod(0o755 if executable else 0o644)
    elif kind == "symlink":
        _, rel, target = op
        _ensure_parent(root, rel)
        _clear(root / rel)
        os.symlink(target, root / rel)
    elif kind == "rename":
        _, src, dst = op
        if not os.path.lexists(root / src) or _inside(dst, src) or _inside(src, dst):
            return
        _ensure_parent(root, dst)
        if not os.path.lexists(root / src):  # a parent of dst was src's ancestor link
            return
        _clear(root / dst)
        os.rename(root / src, root / dst)
    elif kind == "ignore":
        with open(root / ".gitignore", "a") as fh:
            fh.write(op[1] + "\n")
    elif kind == "unignore":  # the newest rule taken back: what it ignored is git's again
        rules = (root / ".gitignore").read_text().splitlines(keepends=True) if (root / ".gitignore").is_file() else []
        (root / ".gitignore").write_text("".join(rules[:-1]))
    elif kind == "move_in":
        _, rel, name = op
        staged = Path(tempfile.mkdtemp(prefix="incoming-", dir=root.parent))
        for inner, content in MOVED_IN[name].items():
            (staged / inner).parent.mkdir(parents=True, exist_ok=True)
            (staged / inner).write_text(content)
        _ensure_parent(root, rel)
        _clear(root / rel)
        os.rename(staged, root / rel)
    elif kind == "git_add":
        git_run(root, "add", "--", op[1], check=False)
    elif kind == "git_add_force" and os.path.isfile(root / op[1]):
        git_run(root, "add", "-f", "--", op[1], check=False)
    elif kind == "git_add_force":
        pass
    elif kind == "git_commit_am":
        git_run(root, "commit", "-q", "-a", "-m", "user commit", check=False)
    elif kind == "git_rm_cached":
        git_run(root, "rm", "-q", "-r", "--cached", "--", op[1], check=False)
    else:
        raise AssertionError(f"unknown operation {op!r}")


async def run_example(tmp_path: Path, mode: str, ops: list[Op]) -> None:
    base = Path(tempfile.mkdtemp(prefix="ex-", dir=tmp_path))
    (base / "outside").write_text("outside the worktree\n")
    repo = init_repo(base / "repo", ("a.txt", "x\n"), ("d1/c.txt", "c\n"), (".gitignore", ""))
    async with trio.open_nursery() as nursery:
        engine: Engine = make_engine(mode, nursery)
        try:
            for step, op in enumerate([*ops, ("capture",)]):
                if op[0] != "capture":
                    apply(repo, op)
                    continue
                with trio.fail_after(60):
                    result = await engine.call("checkpoint", {"path": str(repo), "session": "p"})
                want = oracle_tree(repo)
                got = result["checkpoint"]["tree"]
                if got != want:
                    steps = "\n".join(f"  {i}: {o!r}" for i, o in enumerate(ops[: step + 1]))
                    pytest.fail(
                        f"[{mode}] capture {got} differs from git's {want} after:\n{steps}\n"
                        "paths (A: only in the capture, D: only in git's, M: content differs):\n"
                        + explain_trees(repo, got, want)
                    )
        finally:
            await engine.aclose()
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("mode", ["cold", "warm"])
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(operations, min_size=1, max_size=20))
async def test_random_operations_match_git(tmp_path: Path, mode: str, ops: list[Op]) -> None:
    await run_example(tmp_path, mode, ops)


@pytest.mark.parametrize("mode", ["cold", "warm"])
@pytest.mark.parametrize(
    "ops",
    [
        [("write", "a.txt", b"y\n"), ("capture",), ("write", "a.txt", b"x\n")],
        [("symlink", "d1", "a.txt"), ("capture",), ("rmtree", "d1"), ("mkdir", "d1", 2)],
        [("git_rm_cached", "a.txt"), ("ignore", "*.txt"), ("capture",), ("git_add", "a.txt")],
        [("rename", "d1", "d3"), ("capture",), ("rename", "d3", "d1")],
        [("chmod", "a.txt", True), ("capture",), ("chmod", "a.txt", False)],
        [("write", "d4/x/y", b"xy\n"), ("git_add", "d4"), ("capture",), ("git_commit_am",)],
        [("ignore", "d1/d2/"), ("mkdir", "d1/d2", 3), ("capture",), ("ignore", "!d1/d2/")],
        [("write", "g.log", b"x\n"), ("ignore", "*.log"), ("capture",), ("ignore", "!g.log")],
        [("mkdir", "d4/x", 2), ("capture",), ("symlink", "d4", "../outside")],
        [("mkdir", "d4/x", 2), ("capture",), ("write", "d4/x", b"x\n")],
        [("mkdir", "d4/x", 2), ("capture",), ("rmtree", "d4"), ("write", "d4", b"x\n")],
        [("write", "d3/f.txt", b"x\n"), ("write", "d3/k.log", b"x\n"), ("ignore", "*.log"), ("capture",),
         ("write", "d3/k.log", b"y\n"), ("capture",), ("move_in", "d3", "logs"), ("capture",),
         ("write", "d3/k.log", b"xy\n")],
        [("move_in", "d1", "picky"), ("capture",), ("write", "d1/sub/y.txt", b"x\n"), ("capture",),
         ("move_in", "d1", "plain"), ("capture",), ("write", "d1/sub/y.txt", b"x\n")],
        [("ignore", "d3/"), ("mkdir", "d3/x", 2), ("capture",), ("unignore",), ("capture",),
         ("write", "d3/x/n0.txt", b"y\n"), ("mkdir", "d3/x/z", 1)],
        [("ignore", "d3/"), ("write", "d3/f.txt", b"x\n"), ("mkdir", "d3/q", 1), ("capture",),
         ("git_add_force", "d3/f.txt"), ("capture",), ("write", "d3/f.txt", b"y\n"), ("mkdir", "d3/q/r", 1)],
    ],
    ids=[
        "same-size-rewrite-back",
        "dir-to-link-and-back",
        "rm-cached-then-ignored",
        "dir-renamed-back",
        "exec-bit-back",
        "add-then-commit",
        "ignored-dir-unignored",
        "ignored-file-negated",
        "dir-to-symlink",
        "dir-to-file",
        "dir-removed-then-file",
        "ignored-folder-replaced-by-one-with-rules",
        "folder-rules-replaced",
        "unwatched-folder-unignored",
        "unwatched-folder-force-added",
    ],
)
async def test_known_sequences(tmp_path: Path, mode: str, ops: list[Op]) -> None:
    """Sequences worth keeping whatever hypothesis draws."""
    await run_example(tmp_path, mode, ops)
