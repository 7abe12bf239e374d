"""Checkpoints of one worktree that wait for its lock share one capture (group commit).

Agent servers run many sessions in one worktree; each asks for a checkpoint
at every turn. Taken one by one behind the worktree's lock, they queue: the
tenth waits for nine captures. Here every request first joins the worktree's
queue, then waits for the lock in its turn. Whoever gets the lock takes every
request queued so far, captures once and records one checkpoint per request
(in arrival order, each on its own session's ref), in one worker-thread call.
The capture starts after every request it serves had arrived, so each
checkpoint holds every write that finished before its request, as one capture
per request would. The requests it served find their answer when their turn
at the lock comes, and leave at once.

A capture that fails is the failure of the request that ran it only: the
others it had taken go back to the queue, and the next one to get the lock
captures for them. An exact capture is never shared (it asks for a full scan
of its own).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from snapshotd.capture.checkpoint import CheckpointOptions, CheckpointResult
from snapshotd.capture.state import CaptureResult, CaptureStats, Then
from snapshotd.store.checkpoints import Checkpoint

Capture = Callable[[bool, Then], Awaitable[CaptureResult]]  # its arguments: exact, and the record to run with its tree
RecordMany = Callable[["list[Ticket]", str], "list[Checkpoint | Exception]"]
RunSync = Callable[..., Awaitable[Any]]
OnRefused = Callable[[Exception], Awaitable[None]]


@dataclass(eq=False)
class Ticket:
    """One request in a worktree's queue: what it asked for and, once served, its checkpoint or its error."""

    options: CheckpointOptions
    started: float = field(default_factory=time.perf_counter)  # when the request began (before its worktree was found)
    joined: float = field(default_factory=time.perf_counter)  # when it joined the worktree's queue
    result: CheckpointResult | None = None
    error: Exception | None = None

    @property
    def served(self) -> bool:
        return self.result is not None or self.error is not None


async def take_checkpoint(
    lock: trio.Lock,
    queue: list[Ticket],
    options: CheckpointOptions,
    capture: Capture,
    record_many: RecordMany,
    run_sync: RunSync,
    on_refused: OnRefused,
    started: float | None = None,
) -> CheckpointResult:
    """A checkpoint of the worktree whose ``lock`` and ``queue`` these are; shared with the queue unless exact.

    ``capture`` takes the tree (the caller holds the lock) and runs the record
    it is handed on its own worker thread when it can (a warm capture), saving
    a hand-off; ``record_many`` records one checkpoint per ticket, blocking
    (else on a worker thread through ``run_sync``), and returns, per ticket,
    its checkpoint or the exception that refused it;
    ``on_refused`` hears such an exception before it is raised (it may raise
    another, e.g. the worktree was deleted meanwhile). ``started``: when the
    request began, if before now (its worktree was found first: ``resolve``).
    """
    ticket = Ticket(options)
    if started is not None:
        ticket.started = started
    if options.exact:
        async with lock:
            await _serve([ticket], capture, record_many, run_sync, exact=True)
    else:
        queue.append(ticket)
        try:
            async with lock:
                if not ticket.served:
                    await _serve(queue, capture, record_many, run_sync, exact=False)
        finally:
            if ticket in queue:  # cancelled while waiting, or its capture failed: nobody records for it now
                queue.remove(ticket)
    if ticket.error is not None:
        await on_refused(ticket.error)
        raise ticket.error
    assert ticket.result is not None
    return ticket.result


async def _serve(
    queue: list[Ticket], capture: Capture, record_many: RecordMany, run_sync: RunSync, *, exact: bool
) -> None:
    """Capture once for every queued ticket (the caller holds the lock and its own ticket is queued)."""
    taken, queue[:] = list(queue), []
    began = time.perf_counter()
    record_began: list[float] = []
    recorded: list[list[Checkpoint | Exception]] = []

    def record(tree: str) -> None:  # on the warm capture's worker thread, else on a thread of its own
        record_began.append(time.perf_counter())
        try:
            recorded.append(record_many(taken, tree))
        except Exception as exc:  # the store refused them all (its git dir deleted meanwhile, say)
            recorded.append([exc] * len(taken))

    stats = CaptureStats()
    try:
        result = await capture(exact, record)
        stats = result.stats
        if not recorded:
            await run_sync(record, result.tree)
    except BaseException:
        if not recorded:  # the next holder of the lock serves them; the caller's own ticket raises
            queue[:0] = taken
            raise
        _answer(taken, recorded[0], stats, began, record_began[0])  # recorded once: answered, never recorded again
        raise
    _answer(taken, recorded[0], stats, began, record_began[0])


def _answer(
    taken: list[Ticket], outcomes: list[Checkpoint | Exception], stats: CaptureStats, began: float, captured: float
) -> None:
    """Give each ticket its checkpoint or its error, with the time it waited, captured and recorded."""
    recorded = time.perf_counter()
    shared = len(taken) > 1
    for ticket, outcome in zip(taken, outcomes, strict=True):
        if isinstance(outcome, Exception):
            ticket.error = outcome
        else:
            phases = {
                "resolve": (ticket.joined - ticket.started) * 1000,
                "queued": (began - ticket.joined) * 1000,
                **stats.phases,  # a warm capture's waits: for its watcher's sync, for a thread
                "capture": (captured - began) * 1000 - sum(stats.phases.values()),
                "record": (recorded - captured) * 1000,
            }
            ms = (recorded - ticket.started) * 1000
            ticket.result = CheckpointResult(outcome, replace(stats, ms=ms, shared=shared, phases=phases))
