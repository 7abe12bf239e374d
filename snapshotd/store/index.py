"""Each session's chain of pins read once and kept: liveness, seq and position in O(1).

The refs under ``refs/snapshotd/`` stay the truth. A session's entry remembers
the head pin it was read from; every use first reads the ref (one file) and,
when it moved, walks the new chain only down to the first pin it already
knows. A pin's id names its whole chain below it, so the rest is the known
list from that pin down: an appended checkpoint costs one pin read, a
rewrite costs the pins it wrote, and an entry for a ref another process
deleted or rewrote is never believed. A saved copy
(:mod:`snapshotd.store.indexfile`) spares a new process the first walk.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_left
from dataclasses import dataclass, field

from snapshotd.store.pins import Pin, SessionChains, read_pin


@dataclass
class SessionIndex:
    """One session's live checkpoints, oldest first, as read from the pin ``head``."""

    head: str | None = None
    pins: list[str] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    position: dict[str, int] = field(default_factory=dict)  # checkpoint id -> index in the lists
    pin_position: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.pins)

    def truncate(self, keep: int) -> None:
        """Forget every entry above the oldest ``keep`` (what a rewrite replaced)."""
        for index in range(keep, len(self.pins)):
            del self.position[self.checkpoints[index]]
            del self.pin_position[self.pins[index]]
        del self.pins[keep:], self.checkpoints[keep:], self.seqs[keep:]

    def append(self, pin: str, checkpoint: str, seq: int) -> None:
        self.position[checkpoint] = len(self.pins)
        self.pin_position[pin] = len(self.pins)
        self.pins.append(pin)
        self.checkpoints.append(checkpoint)
        self.seqs.append(seq)

    def newest(self, count: int | None) -> list[str]:
        """The ids of the newest ``count`` checkpoints (all when None), newest first."""
        start = 0 if count is None else max(0, len(self.checkpoints) - count)
        return self.checkpoints[start:][::-1]

    def at_seq(self, seq: int) -> str | None:
        index = bisect_left(self.seqs, seq)
        return self.checkpoints[index] if index < len(self.seqs) and self.seqs[index] == seq else None

    def pin_objects(self, start: int) -> list[Pin]:
        """Pins from ``start`` up, newest first, as :func:`read_pin` would give them (``last_seq`` = seq)."""
        out = []
        for index in range(len(self.pins) - 1, start - 1, -1):
            previous = self.pins[index - 1] if index > 0 else None
            out.append(Pin(self.pins[index], self.checkpoints[index], previous, self.seqs[index], self.seqs[index]))
        return out


class StoreIndex:
    """The session indexes of one store, shared by the threads of this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: dict[str, SessionIndex] = {}
        self.walked = 0  # pins read since the saved copy was written

    def refresh(self, chains: SessionChains, name: str) -> SessionIndex:
        """The session's entry made to match its ref now; call with :attr:`lock` held."""
        target = chains.ref_target(name)
        entry = self.sessions.setdefault(name, SessionIndex())
        head = None if target is None else str(target)
        if head == entry.head:
            return entry
        new: list[Pin] = []
        keep = 0
        pin = None if target is None else read_pin(chains.repo, target)
        while pin is not None and pin.checkpoint is not None:
            known = entry.pin_position.get(str(pin.id))
            if known is not None:
                keep = known + 1
                break
            new.append(pin)
            pin = None if pin.previous is None else read_pin(chains.repo, pin.previous)
        entry.truncate(keep)
        for each in reversed(new):
            entry.append(str(each.id), str(each.checkpoint), each.seq)
        entry.head = head
        self.walked += len(new)
        return entry


_INDEXES: dict[str, StoreIndex] = {}
_INDEXES_LOCK = threading.Lock()


def index_of(store_path: str) -> StoreIndex:
    """This process's index of the store at ``store_path`` (one per real path)."""
    key = os.path.realpath(store_path)
    with _INDEXES_LOCK:
        index = _INDEXES.get(key)
        if index is None:
            index = _INDEXES[key] = StoreIndex()
        return index


def forget(store_path: str) -> None:
    """Drop this process's index of a store (the next use reads it again from git or its saved copy)."""
    with _INDEXES_LOCK:
        _INDEXES.pop(os.path.realpath(store_path), None)
