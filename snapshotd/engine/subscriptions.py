"""Subscriptions: a client's interest in a worktree's changes, sent as debounced ``changed`` notifications.

The registry hands every batch the watchers see to :meth:`Subscriptions.changed`;
each subscription collects paths (up to a cap, then only ``overflow``) and
its own task sends them after a short debounce, on the connection that asked.
One connection holds at most :data:`MAX_PER_CONNECTION` subscriptions: each
costs a task and its pending set, so a client cannot grow the daemon without
bound by subscribing in a loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from snapshotd.errors import NotFound, TooLarge, Unsupported

NOTIFY_DEBOUNCE_S = 0.05
NOTIFY_MAX_PATHS = 1000
MAX_PER_CONNECTION = 1000


@dataclass
class Subscription:
    """One client's interest in a worktree's changes."""

    id: str
    worktree: str
    session: Any
    pending: set[str] = field(default_factory=set)
    overflow: bool = False
    wake: trio.Event = field(default_factory=trio.Event)
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)


def require_connection(session: Any, nursery: trio.Nursery | None) -> trio.Nursery:
    """The nursery notifications are sent from; only a daemon's connection can receive them."""
    if session is None or nursery is None:
        raise Unsupported("subscribe needs the daemon: notifications are sent on a connection.")
    return nursery


class Subscriptions:
    """Every live subscription of one engine, by worktree id and by subscription id."""

    def __init__(self) -> None:
        self.by_worktree: dict[str, dict[str, Subscription]] = {}
        self._ids = iter(range(1, 1 << 62))
        self._per_session: dict[int, int] = {}  # id(session) -> its live subscriptions

    def changed(self, worktree_id: str, paths: set[str], overflow: bool) -> None:
        """Hand a batch of changed paths to every subscription of the worktree."""
        for subscription in self.by_worktree.get(worktree_id, {}).values():
            if len(subscription.pending) + len(paths) > NOTIFY_MAX_PATHS:
                subscription.overflow = True
            else:
                subscription.pending |= paths
            subscription.overflow |= overflow
            subscription.wake.set()

    def subscribe(self, worktree_id: str, session: Any, nursery: trio.Nursery) -> Subscription:
        """A new subscription to the worktree's changes, sent on ``session`` by a task in ``nursery``."""
        held = self._per_session.get(id(session), 0)
        if held >= MAX_PER_CONNECTION:
            raise TooLarge(
                f"This connection already holds {held} subscriptions, the most one connection may; "
                "unsubscribe from some first."
            )
        self._per_session[id(session)] = held + 1
        subscription = Subscription(id=f"sub_{next(self._ids)}", worktree=worktree_id, session=session)
        self.by_worktree.setdefault(worktree_id, {})[subscription.id] = subscription
        session.on_close(subscription.cancel.cancel)
        nursery.start_soon(self._notify_loop, subscription)
        return subscription

    def unsubscribe(self, subscription_id: str | None) -> None:
        """End the subscription with this id."""
        for subscriptions in self.by_worktree.values():
            subscription = subscriptions.get(subscription_id or "")
            if subscription is not None:
                subscription.cancel.cancel()
                return
        raise NotFound(f"No subscription {subscription_id} exists.")

    def close(self) -> None:
        """End every subscription."""
        for subscriptions in self.by_worktree.values():
            for subscription in subscriptions.values():
                subscription.cancel.cancel()

    async def _notify_loop(self, subscription: Subscription) -> None:
        """Send the subscription's changes, debounced, until it ends.

        A subscriber too far behind (its connection's notification budget is
        full) is not buffered for: it gets one last ``changed`` with
        ``overflow`` and ``dropped`` true and no paths, and the subscription ends.
        """
        with subscription.cancel:
            try:
                while True:
                    await subscription.wake.wait()
                    await trio.sleep(NOTIFY_DEBOUNCE_S)
                    subscription.wake = trio.Event()
                    paths, overflow = sorted(subscription.pending), subscription.overflow
                    subscription.pending, subscription.overflow = set(), False
                    head = {"subscription": subscription.id, "worktree": subscription.worktree}
                    sent = await subscription.session.notify(
                        "changed",
                        {**head, "paths": paths, "overflow": overflow},
                        fallback={**head, "paths": [], "overflow": True, "dropped": True},
                    )
                    if not sent:
                        break
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        held = self._per_session.pop(id(subscription.session), 1) - 1
        if held:
            self._per_session[id(subscription.session)] = held
        subscriptions = self.by_worktree.get(subscription.worktree, {})
        subscriptions.pop(subscription.id, None)
        if not subscriptions:
            self.by_worktree.pop(subscription.worktree, None)
