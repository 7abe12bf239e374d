"""Recorded worktrees that are not open, from their records alone: as ``worktrees --known`` shows them, and
those no longer where recorded, which after a restart nothing open tells of."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

from snapshotd.capture.presence import GONE, HERE, REMOVED, removed_with_git
from snapshotd.store.identity import Records, WorktreeInfo

__all__ = ["recorded_away", "recorded_wire"]


class Opened(Protocol):
    """An open worktree, for where it is."""

    @property
    def info(self) -> WorktreeInfo: ...


def recorded_wire(worktree_id: str, record: dict[str, Any], opened: Mapping[str, Opened]) -> dict[str, Any]:
    """A recorded worktree not open, from its record alone: nothing is opened or run there.

    It is ``here`` when its folder is (listing its checkpoints by id opens
    it, with every check an open makes), else ``gone``, as it is when an
    open worktree now holds its path.
    """
    path = str(record.get("path", ""))
    taken = any(state.info.path == path for state in opened.values())
    here = os.path.isdir(path) and not taken
    wire = {name: record.get(name) for name in ("path", "kind", "git_dir", "common_dir")}
    removed = not here and not os.path.lexists(path) and removed_with_git(record.get("git_dir"), record.get("common_dir"))
    problem = None if here else (
        f"The worktree {worktree_id} at {path} was removed with git; 'snapshotd forget {worktree_id}' drops its record."
        if removed else
        f"The worktree {worktree_id} is no longer at {path}; 'snapshotd repair NEW_PATH' finds it if it moved, "
        f"'snapshotd forget {worktree_id}' drops it."
    )
    return {"id": worktree_id, **wire, "head": None, "branch": None, "watching": False, "open": False,
            "presence": HERE if here else REMOVED if removed else GONE, "problem": problem}


def recorded_away(records: Records, opened: Mapping[str, Opened]) -> list[dict[str, Any]]:
    """The recorded worktrees not open whose folder is not there (deleted, moved away, removed with git), as
    :func:`recorded_wire` shows them; blocking: on a worker thread."""
    return [
        recorded_wire(key, record, opened)
        for key, record in sorted(records.load().items())
        if key not in opened and not os.path.lexists(str(record.get("path", "")))
    ]
