"""Subscriptions: a client's interest in a worktree's changes, sent as debounced ``changed`` notifications.

The registry hands every batch the watchers see to :meth:`Subscriptions.changed`;
each subscription collects paths (up to a cap, then only ``overflow``) and
its own task sends them after a short debounce, on the connection that asked.
A subscription made with ``checkpoints`` also hears of every checkpoint the
daemon records in the worktree (:meth:`Subscriptions.recorded`), one
``checkpoint`` notification each, so a timeline can show it as it lands: the
store's refs live in the git folder, whose changes are never reported.
One connection holds at most :data:`MAX_PER_CONNECTION` subscriptions: each
costs a task and its pending set, so a client cannot grow the daemon without
bound by subscribing in a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from snapshotd.errors import NotFound, TooLarge, Unsupported

NOTIFY_DEBOUNCE_S = 0.05
NOTIFY_MAX_PATHS = 1000
NOTIFY_MAX_CHECKPOINTS = 100
"""Checkpoints one subscription holds unsent; past it they are dropped and ``changed`` says ``overflow``."""
MAX_PER_CONNECTION = 1000


@dataclass
class Subscription:
    """One client's interest in a worktree's changes."""

    id: str
    worktree: str
    session: Any
    checkpoints: bool = False
    pending: set[str] = field(default_factory=set)
    touched: bool = False  # changed() was called since the last send
    overflow: bool = False
    recorded: list[dict[str, Any]] = field(default_factory=list)
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
        self.on_recorded: list[Callable[[str], None]] = []  # told the worktree id of every checkpoint recorded

    def changed(self, worktree_id: str, paths: set[str], overflow: bool) -> None:
        """Hand a batch of changed paths to every subscription of the worktree."""
        for subscription in self.by_worktree.get(worktree_id, {}).values():
            if len(subscription.pending) + len(paths) > NOTIFY_MAX_PATHS:
                subscription.overflow = True
            else:
                subscription.pending |= paths
            subscription.overflow |= overflow
            subscription.touched = True
            subscription.wake.set()

    def recorded(self, worktree_id: str, checkpoint: dict[str, Any]) -> None:
        """Hand a checkpoint just recorded (its wire form) to the worktree's subscriptions that asked for them."""
        for listener in self.on_recorded:
            listener(worktree_id)
        for subscription in self.by_worktree.get(worktree_id, {}).values():
            if not subscription.checkpoints:
                continue
            if len(subscription.recorded) >= NOTIFY_MAX_CHECKPOINTS:
                subscription.overflow = subscription.touched = True
            else:
                subscription.recorded.append(checkpoint)
            subscription.wake.set()

    def with_safety_told(self, worktree_id: str, result: dict[str, Any]) -> dict[str, Any]:
        """A restore's or revert's ``result``, its safety checkpoint (if any) handed to :meth:`recorded` first."""
        if result.get("safety_checkpoint"):
            self.recorded(worktree_id, result["safety_checkpoint"])
        return result

    def subscribe(
        self, worktree_id: str, session: Any, nursery: trio.Nursery, *, checkpoints: bool = False
    ) -> Subscription:
        """A new subscription to the worktree's changes (and checkpoints), sent on ``session`` by a task in ``nursery``."""
        held = self._per_session.get(id(session), 0)
        if held >= MAX_PER_CONNECTION:
            raise TooLarge(
                f"This connection already holds {held} subscriptions, the most one connection may; "
                "unsubscribe from some first."
            )
        self._per_session[id(session)] = held + 1
        subscription = Subscription(
            id=f"sub_{next(self._ids)}", worktree=worktree_id, session=session, checkpoints=checkpoints
        )
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
                self._release(subscription)  # its place is free now, not when its task next runs
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
        Checkpoints go after the paths gathered with them, oldest first.
        """
        with subscription.cancel:
            try:
                while True:
                    await subscription.wake.wait()
                    await trio.sleep(NOTIFY_DEBOUNCE_S)
                    subscription.wake = trio.Event()
                    paths, overflow = sorted(subscription.pending), subscription.overflow
                    touched, recorded = subscription.touched, subscription.recorded
                    subscription.pending, subscription.overflow = set(), False
                    subscription.touched, subscription.recorded = False, []
                    head = {"subscription": subscription.id, "worktree": subscription.worktree}
                    fallback = {**head, "paths": [], "overflow": True, "dropped": True}
                    sent = not touched or await subscription.session.notify(
                        "changed", {**head, "paths": paths, "overflow": overflow}, fallback=fallback
                    )
                    for checkpoint in recorded:
                        if not sent:
                            break
                        sent = await subscription.session.notify(
                            "checkpoint", {**head, "checkpoint": checkpoint},
                            fallback=fallback, fallback_method="changed",
                        )
                    if not sent:
                        break
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        self._release(subscription)

    def _release(self, subscription: Subscription) -> None:
        """Forget the subscription and give its connection's place back (once, however often called)."""
        subscriptions = self.by_worktree.get(subscription.worktree, {})
        if subscriptions.pop(subscription.id, None) is None:
            return
        if not subscriptions:
            self.by_worktree.pop(subscription.worktree, None)
        held = self._per_session.pop(id(subscription.session), 1) - 1
        if held:
            self._per_session[id(subscription.session)] = held
