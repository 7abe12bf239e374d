"""Helpers the restore tests share: git's own tree of a worktree, and the temporary names left in it."""

from __future__ import annotations

import os
from pathlib import Path

from repo_helpers import git

from snapshotd.restore.fileops import TEMP_PREFIX


def capture(wt: Path, exclude: tuple[str, ...] = ()) -> str:
    """``git add -A && git write-tree`` in a fresh index, leaving out ``exclude`` (over-cap files)."""
    index = wt.parent / f".index-{os.urandom(6).hex()}"
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        git(wt, "add", "-A", env=env)
        for path in exclude:
            git(wt, "rm", "-q", "--cached", "--ignore-unmatch", "--", path, env=env)
        return git(wt, "write-tree", env=env)
    finally:
        index.unlink(missing_ok=True)


def temps_left(root: Path) -> list[str]:
    """Every temporary or backup name the restore uses, left anywhere under ``root``."""
    return sorted(
        os.path.relpath(os.path.join(folder, name), root)
        for folder, dirs, files in os.walk(root)
        for name in files + dirs
        if name.startswith(TEMP_PREFIX)
    )
