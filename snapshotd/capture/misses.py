"""The watch-miss report: where a warm tree differs from a full scan of the disk, and why.

Every difference is a change the watcher missed. ``verify`` and the idle
reconciliation both name them this way, log each one and count them as
``watch_miss``, which must stay 0.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Set
from dataclasses import dataclass
from typing import Any

import trio

from snapshotd.git.repository import repository
from snapshotd.store import diff as diff_mod
from snapshotd.store.changes import FileChange
from snapshotd.store.identity import WorktreeInfo
from snapshotd.threads import thread_limiter

log = logging.getLogger(__name__)

MISS_CAUSES = {
    "added": "on disk but not in the warm state: the watcher missed a new path",
    "deleted": "in the warm state but gone from disk: the watcher missed a deletion",
    "modified": "changed on disk: the watcher missed a write",
    "type_changed": "changed type on disk: the watcher missed a replacement",
}
CHMOD_CAUSE = "mode changed on disk: the watcher missed a chmod"


def _tree_entry(oid: str | None, mode: str | None) -> dict[str, str] | None:
    """One side of a ``verify`` difference: the entry's blob (or commit) id and mode, None when absent."""
    return None if oid is None else {"oid": oid, "mode": mode or ""}


@dataclass(frozen=True)
class WatchMiss:
    """One path where the warm tree and the disk disagree: both sides' entries and the cause."""

    path: str
    warm: dict[str, str] | None
    disk: dict[str, str] | None
    cause: str

    @classmethod
    def of_change(cls, change: FileChange) -> WatchMiss:
        """The miss a tree diff's file change stands for (a same-content modification is a chmod)."""
        cause = MISS_CAUSES.get(change.status, change.status)
        if change.status == "modified" and change.old_oid == change.new_oid:
            cause = CHMOD_CAUSE
        return cls(
            change.path,
            _tree_entry(change.old_oid, change.old_mode),
            _tree_entry(change.new_oid, change.new_mode),
            cause,
        )

    def to_wire(self) -> dict[str, Any]:
        return {"path": self.path, "warm": self.warm, "disk": self.disk, "cause": self.cause}


@dataclass(frozen=True)
class VerifyResult:
    """What ``verify`` found: the misses, and how long the full scan took."""

    differences: list[WatchMiss]
    scan_ms: float

    def to_wire(self) -> dict[str, Any]:
        return {"differences": [miss.to_wire() for miss in self.differences], "scan_ms": round(self.scan_ms, 3)}


def _changes(info: WorktreeInfo, warm_tree: str, disk_tree: str) -> list[FileChange]:
    """The tree diff from the warm tree to the disk's, without rename detection; on a worker thread."""
    with repository(info.store_dir) as repo:
        return diff_mod.diff_trees(repo, warm_tree, disk_tree, find_renames=False).files


def _seen(path: str, seen: Set[str]) -> bool:
    """Whether the watcher reported ``path``, or a folder above it, in ``seen``."""
    while path:
        if path in seen:
            return True
        path = path.rpartition("/")[0]
    return False


async def watch_misses(
    info: WorktreeInfo,
    warm_tree: str,
    disk_tree: str,
    by: str,
    counters: Counter[str],
    seen: Set[str] = frozenset(),
) -> list[WatchMiss]:
    """The paths where the warm tree differs from a full scan, each logged and counted as ``watch_miss``;
    except those in ``seen``, which the watcher reported changed after the warm tree was taken (written
    while the scan ran: no miss)."""
    if warm_tree == disk_tree:
        return []
    changes = await trio.to_thread.run_sync(_changes, info, warm_tree, disk_tree, limiter=thread_limiter)
    misses = [WatchMiss.of_change(change) for change in changes if not _seen(change.path, seen)]
    if not misses:
        return []
    for miss in misses:
        log.warning("watch_miss in %s (%s): %s %s", info.path, by, miss.path, miss.cause)
    counters["watch_miss"] += max(1, len(misses))
    return misses
