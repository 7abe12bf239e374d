"""How long a worktree's first requests wait for its first walk, so that their full scan is watched.

A full scan made before the worktree is watched cannot become its warm state:
the next capture scans again. At a fleet's start (25 worktrees of 100,000
files, their first walks taking turns: :mod:`.watchsupply`) those second scans
doubled the work everyone waited behind. So where a scan is dear, a request
waits for its walk's turn as well as for the walk; where it is cheap, a request
waits only a little, then scans unwatched, without waiting behind the dear scans
either (docs/architecture.md, "A fleet's start").
"""

from __future__ import annotations

import os

from snapshotd.capture.watch import Watcher
from snapshotd.store.identity import WorktreeInfo

WATCH_START_TIMEOUT_S = 5.0  # the walk's own time; a longer one leaves the request to a full scan unwatched
WATCH_QUEUE_WAIT_S = 30.0  # what a dear scan's request waits for the walk's turn (25 first walks of 100,000 files: 15 s)
WATCH_TURN_GRACE_S = 0.5  # a walk whose turn has not come by then waits behind others: a cheap scan goes first
DEAR_INDEX_BYTES = 1 << 20  # a user's index this big (about 12,000 files) makes a full scan dear


def scan_is_dear(info: WorktreeInfo) -> bool:
    """Whether a full scan of the worktree costs enough to wait for its walk's turn and take turns with the other
    dear ones (:func:`snapshotd.threads.full_scan_turn`): by its index's size; a plain folder's is not known."""
    if info.git_dir is None:
        return True
    try:
        return os.stat(os.path.join(info.git_dir, "index")).st_size >= DEAR_INDEX_BYTES
    except OSError:
        return False


async def wait_for_walk(watcher: Watcher, *, dear: bool) -> bool:
    """Wait for the worktree's first walk, :data:`WATCH_START_TIMEOUT_S` once its turn came: for that turn too
    where its scan is ``dear`` (:func:`scan_is_dear`, a checkpoint's: a read needs no watch), else only if it
    comes at once. True when the watch is live."""
    return await watcher.wait_started(WATCH_START_TIMEOUT_S, WATCH_QUEUE_WAIT_S if dear else WATCH_TURN_GRACE_S)
