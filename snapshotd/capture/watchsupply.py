"""The user's inotify watches: one supply for every worktree the daemon watches.

The kernel gives a user a fixed number of watches (``fs.inotify.max_user_watches``),
and a worktree is watched whole or not at all. Left to themselves, the first
walks of 25 big worktrees run at once, reach the limit together and nearly all
give up, though most would have fitted; each then walks again on a timer, and a
walk that takes the last watches makes the next new folder of a watched
worktree fail, which ends that watch too. So here:

- whole walks take turns, one at a time, so the limit fills one worktree after
  another (two at a time, both walks near the limit could give up where one fitted:
  each still counts the other's watches until its end is handled);
- a whole walk stops short of the limit by a reserve, kept for the new folders
  of the worktrees already watched (a walk of new folders may use it); the
  room left is looked at again every few folders, as walks of new folders take some;
- a worktree given up at the limit walks again only once watches were given
  back (a watch ended, or the limit was raised) and the room left is more than
  its last walk held when it stopped, or after the longest back-off. The room is
  looked at again once the walk's turn comes: several worktrees woken by one
  release would otherwise walk in turn, and all but the first give up again.

Watches other processes of the user hold are not counted (reading every
process's ``fdinfo`` is not cheap); the kernel's refusal still ends a walk there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import trio

from snapshotd.capture.inotify import WATCHES_SYSCTL, limit_value, watch_limit_reached

RETRY_FIRST_S = 5.0  # a failed watch is tried again after this, doubling up to RETRY_MAX_S
RETRY_MAX_S = 300.0
RESERVE_SHARE = 32  # a 32nd of the limit stays for the watched worktrees' new folders
RESERVE_LEAST = 16
WALKS_AT_ONCE = 1


class Holder(Protocol):
    def held(self) -> int: ...


class WatchSupply:
    """Who holds the daemon's watches, whose whole walk goes next, and whether any were given back."""

    def __init__(self) -> None:
        self.walks = trio.CapacityLimiter(WALKS_AT_ONCE)  # whole walks
        self._holders: tuple[Holder, ...] = ()  # replaced, never changed: walks read it on their threads
        self._returned = 0  # watches ended that had served: theirs are free again

    def join(self, holder: Holder) -> None:
        self._holders = (*self._holders, holder)

    def leave(self, holder: Holder, *, served: bool) -> None:
        """``holder``'s inotify instance is closed. One that ``served`` (its first walk ended whole) gave
        watches back, even if the kernel had dropped them one by one before (its worktree deleted); a first
        walk given up gave back only what it had just taken."""
        self._holders = tuple(each for each in self._holders if each is not holder)
        self._returned += served

    def room(self, holder: Holder | None) -> Callable[[], int] | None:
        """How many folders a whole walk of ``holder`` (None: one not started) may watch now, asked as it goes
        (from any thread); None when the limit is unknown."""
        text = limit_value(WATCHES_SYSCTL)
        if not text.isdigit():
            return None
        limit = int(text)
        share = limit - max(RESERVE_LEAST, limit // RESERVE_SHARE)

        def now() -> int:
            return share - sum(each.held() for each in self._holders if each is not holder)

        return now

    def has_room(self, holder: Holder | None, need: int) -> bool:
        """Whether a whole walk of ``holder`` (None: one not started) has room now for more than ``need``
        folders (True when the limit is unknown)."""
        room = self.room(holder)
        return room is None or room() > need

    def fits(self, holder: Holder, need: int) -> None:
        """Raise the limit's error, before any walk, if a worktree that needs more than ``need`` folders
        (0: unknown) cannot fit in the room ``holder`` has now."""
        if need and not self.has_room(holder, need):
            raise watch_limit_reached(reserve=True, walked=False)

    def mark(self) -> tuple[int, str]:
        """What a walk given up at the limit waits to see change: watches given back, or the limit itself."""
        return self._returned, limit_value(WATCHES_SYSCTL)

    def changed_since(self, mark: tuple[int, str]) -> bool:
        return self.mark() != mark


supply = WatchSupply()
"""The daemon's one supply (watches are the user's, shared by all the worktrees)."""


class WatchRetry:
    """When a worktree whose watch failed is watched again: after a back-off that doubles, or, given up at the
    user's watch limit, once watches were given back since and its walk may fit (at the latest after the
    longest back-off)."""

    def __init__(self) -> None:
        self.at = 0.0
        self._backoff = 0.0
        self._mark: tuple[int, str] | None = None
        self._need = 0  # folders the worktree's last walk held when the limit stopped it: it needs more

    def failed(self, failure: bool, *, at_limit: bool, need: int = 0) -> None:
        """The watch ended: a ``failure``, or (False) an end that may be tried again at once; ``need`` is what
        a walk stopped at the limit held."""
        self._backoff = min(RETRY_MAX_S, self._backoff * 2 or RETRY_FIRST_S) if failure else 0.0
        self.at = time.monotonic() + self._backoff
        self._mark, self._need = None, 0
        if at_limit:
            self._mark, self._need, self.at = supply.mark(), need, time.monotonic() + RETRY_MAX_S

    def need(self) -> int:
        """What the next walk must fit more than (0 once the longest back-off passed: the worktree may have
        shrunk, and only a walk tells)."""
        return 0 if time.monotonic() >= self.at else self._need

    def due(self) -> bool:
        if time.monotonic() >= self.at:
            return True
        if self._mark is None or not supply.changed_since(self._mark):
            return False
        return supply.has_room(None, self._need)
