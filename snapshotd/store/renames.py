"""The renames git finds and libgit2 does not: symlinks and gitlinks moved unchanged.

libgit2's ``find_similar`` takes regular files only (its rename sources and
targets must be blobs). git also pairs other entries, exactly: a deleted
symlink or gitlink and an added one of the same id and mode are a rename
(``R100``), never similar ones. :func:`exact_renames` finds those pairs
among the deltas libgit2 left as deletions and additions, the way git's
exact-rename pass does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pygit2
from pygit2.enums import DeltaStatus

from snapshotd.paths import quote_path

__all__ = ["exact_rename_patch", "exact_renames"]

MAX_ALTERNATIVES = 100  # git looks at this many identical candidates at most, then picks one


def _is_blob(mode: int) -> bool:
    return mode & 0o170000 == 0o100000


def exact_renames(deltas: Sequence[pygit2.DiffDelta]) -> dict[int, int]:
    """Deleted symlinks and gitlinks paired with added ones of the same id and mode: addition index -> deletion index.

    libgit2's rename detection takes regular files only; git also pairs
    other entries when they are identical (no similarity for them). As git
    does, each addition in path order takes the first unused deletion of its
    id and mode, one with the same base name first, among the first :data:`MAX_ALTERNATIVES`.
    """
    sources: dict[tuple[str, int], list[int]] = {}
    for index, delta in enumerate(deltas):
        if delta.status == DeltaStatus.DELETED and not _is_blob(delta.old_file.mode):
            sources.setdefault((str(delta.old_file.id), delta.old_file.mode), []).append(index)
    pairs: dict[int, int] = {}
    used: set[int] = set()
    for index, delta in enumerate(deltas):
        if delta.status != DeltaStatus.ADDED or _is_blob(delta.new_file.mode):
            continue
        candidates = [i for i in sources.get((str(delta.new_file.id), delta.new_file.mode), ()) if i not in used]
        if not candidates:
            continue
        name = os.path.basename(delta.new_file.raw_path)
        same = [i for i in candidates[:MAX_ALTERNATIVES] if os.path.basename(deltas[i].old_file.raw_path) == name]
        pairs[index] = (same or candidates)[0]
        used.add(pairs[index])
    return pairs


def exact_rename_patch(old_path: str, new_path: str) -> str:
    """git's patch of a rename with nothing else changed: the header alone."""
    return (
        f"diff --git {quote_path('a/' + old_path)} {quote_path('b/' + new_path)}\n"
        "similarity index 100%\n"
        f"rename from {quote_path(old_path)}\nrename to {quote_path(new_path)}\n"
    )
