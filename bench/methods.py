"""What every compared method returns, and the interface the cases drive.

A method captures a worktree (and, where it can, restores files and diffs two
captures). Each call returns a :class:`Sample`: the wall time the caller saw
and the exact number of processes the method started for it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .trees import Tree


@dataclass
class Sample:
    """One timed call of one method."""

    ms: float  # wall time seen by the caller
    processes: int  # git (or other) processes started for this call, counted exactly
    tree: str | None = None  # the captured tree id (captures)
    ref: str | None = None  # what restore and diff take: a tree, commit or checkpoint id
    engine_ms: float | None = None  # snapshotd's own figure (stats.ms), without transport
    scan: str | None = None  # snapshotd: "full" (cold path) or "watch" (warm path)
    hashed: int | None = None  # snapshotd: files hashed
    files: int | None = None  # diff: files reported
    extra: dict[str, Any] | None = None


class Method:
    """Base of every compared method; subclasses implement what they support."""

    name = "method"
    family = "peer"  # "baseline" | "peer" | "snapshotd"
    description = ""
    can_capture = True
    can_restore = False
    can_diff = False

    async def capture(self, tree: Tree) -> Sample:
        raise NotImplementedError

    async def restore(self, tree: Tree, ref: str, paths: Sequence[str] | None) -> Sample:
        raise NotImplementedError

    async def diff(self, tree: Tree, old: str, new: str) -> Sample:
        raise NotImplementedError

    async def forget(self, tree: Tree) -> None:
        """Drop per-tree state kept between calls (called when a tree is done)."""


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000
