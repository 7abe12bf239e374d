"""A checkpoint request's typed options, parsed from the wire once, and its result's wire shape."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from snapshotd.capture.state import CaptureStats
from snapshotd.errors import NeedsForce
from snapshotd.server.params import optional_bool, optional_str, validate_session
from snapshotd.store.checkpoints import Checkpoint


@dataclass(frozen=True)
class CheckpointOptions:
    """What a ``checkpoint`` call asks for: its session and label, an exact (full-scan) capture, and force.

    ``path`` is the folder the caller named, if it named one (rather than a
    worktree id): a broad folder is refused before it is opened.
    """

    session: str | None = None
    label: str | None = None
    exact: bool = False
    force: bool = False
    path: str | None = None

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> CheckpointOptions:
        """Validate the wire params, each with the error the contract gives for it."""
        return cls(
            session=validate_session(params.get("session")),
            label=optional_str(params, "label"),
            exact=optional_bool(params, "exact"),
            force=optional_bool(params, "force"),
            path=optional_str(params, "path"),
        )


@dataclass(frozen=True)
class CheckpointResult:
    """The recorded checkpoint and the stats of the capture it holds."""

    checkpoint: Checkpoint
    stats: CaptureStats

    def to_wire(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint.to_wire(), "stats": self.stats.to_wire()}


def refuse_broad_folder(root: str) -> None:
    """Refuse to checkpoint the user's home folder or ``/`` unless forced: it would take every file under it."""
    home = os.path.realpath(os.path.expanduser("~"))
    real = os.path.realpath(root)
    if real in (home, "/"):
        what = "your home folder" if real == home else "the root of the file system"
        raise NeedsForce(
            f"The worktree {real} is {what}, so a checkpoint would copy every file under it; "
            "pass force (snapshotd checkpoint --force) to do it anyway.",
            path=real,
        )
