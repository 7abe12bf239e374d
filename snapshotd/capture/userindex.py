"""The user's index as it was read, kept as what the capture's own index changed since: no second copy.

A warm capture asks, per path, what the user's index held when the cold scan
read it: the stage-0 entry (id, mode, stat data, which prove a file
unchanged), the blob git's conversion reads there (stage 0, else "ours"), and
whether any stage is there (a tracked path). The capture's in-memory index is
read from that same file and differs from it only at the paths a capture has
changed since (and the conflicts it dropped), so each path's original is
saved the first time it changes, before libgit2 changes it (an entry added
there also drops the entries a file or folder of that name replaces), and
every other answer is read from the capture's index itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import pygit2

from snapshotd.fsutil import older_than
from snapshotd.paths import folders_above

C = pygit2.C
ffi = pygit2.ffi

STAGE_OURS = 2


class HasIndex(Protocol):
    """An index wrapper that lends libgit2's index pointer (:class:`~snapshotd.capture.treeedit.RecordingIndex`)."""

    _index: Any


def index_blob(index: pygit2.Index | HasIndex, path: str) -> pygit2.Oid | None:
    """The blob git's conversion reads from ``index`` at ``path``: stage 0, else "ours"; None if neither.

    A gitlink's commit is no blob: git reads nothing there either.
    """
    raw = os.fsencode(path)
    for stage in (0, STAGE_OURS):
        entry = C.git_index_get_bypath(index._index, raw, stage)
        if entry != ffi.NULL:
            if (entry.mode & 0o170000) == 0o160000:
                return None
            return _oid_of(entry)
    return None


Stat = tuple[int, int, int, int, int, int]  # mtime s, mtime ns, ctime s, ctime ns, size, inode (as the index has them)


@dataclass(frozen=True)
class Original:
    """What the user's index held at one path: its stage-0 entry, the blob conversion reads, any stage."""

    oid: pygit2.Oid | None  # stage 0 (None: no stage-0 entry)
    mode: int
    stat: Stat
    basis: pygit2.Oid | None
    present: bool


_ABSENT = Original(None, 0, (0, 0, 0, 0, 0, 0), None, False)


def _stat_of(entry: Any) -> Stat:
    return (
        entry.mtime.seconds, entry.mtime.nanoseconds, entry.ctime.seconds, entry.ctime.nanoseconds,
        entry.file_size, entry.ino,
    )


def _oid_of(entry: Any) -> pygit2.Oid:
    return pygit2.Oid(raw=bytes(ffi.buffer(ffi.addressof(entry, "id"))[:20]))


def entry_at(index: pygit2.Index, position: int) -> Any:  # a cffi pointer to libgit2's entry
    return C.git_index_get_byindex(index._index, position)


def _first_at_or_after(index: pygit2.Index, prefix: bytes) -> int:
    """The position of the first entry whose path sorts at or after ``prefix`` (entries are sorted)."""
    low, high = 0, len(index)
    while low < high:
        middle = (low + high) // 2
        if ffi.string(entry_at(index, middle).path) < prefix:
            low = middle + 1
        else:
            high = middle
    return low


def holds_entries(index: pygit2.Index, folder: str) -> bool:
    """Whether ``index`` has an entry inside ``folder`` (the root holds every entry)."""
    if not folder:
        return len(index) > 0
    prefix = os.fsencode(folder) + b"/"
    at = _first_at_or_after(index, prefix)
    return at < len(index) and ffi.string(entry_at(index, at).path).startswith(prefix)


def entries_under(index: pygit2.Index, folder: str) -> list[str]:
    """Paths of ``index`` inside ``folder``, found by binary search (entries are sorted)."""
    prefix = os.fsencode(folder) + b"/"
    count = len(index)
    low = _first_at_or_after(index, prefix)
    found = []
    while low < count:
        path = ffi.string(entry_at(index, low).path)
        if not path.startswith(prefix):
            break
        found.append(os.fsdecode(path))
        low += 1
    return found


def stat_proves_clean(recorded: Stat, st: os.stat_result, index_mtime_ns: int) -> bool:
    """Whether ``st`` matches the index's stat data ``recorded`` and is not racily clean (git's check)."""
    return recorded == (
        (st.st_mtime_ns // 1_000_000_000) & 0xFFFFFFFF,
        st.st_mtime_ns % 1_000_000_000,
        (st.st_ctime_ns // 1_000_000_000) & 0xFFFFFFFF,
        st.st_ctime_ns % 1_000_000_000,
        st.st_size & 0xFFFFFFFF,
        st.st_ino & 0xFFFFFFFF,
    ) and older_than(st, index_mtime_ns)


class UserIndex:
    """The user's index as read: the capture's ``index`` where it is unchanged, ``saved`` originals elsewhere."""

    def __init__(self, index: pygit2.Index) -> None:
        self.index = index
        self.saved: dict[str, Original] = {}
        self._saved_under: set[str] = set()  # the folders above each saved entry the user's index has

    def _read(self, path: str) -> Original:
        """The capture's index at ``path`` now (still the user's: nothing changed it yet)."""
        raw = os.fsencode(path)
        entry = C.git_index_get_bypath(self.index._index, raw, 0)
        present = entry != ffi.NULL or C.git_index_find(ffi.NULL, self.index._index, raw) == 0
        if not present:
            return _ABSENT
        basis = index_blob(self.index, path)
        if entry == ffi.NULL:
            return Original(None, 0, _ABSENT.stat, basis, True)
        return Original(_oid_of(entry), int(entry.mode), _stat_of(entry), basis, True)

    def save(self, path: str) -> None:
        """Keep the user's entry at ``path`` before the capture's index changes it there."""
        if path not in self.saved:
            original = self.saved[path] = self._read(path)
            if original.present:
                self._saved_under.update(folders_above(path))

    def save_replaced(self, path: str) -> None:
        """Keep the entries an entry added at ``path`` replaces: ``path``, and the files above it and
        the entries below it (libgit2 drops those), which exist only when ``path`` is not an entry now."""
        here = C.git_index_find(ffi.NULL, self.index._index, os.fsencode(path)) == 0
        self.save(path)
        if here:
            return
        for folder in folders_above(path):
            if folder not in self.saved and C.git_index_find(ffi.NULL, self.index._index, os.fsencode(folder)) == 0:
                self.save(folder)
        for inner in entries_under(self.index, path):
            self.save(inner)

    def has_saved_under(self, folder: str) -> bool:
        """Whether the user's index had an entry inside ``folder`` that the capture's index has changed."""
        return folder in self._saved_under

    def has(self, path: str) -> bool:
        """Whether the user's index tracks ``path`` (any stage)."""
        saved = self.saved.get(path)
        if saved is not None:
            return saved.present
        return bool(C.git_index_find(ffi.NULL, self.index._index, os.fsencode(path)) == 0)

    def entry(self, path: str) -> tuple[pygit2.Oid, int] | None:
        """The id and mode of the user's stage-0 entry at ``path``."""
        saved = self.saved.get(path)
        if saved is not None:
            return None if saved.oid is None else (saved.oid, saved.mode)
        entry = C.git_index_get_bypath(self.index._index, os.fsencode(path), 0)
        return None if entry == ffi.NULL else (_oid_of(entry), int(entry.mode))

    def basis(self, path: str) -> pygit2.Oid | None:
        """The blob git's conversion reads at ``path`` in the user's index (see capture/checkin.py)."""
        saved = self.saved.get(path)
        return saved.basis if saved is not None else index_blob(self.index, path)

    def clean_oid(self, path: str, st: os.stat_result, index_mtime_ns: int) -> pygit2.Oid | None:
        """The user's blob at ``path`` if its stat data prove the file unchanged since the index was written."""
        saved = self.saved.get(path)
        if saved is not None:
            if saved.oid is None or not stat_proves_clean(saved.stat, st, index_mtime_ns):
                return None
            return saved.oid
        entry = C.git_index_get_bypath(self.index._index, os.fsencode(path), 0)
        if entry == ffi.NULL or not stat_proves_clean(_stat_of(entry), st, index_mtime_ns):
            return None
        return _oid_of(entry)
