"""What a restore or revert did: the outcome the apply step returns, and its one wire shape."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from snapshotd.git.modes import MODE_GITLINK
from snapshotd.restore.plan import Plan
from snapshotd.store.checkpoints import Checkpoint


@dataclass(frozen=True)
class RestoreOutcome:
    """The paths written and deleted, and those left alone with why (``conflicts``).

    ``kept`` lists what a restore left in place that the user may not expect
    (see :mod:`snapshotd.restore.kept`); it is None for a revert, which
    reports no such list. ``safety_checkpoint`` is the checkpoint recorded
    just before anything was touched (None when nothing was to be done, or
    with ``dry_run``, where the paths are those the plan would touch).
    ``submodules`` are the written paths that are gitlinks: a restore makes
    only their folder (a checkpoint holds no submodule's files), which
    ``git submodule update`` fills.
    """

    written: list[str]
    deleted: list[str]
    conflicts: list[dict[str, str]]
    kept: list[dict[str, str]] | None = None
    safety_checkpoint: Checkpoint | None = None
    dry_run: bool = False
    submodules: list[str] = field(default_factory=list)

    @classmethod
    def of_plan(cls, plan: Plan, skipped: Mapping[str, str] | None = None, *, dry_run: bool = False) -> RestoreOutcome:
        """The outcome of ``plan`` once the paths in ``skipped`` (path -> reason) were left alone."""
        skipped = skipped or {}
        known = {conflict["path"] for conflict in plan.conflicts}
        conflicts = [*plan.conflicts, *({"path": p, "reason": r} for p, r in skipped.items() if p not in known)]
        return cls(
            written=sorted(path for path, _ in plan.writes if path not in skipped),
            deleted=sorted(path for path in plan.deletes if path not in skipped),
            conflicts=sorted(conflicts, key=lambda conflict: conflict["path"]),
            dry_run=dry_run,
            submodules=sorted(p for p, entry in plan.writes if entry.mode == MODE_GITLINK and p not in skipped),
        )

    def to_wire(self) -> dict[str, Any]:
        """The result as the contract sends it.

        A restore lists ``kept`` and names its conflicts ``skipped``, left
        out when there are none; a revert always lists ``conflicts``.
        """
        result: dict[str, Any] = {
            "safety_checkpoint": None if self.safety_checkpoint is None else self.safety_checkpoint.to_wire(),
            "written": list(self.written),
            "deleted": list(self.deleted),
        }
        if self.submodules:
            result["submodules"] = list(self.submodules)
        if self.kept is None:
            result["conflicts"] = list(self.conflicts)
            return result
        result["kept"] = list(self.kept)
        if self.conflicts:
            result["skipped"] = list(self.conflicts)
        return result
