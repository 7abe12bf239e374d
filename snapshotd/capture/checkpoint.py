"""A checkpoint request's typed options, parsed from the wire once, and its result's wire shape."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from snapshotd.capture.state import CaptureStats
from snapshotd.contract.params import optional_bool, optional_str, validate_session
from snapshotd.contract.refs import WorktreeRef, worktree_param
from snapshotd.contract.trailers import Agent, agent_param
from snapshotd.errors import InvalidParams, NeedsForce
from snapshotd.settings import RESERVED_SESSION_PREFIX
from snapshotd.store.checkpoints import Checkpoint


@dataclass(frozen=True)
class CheckpointOptions:
    """What a ``checkpoint`` call asks for: its worktree, session and label, an exact (full-scan) capture, force,
    and the calling agent's ids for the commit's trailers (:mod:`snapshotd.contract.trailers`).

    A worktree named by a folder (``where.path``, rather than its id) that is
    broad is refused before it is opened.
    """

    where: WorktreeRef = field(default_factory=WorktreeRef)
    session: str | None = None
    label: str | None = None
    exact: bool = False
    force: bool = False
    agent: Agent = ()

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> CheckpointOptions:
        """Validate the wire params, each with the error the contract gives for it."""
        return cls(
            session=own_session(validate_session(params.get("session"))),
            label=optional_str(params, "label"),
            exact=optional_bool(params, "exact"),
            force=optional_bool(params, "force"),
            where=worktree_param(params),
            agent=agent_param(params),
        )


def own_session(session: str | None) -> str | None:
    """A session a client may record in: not one of the daemon's own (``snapshotd:``, its safety checkpoints,
    which ``undo`` takes back to)."""
    if session is not None and session.startswith(RESERVED_SESSION_PREFIX):
        raise InvalidParams(
            f"Sessions whose names start with {RESERVED_SESSION_PREFIX!r} are the daemon's own (its safety "
            "checkpoints); record in a session of another name.", session=session,
        )
    return session


@dataclass(frozen=True)
class CheckpointResult:
    """The recorded checkpoint and the stats of the capture it holds."""

    checkpoint: Checkpoint
    stats: CaptureStats

    def to_wire(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint.to_wire(), "stats": self.stats.to_wire()}


def broad_folder(real: str, *, plain: bool) -> str | None:
    """What makes ``real`` (a path without links) too broad to open unasked, in words; None for an ordinary folder.

    The user's home folder and ``/`` always are; for a folder that is not a
    repository also every folder above the home folder and every folder right
    under ``/`` (``/tmp``, ``/usr``, ...): opening one watches and copies every
    file under it.
    """
    home = os.path.realpath(os.path.expanduser("~"))
    if real == "/":
        return "the root of the file system"
    if real == home:
        return "your home folder"
    if plain and home.startswith(real + os.sep):
        return "a folder above your home folder"
    if plain and os.path.dirname(real) == "/":
        return "a folder right under the root of the file system"
    return None


def refuse_broad_folder(root: str, *, resolved: bool = False) -> None:
    """Refuse to checkpoint the user's home folder or ``/`` unless forced: it would take every file under it."""
    real = root if resolved else os.path.realpath(root)
    what = broad_folder(real, plain=False)
    if what is not None:
        raise NeedsForce(
            f"The worktree {real} is {what}, so a checkpoint would copy every file under it; "
            "pass force (snapshotd checkpoint --force) to do it anyway.",
            path=real,
        )


def refuse_unknown_broad_folder(real: str, *, plain: bool, known: bool) -> None:
    """Refuse to open ``real`` (a path without links), a broad folder (see :func:`broad_folder`) snapshotd has
    never recorded, unless forced.

    Any command would open it (list, diff, show, verify, subscribe...) and so
    watch and scan all of it; one never checkpointed has nothing to show either.
    """
    what = None if known else broad_folder(real, plain=plain)
    if what is not None:
        raise NeedsForce(
            f"The folder {real} is {what} and holds no checkpoints, so opening it would watch and copy every "
            "file under it; pass force (snapshotd checkpoint --force there) to do it anyway.",
            path=real,
        )
