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


def test_a_worktree_given_up_at_the_limit_waits_for_room_for_more_than_its_last_walk_held(monkeypatch):
    """Watches given back that leave no room for more than the worktree's last walk held wake nothing (a
    small worktree deleted); room for more does, and so does the longest back-off, which forgets the need."""
    limit = ["3200"]
    monkeypatch.setattr(watchsupply, "limit_value", lambda name: limit[0])
    supply = WatchSupply()
    monkeypatch.setattr(watchsupply, "supply", supply)
    watched, small, tiny = Holder(2000), Holder(40), Holder(10)
    for holder in (watched, small, tiny):
        supply.join(holder)
    retry = watchsupply.WatchRetry()
    retry.failed(True, at_limit=True, need=1070)  # its walk held 1,070 folders when the room (1,050) ran out
    assert not retry.due() and retry.need() == 1070
    supply.leave(tiny, served=True)
    assert not retry.due()  # given back, but the room is 3200 - 100 - 2040 = 1,060
    supply.leave(small, served=True)
    assert retry.due()  # 1,100
    limit[0] = "3000"  # lowered: 3000 - 93 - 2000 = 907
    assert not retry.due()
    retry.at = 0.0  # the longest back-off passed: one walk tells whether the worktree shrank
    assert retry.due() and retry.need() == 0
