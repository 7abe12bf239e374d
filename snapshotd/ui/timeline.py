"""The timeline the page shows: a worktree's sessions and their entries, newest first, in pages.

An entry is a turn of an agent (from the checkpoint before its prompt to its
last one, see :func:`snapshotd.turns.find_turns`) or a checkpoint that no
turn holds (a ``snapshotd checkpoint`` by hand, a safety checkpoint), which
spans from the checkpoint before it in its session. A worktree's checkpoints
are listed once and kept: a checkpoint the daemon announces is added to them,
and they are listed again after :data:`RELIST_S` (a deletion or a ``gc`` is
not announced). So a page of a 20,000-checkpoint history costs only the diff
listings of its own entries.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from snapshotd.errors import SnapshotdError
from snapshotd.paths import quote_path
from snapshotd.settings import SAFETY_SESSION
from snapshotd.turns import find_turns
from snapshotd.ui.bridge import Bridge
from snapshotd.wording import one_line

PAGE = 50
"""Entries per page of the timeline."""
FILES_PAGE = 200
"""Files per page of a turn's file list."""
RELIST_S = 30.0
"""How long a worktree's listed checkpoints are trusted before they are listed again."""
_LISTINGS_KEPT = 64
_STATS_AT_ONCE = 4


@dataclass
class Entry:
    """One row of the timeline: the changes from checkpoint ``source`` (None: none before) to ``target``."""

    kind: str  # "turn" or "checkpoint"
    session: str | None
    title: str
    source: str | None
    target: str
    first_seq: int
    last_seq: int
    started_at: str
    ended_at: str
    open: bool = False
    turn: int | None = None
    files: int | None = None
    additions: int | None = None
    deletions: int | None = None


def entries_of(checkpoints: list[dict[str, Any]]) -> list[Entry]:
    """Every entry among one worktree's ``checkpoints``, newest first."""
    by_session: dict[str | None, list[dict[str, Any]]] = {}
    for cp in checkpoints:
        by_session.setdefault(cp.get("session"), []).append(cp)
    entries: list[Entry] = []
    for session, cps in by_session.items():
        cps.sort(key=lambda cp: cp["seq"])
        turns = find_turns(cps) if session != SAFETY_SESSION else []
        held: set[int] = set()
        for turn in turns:
            held.update(range(turn.start_seq, turn.end_seq + 1))
            entries.append(Entry(
                "turn", session, one_line(turn.prompt.split("\n", 1)[0]) or "(empty prompt)", turn.start, turn.end,
                turn.start_seq, turn.end_seq, turn.started_at, turn.ended_at, turn.open, turn.turn,
            ))
        previous: dict[str, Any] | None = None
        for cp in cps:
            if cp["seq"] not in held:
                title = one_line(cp.get("label") or f"checkpoint #{cp['seq']}")
                entries.append(Entry(
                    "checkpoint", session, title, previous["id"] if previous else None, cp["id"],
                    cp["seq"], cp["seq"], cp["created_at"], cp["created_at"],
                ))
            previous = cp
    entries.sort(key=lambda e: (e.ended_at, e.last_seq), reverse=True)
    return entries


def wire_file(change: dict[str, Any]) -> dict[str, Any]:
    """A FileChange for the page, with its names as git quotes them."""
    shown = dict(change)
    shown["display"] = quote_path(change["path"])
    shown["old_display"] = quote_path(change["old_path"]) if change.get("old_path") else None
    return shown


class Timeline:
    """The daemon's checkpoints and diff listings as the page reads them, with what is worth keeping."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self._checkpoints: dict[str, tuple[float, list[dict[str, Any]]]] = {}  # listed at, checkpoints
        self._entries: dict[str, list[Entry]] = {}
        self._listings: OrderedDict[tuple[str, str], list[dict[str, Any]]] = OrderedDict()
        self._limit = asyncio.Semaphore(_STATS_AT_ONCE)

    def forget(self, worktree_id: str | None = None) -> None:
        """Drop the kept listing of one worktree's checkpoints (of all, when None)."""
        if worktree_id is None:
            self._checkpoints.clear()
            self._entries.clear()
        else:
            self._checkpoints.pop(worktree_id, None)
            self._entries.pop(worktree_id, None)

    def recorded(self, worktree_id: str, checkpoint: dict[str, Any]) -> None:
        """A checkpoint the daemon announced: added to the kept listing, whose entries are grouped again."""
        kept = self._checkpoints.get(worktree_id)
        # Listed newest first, announced ones appended: a duplicate is near either end.
        if kept is not None and all(cp["id"] != checkpoint["id"] for cp in kept[1][:16] + kept[1][-16:]):
            kept[1].append(checkpoint)
            self._entries.pop(worktree_id, None)

    async def worktrees(self) -> list[dict[str, Any]]:
        """Every worktree the daemon knows, each with its sessions (name, entries, newest time), newest first.

        ``known``: the recorded worktrees too, so a restarted daemon's page
        still lists them (listing one's checkpoints opens it); one gone has none.
        """
        found = (await self.bridge.call("worktrees", {"known": True}))["worktrees"]
        shown = []
        for worktree in found:
            if worktree.get("open") is False and worktree.get("presence") in ("gone", "removed"):
                shown.append({**worktree, "sessions": [], "newest": "", "entries": 0})
                continue
            try:
                entries = await self.entries(worktree["id"])
            except SnapshotdError as error:
                shown.append({**worktree, "sessions": [], "error": error.message})
                continue
            sessions: dict[str | None, dict[str, Any]] = {}
            for entry in entries:
                info = sessions.setdefault(entry.session, {"name": entry.session, "entries": 0, "newest": entry.ended_at})
                info["entries"] += 1
            newest = entries[0].ended_at if entries else ""
            shown.append({**worktree, "sessions": list(sessions.values()), "newest": newest, "entries": len(entries)})
        shown.sort(key=lambda wt: wt.get("newest") or "", reverse=True)
        return shown

    async def entries(self, worktree_id: str) -> list[Entry]:
        """The worktree's entries, newest first; listed once, then kept until a checkpoint lands."""
        listed = self._checkpoints.get(worktree_id)
        if listed is None or time.monotonic() - listed[0] > RELIST_S:
            await self.bridge.watch(worktree_id)
            checkpoints = (await self.bridge.call("list", {"worktree": worktree_id}))["checkpoints"]
            listed = self._checkpoints[worktree_id] = (time.monotonic(), checkpoints)
            self._entries.pop(worktree_id, None)
        kept = self._entries.get(worktree_id)
        if kept is None:
            kept = self._entries[worktree_id] = entries_of(list(listed[1]))
        return kept

    async def page(self, worktree_id: str, session: str | None, offset: int, limit: int) -> dict[str, Any]:
        """Entries ``offset`` to ``offset + limit`` (of one session, when given), with their changes counted."""
        entries = await self.entries(worktree_id)
        if session is not None:
            entries = [entry for entry in entries if entry.session == session]
        chosen = entries[offset : offset + limit]
        await asyncio.gather(*(self._count(worktree_id, entry) for entry in chosen))
        return {
            "entries": [asdict(entry) for entry in chosen],
            "total": len(entries),
            "next_offset": offset + limit if offset + limit < len(entries) else None,
        }

    async def _count(self, worktree_id: str, entry: Entry) -> None:
        if entry.source is None:
            entry.files, entry.additions, entry.deletions = 0, 0, 0
            return
        async with self._limit:
            files = await self.listing(worktree_id, entry.source, entry.target)
        entry.files = len(files)
        entry.additions = sum(f.get("additions") or 0 for f in files)
        entry.deletions = sum(f.get("deletions") or 0 for f in files)

    async def listing(self, worktree_id: str, source: str, target: str) -> list[dict[str, Any]]:
        """The files changed from ``source`` to ``target`` (checkpoints, so it never changes: kept)."""
        key = (source, target)
        found = self._listings.get(key)
        if found is None:
            params = {"from": source, "to": target, "worktree": worktree_id}
            found = (await self.bridge.call("diff", params))["files"]
            self._listings[key] = found
            while len(self._listings) > _LISTINGS_KEPT:
                self._listings.popitem(last=False)
        self._listings.move_to_end(key)
        return found

    async def files(self, worktree_id: str, source: str, target: str, offset: int, limit: int) -> dict[str, Any]:
        """One page of the files changed from ``source`` to ``target``, with the totals of all of them."""
        files = await self.listing(worktree_id, source, target)
        return {
            "files": [wire_file(change) for change in files[offset : offset + limit]],
            "total": len(files),
            "additions": sum(f.get("additions") or 0 for f in files),
            "deletions": sum(f.get("deletions") or 0 for f in files),
            "next_offset": offset + limit if offset + limit < len(files) else None,
        }
