"""The restore stage's entry: a restore or revert from safety checkpoint to outcome.

The engine resolves the worktree and the checkpoints, takes the worktree's
lock and calls :func:`run_restore` or :func:`run_revert` with the worktree
as a :class:`LockedWorktree`. Those capture the worktree (the safety
checkpoint's tree), plan from trees, prepare the plan, record the safety
checkpoint and apply, all through that one object: the stage never sees the
engine. What a finished restore leaves to do (its renames made durable, its
backups and journal removed) is handed to the worktree to do after the answer.

Throughout the stage, ``repo`` is a ``pygit2.Repository`` or, for a
repository libgit2 cannot open (SHA-256), a
:class:`~snapshotd.git.repository.GitRepository` offering the same calls.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Protocol

import pygit2
import trio

from snapshotd.capture.scan import git_target
from snapshotd.capture.state import CaptureResult, git_config, make_fence
from snapshotd.capture.watchpaths import is_ignore_rules
from snapshotd.errors import NotFound, SnapshotdError, filesystem_error
from snapshotd.git.repository import Repository
from snapshotd.restore import kept as kept_mod
from snapshotd.restore.journal import recover
from snapshotd.restore.outcome import RestoreOutcome
from snapshotd.restore.plan import Plan, plan_restore, plan_revert
from snapshotd.restore.prepared import prepared_plan
from snapshotd.restore.stage import GitCheckout
from snapshotd.restore.trees import unmatched_paths
from snapshotd.store.checkpoints import Checkpoint
from snapshotd.store.identity import WorktreeInfo
from snapshotd.threads import thread_limiter

__all__ = ["LockedWorktree", "RestoreOptions", "RevertOptions", "recover", "run_restore", "run_revert"]

PlanMaker = Callable[[Repository, str], Plan]

LABEL_ID_DIGITS = 12
"""A safety checkpoint's label names the checkpoints by this many digits, as ``list`` prints them."""


@dataclass(frozen=True)
class RestoreOptions:
    """A restore of ``checkpoint`` under ``paths`` (worktree-relative; None: all of it)."""

    checkpoint: Checkpoint
    paths: list[str] | None = None
    dry_run: bool = False


@dataclass(frozen=True)
class RevertOptions:
    """Undoing the changes from checkpoint ``start`` to ``end`` under ``paths``; ``force`` overrides conflicts."""

    start: Checkpoint
    end: Checkpoint
    paths: list[str] | None = None
    dry_run: bool = False
    force: bool = False


class LockedWorktree(Protocol):
    """The worktree being restored, while the caller holds its lock: all the stage needs of the engine.

    The engine makes one only inside the worktree's lock, so receiving one
    means the lock is held (:mod:`snapshotd.engine.locked`). ``capture(exact)``
    takes the worktree's tree (warm, or exact when asked); ``store()`` is the
    worktree's store for a block (blocking, on a worker thread); ``record(repo,
    tree, label)`` records the safety checkpoint in it; ``forget(path)`` drops
    a path the apply touched from the capture's cache; ``recaptured()`` counts
    a warm capture replaced by an exact one; ``later(cleanup)`` runs a blocking
    cleanup once the caller has answered, under the worktree's lock.
    """

    @property
    def info(self) -> WorktreeInfo: ...

    async def capture(self, exact: bool) -> CaptureResult: ...

    def store(self) -> AbstractContextManager[Repository]: ...

    def record(self, repo: Repository, tree: str, label: str) -> Checkpoint: ...

    def forget(self, path: str) -> None: ...

    def recaptured(self) -> None: ...

    async def later(self, cleanup: Callable[[], None]) -> None: ...


def no_safety(exc: BaseException, store_dir: str) -> SnapshotdError:
    """The error of a restore or revert whose safety checkpoint could not be taken: nothing was changed."""
    error = exc if isinstance(exc, SnapshotdError) else filesystem_error(exc, store_dir, "save the safety checkpoint in")
    return type(error)(
        f"{error.message.rstrip('.')}; no safety checkpoint could be taken, so nothing was changed.", **error.data
    )


async def run_restore(worktree: LockedWorktree, options: RestoreOptions) -> RestoreOutcome:
    """Make the worktree under ``options.paths`` equal the checkpoint.

    A path named that matches nothing in the checkpoint, the worktree's tree
    or on disk is NotFound, and nothing is restored. The outcome lists in
    ``kept`` what the restore left in place that the user may not expect.
    """
    checkpoint, paths, info = options.checkpoint, options.paths, worktree.info

    def plan(repo: Repository, current: str) -> Plan:
        missing = unmatched_paths(repo, [current, checkpoint.tree], paths or [], info.path)
        if missing:
            raise NotFound(
                f"Nothing matches {missing[0]!r} in checkpoint {checkpoint.id[:12]} or in the worktree; "
                "nothing was restored.",
                paths=missing,
            )
        return plan_restore(repo, current, checkpoint.tree, paths, info.path)

    job = _Job(plan, options.dry_run, f"before restore {checkpoint.id[:LABEL_ID_DIGITS]}", report_kept=True, paths=paths,
               target_tree=checkpoint.tree)
    return await _with_safety(worktree, info, job)


async def run_revert(worktree: LockedWorktree, options: RevertOptions) -> RestoreOutcome:
    """Undo the changes from ``options.start`` to ``options.end`` in the worktree."""
    info = worktree.info

    def plan(repo: Repository, current: str) -> Plan:
        return plan_revert(
            repo, current, options.start.tree, options.end.tree, options.paths, options.force, info.path
        )

    job = _Job(plan, options.dry_run, f"before revert {options.start.id[:LABEL_ID_DIGITS]}..{options.end.id[:LABEL_ID_DIGITS]}")
    return await _with_safety(worktree, info, job)


@dataclass(frozen=True)
class _Job:
    """One restore or revert: how to plan it, whether only to plan, the safety checkpoint's label.

    With ``report_kept`` (a restore of ``paths``), the outcome lists in
    ``kept`` what it left in place.
    """

    plan: PlanMaker
    dry_run: bool
    label: str
    report_kept: bool = False
    paths: list[str] | None = None
    target_tree: str | None = None  # a restore's: files its rules ignore are not deleted


async def _with_safety(worktree: LockedWorktree, info: WorktreeInfo, job: _Job) -> RestoreOutcome:
    """Capture, plan, record the safety checkpoint and apply.

    The safety checkpoint must hold what is on disk now at every path the
    plan touches: a warm capture that does not (the watcher missed a
    change, or a failed capture left it behind) is replaced by an exact
    one before anything is recorded. A capture or record that fails
    changes nothing and says so.
    """
    exact = False
    while True:
        try:
            current = await worktree.capture(exact)
        except (SnapshotdError, OSError, pygit2.GitError) as exc:
            if job.dry_run:  # it needs no safety checkpoint: the capture's own error says it all
                raise (exc if isinstance(exc, SnapshotdError) else filesystem_error(exc, info.store_dir, "capture the worktree into")) from exc
            raise no_safety(exc, info.store_dir) from exc
        leftovers: list[Callable[[], None]] = []
        try:
            outcome = await trio.to_thread.run_sync(
                _plan_and_apply, worktree, info, current, job, exact, leftovers.append, limiter=thread_limiter
            )
        finally:
            for cleanup in leftovers:
                await worktree.later(cleanup)
        if outcome is not None:
            return outcome
        worktree.recaptured()
        exact = True


def _plan_and_apply(
    worktree: LockedWorktree,
    info: WorktreeInfo,
    current: CaptureResult,
    job: _Job,
    exact: bool,
    defer: Callable[[Callable[[], None]], None],
) -> RestoreOutcome | None:
    """One attempt on a worker thread; None when the capture was warm and not current.

    ``defer`` is handed the removal of what a finished apply leaves (:func:`prepared_plan`)."""
    with worktree.store() as repo:
        plan = job.plan(repo, current.tree)
        spared = _ignored_there(info, repo, job, plan)
        if spared:
            plan = replace(plan, deletes=[path for path in plan.deletes if path not in spared])
        outcome = RestoreOutcome.of_plan(plan, dry_run=job.dry_run)
        unveiled: list[dict[str, str]] = []
        if not job.dry_run and (plan.writes or plan.deletes):
            touched = [p for p, _ in plan.writes] + list(plan.deletes)
            ignored = _ignored_files(info, touched) if job.report_kept else None
            # Validation and content (line endings, filters) are ready before the
            # safety checkpoint is recorded, so a plan that cannot be applied
            # fails without leaving anything behind.
            with prepared_plan(
                repo,
                info.path,
                plan,
                os.path.join(info.state_dir, "journal"),
                GitCheckout(git_dir=info.git_dir or info.store_dir, tree=current.tree, config=git_config(info)),
                defer,
            ) as prepared:
                if not exact and prepared.stale(_fence(info)):
                    return None
                try:
                    safety = worktree.record(repo, current.tree, job.label)
                except (OSError, pygit2.GitError) as exc:
                    raise no_safety(exc, info.store_dir) from exc
                try:
                    outcome = replace(prepared.apply(), safety_checkpoint=safety)
                finally:
                    _forget(worktree, touched)
            if ignored is not None:
                unveiled = ignored.no_longer_ignored()
        if not job.report_kept:
            return outcome
        conflicted = {c["path"] for c in outcome.conflicts}
        there = [{"path": path, "reason": kept_mod.REASON_IGNORED_THERE} for path in sorted(spared)]
        found = kept_mod.left_out(current.stats.skipped, job.paths) + unveiled + there
        return replace(outcome, kept=[item for item in found if item["path"] not in conflicted])


def _ignored_there(info: WorktreeInfo, repo: Repository, job: _Job, plan: Plan) -> set[str]:
    """The files a restore would delete that the restored checkpoint's rules ignore (:func:`kept.ignored_there`);
    asked only when the restore writes a ``.gitignore`` (else the rules are those that left them in the capture)."""
    if job.target_tree is None or not plan.deletes:
        return set()
    if not any(is_ignore_rules(path) for path, _ in plan.writes):
        return set()
    return kept_mod.ignored_there(repo, job.target_tree, plan.deletes, git_target(info), os.path.join(info.state_dir, "tmp"))


def _fence(info: WorktreeInfo) -> int | None:
    """The racy-timestamp fence, taken in the worktree's private folder; None where it cannot be written (then the
    plan's files are all read again before they are replaced)."""
    try:
        return make_fence(os.path.join(info.state_dir, "tmp"))
    except OSError:
        return None


def _forget(worktree: LockedWorktree, paths: Iterable[str]) -> None:
    """Drop every touched path from the capture's cache, whatever the apply did to it."""
    for path in paths:
        worktree.forget(path)


def _ignored_files(info: WorktreeInfo, touched: list[str]) -> kept_mod.IgnoredFiles:
    """The ignored files a plan touching ``touched`` may unveil, listed before it is applied."""
    index = None if info.git_dir else kept_mod.empty_index_path(os.path.join(info.state_dir, "tmp"))
    return kept_mod.IgnoredFiles(git_target(info), index, touched)
