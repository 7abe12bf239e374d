"""Worktree-move repair: the id and checkpoints follow a worktree to its new path.

Git's own links are mended with ``git worktree repair`` (the back link in
``.git/worktrees/<name>/gitdir`` and each linked worktree's ``.git`` file); the
daemon's records are mended by re-identifying the worktree at its new path,
where its id file (in its git dir) or its device and inode (plain folders)
says who it is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .capture import thread_limiter
from .errors import SnapshotdError
from .gitproc import GitTarget, run_git
from .worktree import Records, WorktreeInfo, identify, locate

if TYPE_CHECKING:
    from .engine import Engine


def _linked_root(git_dir: str) -> str | None:
    """Where git itself says a linked worktree now is (``git worktree move`` updates this)."""
    try:
        dotgit = Path(git_dir, "gitdir").read_text().strip()
    except OSError:
        return None
    root = os.path.dirname(dotgit)
    return root if os.path.isdir(root) else None


def _is_linked(info: WorktreeInfo) -> bool:
    return info.git_dir is not None and info.common_dir is not None and info.git_dir != info.common_dir


async def _mend_git_links(info: WorktreeInfo, records: Records) -> None:
    """Run ``git worktree repair`` so git's links match where the worktrees are now."""
    if info.common_dir is None:
        return
    common = GitTarget(git_dir=info.common_dir, work_tree=None)
    if _is_linked(info):
        await run_git(common, ["worktree", "repair", info.path])
        return
    # The main worktree (or the whole repository) moved: re-point every linked worktree we know.
    linked = [
        record["path"]
        for record in records.load().values()
        if record.get("common_dir") == info.common_dir
        and record.get("git_dir") != info.common_dir
        and os.path.isdir(record.get("path", ""))
    ]
    await run_git(GitTarget(git_dir=info.common_dir, work_tree=info.path), ["worktree", "repair", *linked])


async def repair(engine: Engine, path: str | None) -> list[dict[str, Any]]:
    """Find moved worktrees (the one at ``path``, or every known one git can trace)."""
    before = engine.records.load()
    candidates: list[str] = []
    if path is not None:
        candidates.append(path)
    else:
        for record in before.values():
            if os.path.isdir(record.get("path", "")):
                continue
            if record.get("kind") == "git" and record.get("git_dir"):
                root = _linked_root(record["git_dir"])
                if root is not None:
                    candidates.append(root)
    moved = []
    for candidate in candidates:
        info = await trio.to_thread.run_sync(
            lambda c=candidate: identify(locate(c), engine.records), limiter=thread_limiter
        )
        old = before.get(info.id)
        if info.kind == "git":
            try:
                await _mend_git_links(info, engine.records)
            except SnapshotdError:
                if path is not None:
                    raise
        if old is not None and old.get("path") != info.path:
            moved.append({"worktree": info.id, "from": old.get("path"), "to": info.path})
        engine.worktrees.pop(info.id, None)
        engine.open_path(info.path)
    return moved
