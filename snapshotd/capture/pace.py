"""How often the idle reconciliation scans a worktree in full: spaced out while it finds nothing, and a share of
the time for all worktrees together.

The reconciliation (capture/worktree.py) compares the warm tree with a full
scan once a worktree is quiet after warm captures: the check that the watcher
missed nothing (``watch_miss``, which has stayed 0). Run after every burst, it
cost a full scan per agent turn, which grows with the tree: an agent's turn a
pause apart cost 34 ms of CPU at 2,000 files and 161 ms at 20,000 with it, 14
and 34 ms paced (``bench.request_cost --idle-turns``), and 250 worktrees of a
big repository would spend the daemon's core on it. So a worktree's first
reconciliation comes at its first quiet moment, as before; after each that
finds nothing the next waits twice as long (:data:`FIRST_SPACING_S` up to
:data:`LONGEST_SPACING_S`), and one that finds a miss brings them back to
every quiet moment. Across the daemon, reconciliations take at most
:data:`SHARE` of the time: after one of ``d`` seconds the next, of any
worktree, waits ``d * (1 / SHARE - 1)``. ``verify`` and ``exact`` are asked
for and never wait here; a miss ``verify`` finds resets the spacing too.
"""

from __future__ import annotations

import time

FIRST_SPACING_S = 30.0  # after a first reconciliation that found nothing
LONGEST_SPACING_S = 600.0
SHARE = 0.1  # of the daemon's time, for every worktree's reconciliations together
LONGEST_PAUSE_S = 60.0  # the most one long reconciliation holds back the others


class FleetShare:
    """The daemon's reconciliations together: when the next may start."""

    def __init__(self) -> None:
        self.next_at = 0.0

    def spent(self, began: float, ended: float) -> None:
        pause = min((ended - began) * (1 / SHARE - 1), LONGEST_PAUSE_S)
        self.next_at = max(self.next_at, ended + pause)


fleet = FleetShare()


class ReconcilePace:
    """One worktree's reconciliations: the spacing that doubles while they find nothing."""

    def __init__(self) -> None:
        self.spacing = 0.0
        self.last = float("-inf")

    def due(self) -> bool:
        """Whether a reconciliation may run now (the worktree's spacing and the daemon's share allow it)."""
        now = time.monotonic()
        return now - self.last >= self.spacing and now >= fleet.next_at

    def done(self, began: float, missed: bool) -> None:
        """A reconciliation begun at ``began`` (monotonic) ended now; ``missed``: it found a watch miss."""
        ended = time.monotonic()
        self.last = ended
        self.spacing = 0.0 if missed else min(LONGEST_SPACING_S, max(FIRST_SPACING_S, 2 * self.spacing))
        fleet.spent(began, ended)

    def verified(self, *, missed: bool) -> None:
        """``verify`` ran: a miss it found brings the reconciliation back at every quiet moment."""
        if missed:
            self.spacing = 0.0
