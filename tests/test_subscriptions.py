"""Subscriptions (engine/subscriptions.py) on their own: batching, the path cap, a full connection, ending."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from snapshotd.engine.subscriptions import (
    MAX_PER_CONNECTION,
    NOTIFY_MAX_CHECKPOINTS,
    NOTIFY_MAX_PATHS,
    Subscriptions,
    require_connection,
)
from snapshotd.errors import NotFound, TooLarge, Unsupported


class Connection:
    """The receiving end: records each notification; ``room`` says how many more it takes."""

    def __init__(self, room: int = 1000) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.room = room
        self.closers: list[Any] = []

    async def notify(
        self, method: str, params: dict[str, Any], *, fallback: dict[str, Any], fallback_method: str | None = None
    ) -> bool:
        if self.room == 0:
            self.sent.append((fallback_method or method, fallback))
            return False
        self.room -= 1
        self.sent.append((method, params))
        return True

    def on_close(self, callback: Any) -> None:
        self.closers.append(callback)


async def settle(*connections: Connection) -> None:
    """Past the debounce: 0.2 s, and with ``connections``, until none has been sent anything for 0.3 s (at most
    10 s), so that a loaded machine's late sends are waited for, not taken for none."""
    await trio.sleep(0.2)
    quiet_since, seen = trio.current_time(), -1
    with trio.move_on_after(10):
        while connections:
            count = sum(len(connection.sent) for connection in connections)
            if count != seen:
                quiet_since, seen = trio.current_time(), count
            elif trio.current_time() - quiet_since >= 0.3:
                return
            await trio.sleep(0.05)


async def test_changes_are_batched_per_worktree_and_sent_sorted() -> None:
    hub = Subscriptions()
    ours, other = Connection(), Connection()
    async with trio.open_nursery() as nursery:
        sub = hub.subscribe("wt_a", ours, nursery)
        hub.subscribe("wt_b", other, nursery)
        hub.changed("wt_a", {"b.txt"}, False)
        hub.changed("wt_a", {"a.txt"}, False)
        await settle(ours, other)
        assert ours.sent == [
            ("changed", {"subscription": sub.id, "worktree": "wt_a", "paths": ["a.txt", "b.txt"], "overflow": False})
        ]
        assert other.sent == []
        hub.close()
    assert hub.by_worktree == {}


async def test_past_the_path_cap_only_overflow_is_sent() -> None:
    hub = Subscriptions()
    conn = Connection()
    async with trio.open_nursery() as nursery:
        hub.subscribe("wt_a", conn, nursery)
        hub.changed("wt_a", {f"f{i}" for i in range(NOTIFY_MAX_PATHS + 1)}, False)
        await settle(conn)
        hub.close()
    (_, params), = conn.sent
    assert params["overflow"] is True and params["paths"] == []


async def test_a_full_connection_gets_one_dropped_notice_and_the_subscription_ends() -> None:
    hub = Subscriptions()
    conn = Connection(room=0)
    async with trio.open_nursery() as nursery:
        sub = hub.subscribe("wt_a", conn, nursery)
        hub.changed("wt_a", {"a.txt"}, False)
        await settle(conn)
        hub.changed("wt_a", {"b.txt"}, False)
        await settle(conn)
    assert conn.sent == [
        ("changed", {"subscription": sub.id, "worktree": "wt_a", "paths": [], "overflow": True, "dropped": True})
    ]
    assert hub.by_worktree == {}


async def test_unsubscribe_ends_it_and_an_unknown_id_is_not_found() -> None:
    hub = Subscriptions()
    conn = Connection()
    async with trio.open_nursery() as nursery:
        sub = hub.subscribe("wt_a", conn, nursery)
        hub.unsubscribe(sub.id)
        await settle(conn)
        assert hub.by_worktree == {}
        with pytest.raises(NotFound):
            hub.unsubscribe(sub.id)
        hub.changed("wt_a", {"a.txt"}, False)
        await settle(conn)
    assert conn.sent == []


def test_only_a_daemon_connection_can_subscribe() -> None:
    with pytest.raises(Unsupported):
        require_connection(None, None)
    with pytest.raises(Unsupported):
        require_connection(Connection(), None)


async def test_one_connection_holds_at_most_the_cap_and_an_ended_one_frees_its_place() -> None:
    hub = Subscriptions()
    greedy, other = Connection(), Connection()
    async with trio.open_nursery() as nursery:
        held = [hub.subscribe("wt_a", greedy, nursery) for _ in range(MAX_PER_CONNECTION)]
        with pytest.raises(TooLarge, match="unsubscribe"):
            hub.subscribe("wt_a", greedy, nursery)
        assert len(hub.by_worktree["wt_a"]) == MAX_PER_CONNECTION
        hub.subscribe("wt_a", other, nursery)  # the cap is per connection
        hub.unsubscribe(held[0].id)  # the place is free at once, however busy the loop is
        hub.subscribe("wt_b", greedy, nursery)
        with pytest.raises(TooLarge):
            hub.subscribe("wt_b", greedy, nursery)
        hub.close()
    assert hub.by_worktree == {}


async def test_checkpoints_go_only_to_subscriptions_that_asked_after_their_paths() -> None:
    hub = Subscriptions()
    asked, plain = Connection(), Connection()
    async with trio.open_nursery() as nursery:
        sub = hub.subscribe("wt_a", asked, nursery, checkpoints=True)
        hub.subscribe("wt_a", plain, nursery)
        hub.changed("wt_a", {"a.txt"}, False)
        hub.recorded("wt_a", {"id": "c1"})
        hub.with_safety_told("wt_a", {"safety_checkpoint": {"id": "c2"}, "written": []})
        hub.with_safety_told("wt_a", {"safety_checkpoint": None})
        await settle(asked, plain)
        hub.close()
    head = {"subscription": sub.id, "worktree": "wt_a"}
    assert asked.sent == [
        ("changed", {**head, "paths": ["a.txt"], "overflow": False}),
        ("checkpoint", {**head, "checkpoint": {"id": "c1"}}),
        ("checkpoint", {**head, "checkpoint": {"id": "c2"}}),
    ]
    assert [method for method, _ in plain.sent] == ["changed"]


async def test_past_the_checkpoint_cap_changed_says_overflow() -> None:
    hub = Subscriptions()
    conn = Connection()
    async with trio.open_nursery() as nursery:
        hub.subscribe("wt_a", conn, nursery, checkpoints=True)
        for number in range(NOTIFY_MAX_CHECKPOINTS + 5):
            hub.recorded("wt_a", {"id": f"c{number}"})
        await settle(conn)
        hub.close()
    assert conn.sent[0][0] == "changed" and conn.sent[0][1]["overflow"] is True
    assert len(conn.sent) == 1 + NOTIFY_MAX_CHECKPOINTS
