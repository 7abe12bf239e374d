"""Shared pieces of the capture tests: engines, checkpoint calls, tree checks."""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from oracle import oracle_tree
from repo_helpers import git, git_ok, git_run

from snapshotd.engine.core import Engine

# A capture that takes longer than this is hanging (on a FIFO, a device, a lock).
CAPTURE_TIMEOUT_S = 60


@pytest.fixture(params=["cold", "warm"])
def mode(request: pytest.FixtureRequest) -> str:
    """``cold``: an engine without a watcher; ``warm``: a watched engine."""
    return request.param


@pytest.fixture
async def eng(mode: str, nursery: trio.Nursery) -> AsyncIterator[Engine]:
    """An engine per ``mode``, with the default size cap."""
    engine = Engine(nursery=nursery) if mode == "warm" else Engine()
    try:
        yield engine
    finally:
        await engine.aclose()


def make_engine(mode: str, nursery: trio.Nursery, **kwargs: Any) -> Engine:
    """An engine with ``kwargs`` (size_cap=…), watched when ``mode`` is warm."""
    if mode == "warm":
        return Engine(nursery=nursery, **kwargs)
    return Engine(**kwargs)


async def checkpoint(
    engine: Engine,
    path: str | Path,
    *,
    session: str | None = "s1",
    label: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Call ``checkpoint`` and check the shape of its result."""
    params: dict[str, Any] = {"path": str(path), **extra}
    if session is not None:
        params["session"] = session
    if label is not None:
        params["label"] = label
    with trio.fail_after(CAPTURE_TIMEOUT_S):
        result = await engine.call("checkpoint", params)
    cp = result["checkpoint"]
    stats = result["stats"]
    assert set(cp) >= {
        "id",
        "tree",
        "parent",
        "worktree",
        "session",
        "label",
        "seq",
        "created_at",
        "base",
        "changed",
    }
    assert set(stats) >= {"ms", "processes", "scan", "hashed", "skipped"}
    assert stats["scan"] in ("full", "watch", "none")
    assert isinstance(stats["skipped"], list)
    assert cp["session"] == session
    assert cp["label"] == label
    assert cp["worktree"].startswith("wt_")
    return result


def explain_trees(repo: Path, got: str, want: str) -> str:
    proc = git_run(repo, "diff-tree", "-r", "--no-renames", "--name-status", want, got, check=False)
    if proc.returncode != 0:
        return "(the trees cannot be compared here)"
    return os.fsdecode(proc.stdout) or "(no path differs: modes or gitlinks?)"


def assert_tree(repo: str | Path, got: str, want: str) -> None:
    """``got`` must be git's tree ``want``; on failure, name the paths that differ."""
    if got != want:
        pytest.fail(
            f"capture gave tree {got}, git gives {want}; "
            "paths (A: only in the capture, D: only in git's, M: content differs):\n"
            + explain_trees(Path(repo), got, want)
        )


def assert_matches_git(
    repo: str | Path, result: dict[str, Any], *, size_cap: int | None = None
) -> str:
    """The checkpoint's tree equals the oracle's, and it is a real commit of that tree."""
    cp = result["checkpoint"]
    want = oracle_tree(repo, size_cap=size_cap)
    assert_tree(repo, cp["tree"], want)
    assert_commit_in_repo(repo, cp)
    return want


def assert_commit_in_repo(repo: str | Path, cp: dict[str, Any]) -> None:
    """``git show`` works on the checkpoint in the user's repository."""
    assert git(repo, "cat-file", "-t", cp["id"]) == "commit"
    assert git(repo, "rev-parse", f"{cp['id']}^{{tree}}") == cp["tree"]
    assert git_ok(repo, "show", "--stat", "--format=%H", cp["id"])


def head_or_none(repo: str | Path) -> str | None:
    proc = git_run(repo, "rev-parse", "-q", "--verify", "HEAD^{commit}", check=False)
    return proc.stdout.decode().strip() or None


def find_store(home: str | Path, commit: str) -> Path | None:
    """The repository under ``home`` that holds ``commit`` (the app-owned store)."""
    for dirpath, dirnames, filenames in os.walk(home):
        if "objects" not in dirnames or "HEAD" not in filenames:
            continue
        if git_ok(dirpath, f"--git-dir={dirpath}", "cat-file", "-e", f"{commit}^{{commit}}"):
            return Path(dirpath)
    return None


def regular_files(root: Path, paths: list[str]) -> list[str]:
    """The paths that are regular files on disk, not reached through a symlink."""
    found = []
    for rel in paths:
        parts = Path(rel).parts
        cur = root
        ok = True
        for part in parts[:-1]:
            cur = cur / part
            if not cur.is_dir() or cur.is_symlink():
                ok = False
                break
        if not ok:
            continue
        try:
            st = os.lstat(root / rel)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.append(rel)
    return found


class Perturbation:
    """Edits a worktree in a reversible way: append to files, delete one, add new ones."""

    def __init__(self, root: Path, paths: list[str], limit: int = 12) -> None:
        self.root = root
        self.files = regular_files(root, paths)[:limit]
        self.saved: dict[str, tuple[bytes, int]] = {}
        self.created: list[Path] = []

    def apply(self) -> None:
        for rel in self.files:
            path = self.root / rel
            st = os.lstat(path)
            self.saved[rel] = (path.read_bytes(), st.st_mode)
        for rel in self.files[1:]:
            with open(self.root / rel, "ab") as fh:
                fh.write(b"+perturbed\n")
        if self.files:
            (self.root / self.files[0]).unlink()
        for folder in {self.root, *((self.root / rel).parent for rel in self.files[:3])}:
            new = folder / "perturbation-new.txt"
            if not os.path.lexists(new):
                new.write_bytes(b"new during the perturbation\n")
                self.created.append(new)

    def revert(self) -> None:
        for path in self.created:
            path.unlink()
        for rel, (data, mode) in self.saved.items():
            path = self.root / rel
            path.write_bytes(data)
            os.chmod(path, stat.S_IMODE(mode))
