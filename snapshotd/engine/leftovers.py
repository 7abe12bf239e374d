"""A restore another process left unfinished in a worktree the daemon already has open, recovered before a capture.

The registry recovers a worktree's journal when it first opens it. A
restore run by another process (``--embedded``, a second daemon) that dies
midway later leaves its temporary names in the worktree, and a capture
would record them. So before each capture the journal folder is listed (one
small folder, usually empty); when it holds something new, recovery runs on a
worker thread. It passes over a journal whose writer lives (it holds its
lock), this daemon's own restores included. What recovery leaves (a journal
it cannot read) is remembered, so it is not retried at every capture.
"""

from __future__ import annotations

import os

import trio

from snapshotd.restore.journal import recover
from snapshotd.store.identity import WorktreeInfo
from snapshotd.threads import thread_limiter


class Leftovers:
    """Per worktree id, the journal folder's names recovery last left."""

    def __init__(self) -> None:
        self._left: dict[str, frozenset[str]] = {}

    async def recover(self, info: WorktreeInfo) -> None:
        """Recover what a dead writer left in ``info``'s journal folder, if anything new is there."""
        journal_dir = os.path.join(info.state_dir, "journal")
        names = _names(journal_dir)
        if not names or names == self._left.get(info.id):
            return
        await trio.to_thread.run_sync(recover, journal_dir, info.path, limiter=thread_limiter)
        self._left[info.id] = await trio.to_thread.run_sync(_names, journal_dir, limiter=thread_limiter)


def _names(journal_dir: str) -> frozenset[str]:
    try:
        return frozenset(os.listdir(journal_dir))
    except OSError:  # none yet, or not a folder: recovery's own checks say what it is
        return frozenset()
