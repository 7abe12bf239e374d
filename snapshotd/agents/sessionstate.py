"""What the hooks keep of each agent session between runs: the folder it started in, and whether a turn is open.

An agent's ``cd`` moves the ``cwd`` of its later payloads (Codex passes
nothing else), which would split one turn across two worktrees. So every event
of a session is recorded in the folder the session started in: the folder of
its first hook run, taken anew when the session starts or resumes
(``SessionStart``) or when that folder is gone. The same record says whether
the session's newest checkpoint left a turn open, so that the next prompt
knows whether to close it (``after turn (interrupted)``) without asking the
daemon. A hook's child reads and writes it while it holds the session's turn
(:class:`~snapshotd.agents.hookstate.Turn`), so records follow the events' order.

The records are ``<data home>/hooks/sessions/<key>.json``; a session unused
for :data:`KEEP_S` loses its record when a new session writes its first.
"""

from __future__ import annotations

import os
import time

from snapshotd.agents.hookstate import hooks_folder, key_name, write_record
from snapshotd.jsonlite import dumps, loads

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's child imports this module
if TYPE_CHECKING:
    from typing import Any

KEEP_S = 30 * 86400
"""A session's record is dropped once unused this long (30 days)."""


def _folder() -> str:
    folder = os.path.join(hooks_folder(), "sessions")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def read(session: str) -> dict[str, Any] | None:
    """The session's record (``cwd``: the folder it started in, ``open``: a turn is open), None when there is none."""
    try:
        with open(os.path.join(_folder(), key_name(session) + ".json"), encoding="utf-8") as handle:
            entry = loads(handle.read())
    except (OSError, ValueError):
        return None
    if isinstance(entry, dict) and entry.get("session") == session and isinstance(entry.get("cwd"), str):
        return {"cwd": entry["cwd"], "open": entry.get("open") is True}
    return None


def write(session: str, cwd: str, open_turn: bool) -> None:
    """Keep that ``session`` records in ``cwd`` and that its newest checkpoint leaves a turn open (or not)."""
    folder = _folder()
    path = os.path.join(folder, key_name(session) + ".json")
    if write_record(path, dumps({"session": session, "cwd": cwd, "open": open_turn})):
        _prune(folder, time.time() - KEEP_S)


def _prune(folder: str, before: float) -> None:
    """Drop the records last written before ``before``."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        try:
            if os.stat(path).st_mtime < before:
                os.unlink(path)
        except OSError:
            pass
