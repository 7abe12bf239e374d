"""Which worktree a checkpoint may be restored or reverted in: refusals that name the worktree it belongs to."""

from __future__ import annotations

import os

from snapshotd.errors import Unsupported, WorktreeMismatch
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.identity import Records, WorktreeInfo

__all__ = ["refuse_restore_elsewhere", "refuse_revert_elsewhere"]


def refuse_restore_elsewhere(
    records: Records, store: Store, checkpoint: Checkpoint, target: WorktreeInfo, allow_other: bool
) -> None:
    """Refuse a restore into a worktree other than the checkpoint's, unless allowed and in its repository."""
    if target.id != checkpoint.worktree and not allow_other:
        raise WorktreeMismatch(
            f"Checkpoint {checkpoint.id[:12]} belongs to the worktree at {records.path_of(checkpoint.worktree)}, "
            f"not to the one at {target.path}; restore it there, or pass allow_other_worktree (--into) to "
            "restore it here."
        )
    if os.path.realpath(store.repo.path) != os.path.realpath(target.store_dir):
        raise Unsupported(
            f"Checkpoint {checkpoint.id[:12]} is stored in the repository of {records.path_of(checkpoint.worktree)}, "
            f"not in that of {target.path}; restore it into a worktree of its own repository "
            "('git worktree add' makes one)."
        )


def refuse_revert_elsewhere(records: Records, checkpoint: Checkpoint, target: WorktreeInfo) -> None:
    """Refuse a revert of a checkpoint in a worktree other than its own."""
    if target.id != checkpoint.worktree:
        raise WorktreeMismatch(
            f"Checkpoint {checkpoint.id[:12]} belongs to the worktree at {records.path_of(checkpoint.worktree)}, "
            f"not to the one at {target.path}; revert it there."
        )
