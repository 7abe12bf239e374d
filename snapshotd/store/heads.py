"""What the next checkpoint of a session needs from its head, kept from one record to the next.

A checkpoint is written on top of its session's head pin: its seq follows the
pin's ``Last-Seq``, its ``Previous`` is the pin's checkpoint, and it is
``changed`` when that checkpoint's tree differs. Reading them costs two commit
reads and a message parse per checkpoint; a worktree's open store keeps them
instead (:mod:`snapshotd.capture.resident`), per session ref, with the pin they
were read from or written as.

The ref stays the truth: an entry is used only while the ref still points at
its pin, read anew at each record (and the compare-and-swap of the ref checks
it once more under its lock). A ref another writer moved (an ``--embedded``
command, a second daemon, ``gc``, ``delete``, a fetch, ``git update-ref``)
names another pin, so the entry is passed over and the head read from git.
A pin's id names its content, so an entry that matches is never stale.
"""

from __future__ import annotations

from dataclasses import dataclass

from snapshotd.git.repository import ObjectId

MAX_SESSIONS = 512  # entries kept per open store; the oldest written is dropped first


@dataclass(frozen=True)
class Head:
    """A session's head pin, and what the next checkpoint on top of it needs."""

    pin: str  # the head pin's id
    last_seq: int  # the highest seq the session has given
    checkpoint: str | None  # the newest checkpoint's id; None for a floor (every checkpoint dropped)
    tree: str | None  # that checkpoint's tree


class HeadCache:
    """The heads of the sessions one open store recorded last, by ref name; used under the worktree's lock."""

    def __init__(self) -> None:
        self._heads: dict[str, Head] = {}
        self.empty_tree: ObjectId | None = None  # the empty tree, once written to this store (the pins' tree)

    def get(self, name: str, target: ObjectId | None) -> Head | None:
        """The entry of ``name`` if the ref still points at its pin (``target``, read just now)."""
        head = self._heads.get(name)
        if head is None or target is None or head.pin != str(target):
            return None
        return head

    def put(self, name: str, head: Head) -> None:
        """Remember ``head`` as the session's, once its ref points at it."""
        self._heads.pop(name, None)
        self._heads[name] = head
        while len(self._heads) > MAX_SESSIONS:
            del self._heads[next(iter(self._heads))]

    def __len__(self) -> int:
        return len(self._heads)
