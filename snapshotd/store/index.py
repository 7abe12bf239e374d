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

from snapshotd.store import indexfile
from snapshotd.store.pins import Pin, SessionChains, read_pin
from snapshotd.store.sessionindex import SessionIndex

SAVE_AFTER = 256  # pins read before the saved copy is written again (and a sixteenth of the index)


class StoreIndex:
    """The session indexes of one store, shared by the threads of this process."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.sessions: dict[str, SessionIndex] = {}
        self.loaded = False
        self.walked = 0  # pins read since the saved copy was written

    def refresh(self, chains: SessionChains, name: str) -> SessionIndex:
        """The session's entry made to match its ref now; call with :attr:`lock` held."""
        id_bytes = chains.repo.hex_length // 2
        if not self.loaded:
            self.sessions = indexfile.load(self.path, id_bytes) | self.sessions
            self.loaded = True
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
        if self.walked >= SAVE_AFTER and self.walked >= sum(map(len, self.sessions.values())) // 16:
            indexfile.save(self.path, self.sessions, id_bytes)
            self.walked = 0
        return entry


_INDEXES: dict[str, StoreIndex] = {}
_INDEXES_LOCK = threading.Lock()


def index_of(store_path: str) -> StoreIndex:
    """This process's index of the store at ``store_path`` (one per real path)."""
    key = os.path.realpath(store_path)
    with _INDEXES_LOCK:
        index = _INDEXES.get(key)
        if index is None:
            index = _INDEXES[key] = StoreIndex(key)
        return index


def forget(store_path: str) -> None:
    """Drop this process's index of a store (the next use reads it again from git or its saved copy)."""
    with _INDEXES_LOCK:
        _INDEXES.pop(os.path.realpath(store_path), None)
