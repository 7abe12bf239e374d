"""Recording the checkpoints of one captured tree: one open store and one read of HEAD for all of them."""

from __future__ import annotations

from snapshotd.capture.resident import Resident
from snapshotd.engine.batch import Ticket
from snapshotd.engine.disk import disk_refusals
from snapshotd.engine.registry import worktree_head
from snapshotd.git.repository import Repository, repository
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.identity import WorktreeInfo


def record_many(
    info: WorktreeInfo, tickets: list[Ticket], tree: str, *, resident: Resident | None = None
) -> list[Checkpoint | Exception]:
    """One checkpoint of ``tree`` per ticket (its session, label and agent ids), in order; blocking, on a worker thread.

    ``resident`` is the worktree's open store and HEAD (the caller holds the
    worktree's lock); without one, or for a store git works, both are opened
    here. A ticket refused (a full disk, a ref that cannot be written) gets its
    exception, in the sentence a single checkpoint would give; the others go on.
    """
    requests = [(t.options.session, t.options.label, t.options.agent) for t in tickets]
    with (
        disk_refusals(info.store_dir, "save the checkpoint in"),
        resident.opened(info) if resident is not None else repository(info.store_dir) as repo,
    ):
        store, base = _on_head(info, repo, resident)
        outcomes = store.record_many(worktree_id=info.id, requests=requests, tree=tree, base=base)
    out: list[Checkpoint | Exception] = []
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            try:
                with disk_refusals(info.store_dir, "save the checkpoint in"):
                    raise outcome
            except Exception as exc:  # the sentence a single checkpoint would give
                outcome = exc
        out.append(outcome)
    return out

def record_one(
    info: WorktreeInfo, session: str | None, label: str | None, tree: str, repo: Repository,
    *, resident: Resident | None = None,
) -> Checkpoint:
    """Record ``tree`` as a checkpoint of the worktree on its HEAD, in the store ``repo`` the caller has open
    (``resident``'s, when the caller holds the worktree's lock: :func:`_on_head`)."""
    store, base = _on_head(info, repo, resident)
    return store.record(worktree_id=info.id, session=session, label=label, tree=tree, base=base)


def _on_head(info: WorktreeInfo, repo: Repository, resident: Resident | None) -> tuple[Store, str | None]:
    """``repo`` as the checkpoints' store, and HEAD's commit they go on: through ``resident`` when ``repo`` is its
    store (HEAD read there, the sessions' heads kept from the last record), else read anew."""
    if resident is not None and repo is resident.store(info):
        base, _ = resident.head(info)
        return Store(repo, resident.heads), base
    base, _ = worktree_head(info)
    return Store(repo), base
