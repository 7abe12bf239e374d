"""Tree-to-tree diffs by one ``git diff-tree``, read back into the FileChange records libgit2's give.

For the trees libgit2 cannot read (a SHA-256 repository) and the diffs it
would take too long over (a file of megabytes): :mod:`snapshotd.store.diff`
decides when, and this module runs git and reads its raw records, line
counts and per-file patches, in order.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from snapshotd.errors import InternalError
from snapshotd.git.process import GitTarget, run_git_sync
from snapshotd.paths import path_matches
from snapshotd.store.changes import DiffRequest, Entry, FileChange

__all__ = ["entries_by_git", "ready"]

_GIT_STATUS = {"A": "added", "D": "deleted", "M": "modified", "R": "renamed", "T": "type_changed"}
_PATCH_HEADER = b"diff --git "


def _patch_starts(body: bytes) -> list[int]:
    """Where each file's ``diff --git`` line starts (a patch's own lines start with ' ', '+' or '-').

    By ``bytes.find``: a regular expression's scan of a patch of megabytes
    is one call that holds the GIL for a quarter of a second.
    """
    starts = [0] if body.startswith(_PATCH_HEADER) else []
    at = body.find(b"\n" + _PATCH_HEADER)
    while at >= 0:
        starts.append(at + 1)
        at = body.find(b"\n" + _PATCH_HEADER, at + 1)
    return starts


def _field(out: bytes, pos: int) -> tuple[bytes, int]:
    """The NUL-terminated field of ``out`` at ``pos`` and the position after it."""
    end = out.index(b"\0", pos)
    return out[pos:end], end + 1


def entries_by_git(target: GitTarget, sides: list[str], zero: str, request: DiffRequest) -> list[Entry]:
    """The entries of one ``git diff-tree`` of the trees ``sides`` (hex ids) in ``target``."""
    args = ["diff-tree", "-r", "-z", "--raw", "--numstat", "-M" if request.find_renames else "--no-renames"]
    if request.patch:
        args += ["-p", f"-U{request.context}"]
    out = run_git_sync(target, [*args, *sides])

    records: list[dict[str, Any]] = []
    pos = 0
    while out.startswith(b":", pos):
        meta, pos = _field(out, pos)
        old_mode, new_mode, old_oid, new_oid, status = meta[1:].decode("ascii").split(" ")
        source, pos = _field(out, pos)
        destination = source
        if status[0] in "RC":
            destination, pos = _field(out, pos)
        records.append(
            {
                "path": os.fsdecode(destination),
                "old_path": os.fsdecode(source) if status[0] == "R" else None,
                "status": _GIT_STATUS.get(status[0]),
                "old_mode": None if old_mode == "000000" else old_mode,
                "new_mode": None if new_mode == "000000" else new_mode,
                "old_oid": None if old_oid == zero else old_oid,
                "new_oid": None if new_oid == zero else new_oid,
            }
        )
    for record in records:
        counts, pos = _field(out, pos)
        added, deleted, name = counts.split(b"\t", 2)
        if not name:  # a rename: the two names follow as fields of their own
            _, pos = _field(out, pos)
            _, pos = _field(out, pos)
        binary = added == b"-"
        record["binary"] = binary
        record["additions"] = 0 if binary else int(added)
        record["deletions"] = 0 if binary else int(deleted)

    _binary_sizes(target, records)
    texts: list[list[bytes]] = [[] for _ in records]
    if request.patch and records:
        if out.startswith(b"\0", pos):
            pos += 1
        body = out[pos:]
        starts = [*_patch_starts(body), len(body)]
        blocks = [body[a:b] for a, b in itertools.pairwise(starts)]
        # Each record prints one "diff --git" block; a type change prints two.
        wanted = sum(2 if record["status"] == "type_changed" else 1 for record in records)
        if len(blocks) != wanted:
            raise InternalError(f"git diff-tree printed {len(blocks)} file patches for {wanted} expected.")
        index = 0
        for number, record in enumerate(records):
            step = 2 if record["status"] == "type_changed" else 1
            texts[number] = blocks[index : index + step]
            index += step

    entries: list[Entry] = []
    for record, text in zip(records, texts, strict=True):
        if record["status"] is None:
            continue
        if request.paths is not None and not (
            path_matches(record["path"], request.paths)
            or (record["old_path"] is not None and path_matches(record["old_path"], request.paths))
        ):
            continue
        entries.append(ready(FileChange(**record), b"".join(text).decode("utf-8", "replace")))
    return entries


def _binary_sizes(target: GitTarget, records: list[dict[str, Any]]) -> None:
    """Each binary record's ``old_size`` and ``new_size``, by one ``cat-file --batch-check`` (none when no file is
    binary)."""
    sides = [(record, side) for record in records if record["binary"] for side in ("old", "new")
             if record[f"{side}_oid"] is not None]
    if not sides:
        return
    wanted = "".join(f"{record[side + '_oid']}\n" for record, side in sides).encode()
    sizes = run_git_sync(target, ["cat-file", "--batch-check=%(objectsize)"], input=wanted).split()
    if len(sizes) != len(sides):
        raise InternalError(f"git cat-file gave {len(sizes)} sizes for {len(sides)} blobs.")
    for (record, side), size in zip(sides, sizes, strict=True):
        record[f"{side}_size"] = int(size)


def ready(change: FileChange, patch_text: str) -> Entry:
    """An entry whose change and patch are already made."""
    return lambda: (change, patch_text)
