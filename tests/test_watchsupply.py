"""The watch supply's own rules: when watches count as given back, and the room a whole walk has."""

from __future__ import annotations

from snapshotd.capture import watchsupply
from snapshotd.capture.watchsupply import WatchSupply


class Holder:
    def __init__(self, held: int) -> None:
        self.count = held

    def held(self) -> int:
        return self.count


def test_a_watch_that_served_gives_watches_back_even_when_the_kernel_dropped_them_first():
    """A deleted worktree's watches go one by one (the kernel drops each folder's): its watcher ends
    holding none, yet the watches are free for a worktree waiting at the limit."""
    supply = WatchSupply()
    mark = supply.mark()
    deleted = Holder(0)
    supply.join(deleted)
    supply.leave(deleted, served=True)
    assert supply.changed_since(mark)


def test_a_first_walk_given_up_gives_nothing_back():
    """Two worktrees waiting at the limit must not wake each other with each failed walk."""
    supply = WatchSupply()
    failed = Holder(500)
    supply.join(failed)
    mark = supply.mark()
    supply.leave(failed, served=False)
    assert not supply.changed_since(mark)


def test_the_room_of_a_walk_is_the_limit_less_the_reserve_and_the_others_watches(monkeypatch):
    monkeypatch.setattr(watchsupply, "limit_value", lambda name: "3200")
    supply = WatchSupply()
    others, walking = Holder(1000), Holder(0)
    supply.join(others)
    supply.join(walking)
    room = supply.room(walking)
    assert room is not None and room() == 3200 - 100 - 1000  # the reserve is a 32nd of the limit
    others.count = 2000  # the other walk took more meanwhile: the room is asked again as the walk goes
    assert room() == 3200 - 100 - 2000
    supply.leave(others, served=True)
    assert room() == 3200 - 100
    monkeypatch.setattr(watchsupply, "limit_value", lambda name: "unknown")
    assert supply.room(walking) is None
