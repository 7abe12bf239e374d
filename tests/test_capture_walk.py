"""Random walks through what users do to a worktree between captures, each capture checked with git.

On top of the edits of ``test_capture_property`` a walk may move the whole
repository to another folder (the engine must follow it, at worst after one
error that says to run ``repair``), create a nested repository with a commit,
change a folder's ``.gitignore`` and ``.gitattributes`` together with files
under them, replace a file by renaming another over it (as editors save), and
run ``gc`` between captures. After every capture the tree must equal git's,
and the worktree keeps its id through moves.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
from capture_helpers import CAPTURE_TIMEOUT_S, explain_trees, make_engine
from hypothesis import HealthCheck, given, settings, strategies as st
from oracle import oracle_tree
from repo_helpers import git_run, init_repo
from test_capture_property import CONTENTS, FILES, apply as apply_edit, operations as edits

from snapshotd.engine.core import Engine
from snapshotd.errors import SnapshotdError

Op = tuple[Any, ...]

RULE_FOLDERS = ["d1", "d3", "d1/d2"]
IGNORE_LINES = ["", "*.log", "c.txt", "!*.log", "*", "n0.txt"]
ATTRIBUTE_LINES = ["", "* binary", "*.txt text eol=lf", "*.txt text eol=crlf", "* text=auto", "*.txt -text"]
NESTED_REPOS = ["vendor/lib", "d3/sub"]
SPOTS = ("repo", "moved")

EXTRA = {
    "rules": st.tuples(st.just("rules"), st.sampled_from(RULE_FOLDERS), st.sampled_from(IGNORE_LINES),
                       st.sampled_from(ATTRIBUTE_LINES), st.sampled_from(["c.txt", "n0.txt", "g.log"]),
                       st.sampled_from(CONTENTS)),
    "replace": st.tuples(st.just("replace"), st.sampled_from(FILES), st.sampled_from(CONTENTS)),
    "gc": st.tuples(st.just("gc"), st.integers(0, 2)),
    "move": st.tuples(st.just("move")),
    "nested_repo": st.tuples(st.just("nested_repo"), st.sampled_from(NESTED_REPOS)),
    "link": st.tuples(st.just("link"), st.sampled_from(FILES), st.sampled_from(FILES)),
}

def walk_operations() -> st.SearchStrategy[Op]:
    """Every edit of test_capture_property, and the operations above."""
    return st.one_of(edits, *EXTRA.values())


def write_rules(root: Path, folder: str, ignore: str, attributes: str, name: str, content: bytes) -> None:
    """A folder's .gitignore and .gitattributes rewritten, and one file under them, in one go."""
    target = root / folder
    apply_edit(root, ("write", f"{folder}/{name}", content))
    (target / ".gitignore").write_text(ignore + "\n" if ignore else "")
    (target / ".gitattributes").write_text(attributes + "\n" if attributes else "")


def replace_by_rename(root: Path, rel: str, content: bytes) -> None:
    """Write the new content beside the file, then rename it over the file (a new inode)."""
    apply_edit(root, ("write", rel, content))
    temporary = (root / rel).with_name(".replace.tmp")
    temporary.write_bytes(content + b"replaced\n")
    os.rename(temporary, root / rel)


def hard_link(root: Path, src: str, dst: str) -> None:
    """``dst`` made another name of the regular file ``src`` (writes in place then reach both)."""
    if src == dst or not (root / src).is_file() or (root / src).is_symlink():
        return
    apply_edit(root, ("write", dst, b""))  # its folders made, a folder or link there cleared
    if not (root / src).is_file() or (root / src).is_symlink():
        return  # src was on dst's way
    os.unlink(root / dst)
    os.link(root / src, root / dst)


def nested_repo(root: Path, rel: str) -> None:
    """``git init`` and a commit in a folder of the worktree (a gitlink to git's ``add -A``)."""
    if os.path.lexists(root / rel / ".git"):
        return
    apply_edit(root, ("write", f"{rel}/inner.txt", b"inner\n"))
    git_run(root / rel, "init", "-q")
    git_run(root / rel, "add", "-A")
    git_run(root / rel, "commit", "-q", "-m", "nested")


class Walk:
    """One walk: the engine, where the repository is now, and its worktree id."""

    def __init__(self, engine: Engine, base: Path) -> None:
        self.engine, self.base = engine, base
        self.repo = base / "repo"
        self.worktree_id: str | None = None

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        with trio.fail_after(CAPTURE_TIMEOUT_S):
            return await self.engine.call(method, params)

    def move(self) -> None:
        """Rename the whole repository to the other spot."""
        spot = SPOTS[1] if self.repo.name == SPOTS[0] else SPOTS[0]
        target = self.base / spot
        os.rename(self.repo, target)
        self.repo = target

    async def capture(self) -> str:
        """Checkpoint here; a moved worktree may first say to run ``repair``, once."""
        params = {"path": str(self.repo), "session": "walk"}
        try:
            result = await self.call("checkpoint", params)
        except SnapshotdError as exc:
            assert "repair" in exc.message, f"a capture failed without saying what to do: {exc.message}"
            await self.call("repair", {"path": str(self.repo)})
            result = await self.call("checkpoint", params)
        worktree = result["checkpoint"]["worktree"]
        assert self.worktree_id in (None, worktree), "the worktree changed its id"
        self.worktree_id = worktree
        return result["checkpoint"]["tree"]

    async def apply(self, op: Op) -> None:
        kind = op[0]
        if kind == "rules":
            write_rules(self.repo, *op[1:])
        elif kind == "replace":
            replace_by_rename(self.repo, *op[1:])
        elif kind == "gc":
            await self.call("gc", {"path": str(self.repo), "keep": op[1]})
        elif kind == "move":
            self.move()
        elif kind == "nested_repo":
            nested_repo(self.repo, op[1])
        elif kind == "link":
            hard_link(self.repo, *op[1:])
        else:
            apply_edit(self.repo, op)


async def run_walk(tmp_path: Path, mode: str, ops: list[Op]) -> None:
    """Apply ``ops``, capturing at each ``capture`` and at the end; each tree must be git's."""
    base = Path(tempfile.mkdtemp(prefix="walk-", dir=tmp_path))
    (base / "outside").write_text("outside the worktree\n")
    init_repo(base / "repo", ("a.txt", "x\n"), ("d1/c.txt", "c\n"), (".gitignore", ""))
    async with trio.open_nursery() as nursery:
        walk = Walk(make_engine(mode, nursery), base)
        try:
            for step, op in enumerate([*ops, ("capture",)]):
                if op[0] != "capture":
                    await walk.apply(op)
                    continue
                got = await walk.capture()
                want = oracle_tree(walk.repo)
                if got != want:
                    steps = "\n".join(f"  {i}: {o!r}" for i, o in enumerate(ops[: step + 1]))
                    pytest.fail(
                        f"[{mode}] capture {got} differs from git's {want} after:\n{steps}\n"
                        "paths (A: only in the capture, D: only in git's, M: content differs):\n"
                        + explain_trees(walk.repo, got, want)
                    )
        finally:
            await walk.engine.aclose()
            nursery.cancel_scope.cancel()


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
@pytest.mark.parametrize("mode", ["cold", "warm"])
async def test_random_walks_match_git(tmp_path: Path, mode: str, data: st.DataObject) -> None:
    ops = data.draw(st.lists(walk_operations(), min_size=1, max_size=16), label="ops")
    await run_walk(tmp_path, mode, ops)


KEPT_WALKS = {
    # Found by replaying libgit2 at 9084712b55: new eol rules convert a file hashed before.
    "attributes-convert-an-untouched-file": [
        ("write", "d1/c.txt", b"cr\r\n"),
        ("rules", "d1", "", "* binary", "n0.txt", b"x\n"),
        ("capture",),
        ("rules", "d1", "", "*.txt text eol=lf", "n0.txt", b"x\n"),
    ],
    "moved-twice": [("capture",), ("move",), ("capture",), ("write", "a.txt", b"y\n"), ("move",)],
    "gc-keep-0": [("capture",), ("gc", 0), ("write", "a.txt", b"xy\n"), ("capture",), ("gc", 0)],
    "replaced-by-rename": [("capture",), ("replace", "d1/c.txt", b"x\n"), ("capture",), ("replace", "d1/c.txt", b"x\n")],
    "folder-ignored-then-not": [("rules", "d1", "*", "", "c.txt", b"y\n"), ("capture",), ("rules", "d1", "", "", "c.txt", b"x\n")],
    "nested-repo-before-first-capture": [("nested_repo", "d3/sub"), ("capture",), ("write", "d3/sub/inner.txt", b"y\n")],
    "nested-repo-in-a-warm-worktree": [("capture",), ("write", "a.txt", b"x\n"), ("nested_repo", "vendor/lib")],
    "moved-then-nested-repo": [("capture",), ("move",), ("nested_repo", "vendor/lib"), ("capture",), ("move",)],
    "written-through-a-link": [("capture",), ("link", "a.txt", "d3/f.txt"), ("capture",), ("write", "d3/f.txt", b"y\n"),
                               ("capture",), ("write", "a.txt", b"xy\n")],
}


@pytest.mark.parametrize("mode", ["cold", "warm"])
@pytest.mark.parametrize("ops", list(KEPT_WALKS.values()), ids=list(KEPT_WALKS))
async def test_kept_walks(tmp_path: Path, mode: str, ops: list[Op]) -> None:
    """Walks worth keeping whatever hypothesis draws."""
    await run_walk(tmp_path, mode, ops)
