"""What a turn of an agent is, read from its session's checkpoints: the command line's ``log`` and the ui's timeline.

A turn opens at a checkpoint labelled ``before: <prompt>`` (the prompt as it
was submitted) and closes at the next ``after turn`` of the same session
(the agent stopping; ``after turn (interrupted)`` when the hooks closed a turn
no ``Stop`` ended at the session's next prompt, ``after turn (failed)`` on an
API error). Checkpoints between, such as those around each tool, belong to
it. A turn whose end never came (still running, or its session never went
on) ends at its session's last checkpoint before the next prompt and is
marked open. Turns are numbered 1, 2, ... per session, oldest first, so a
number stays with its turn as more come.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from snapshotd.agents.payload import BEFORE_PROMPT, ends_turn
from snapshotd.settings import SAFETY_SESSION


@dataclass
class Turn:
    """One prompt and what the agent changed answering it: checkpoints ``start`` to ``end`` of ``session``."""

    turn: int
    session: str | None
    prompt: str
    start: str
    end: str
    start_seq: int
    end_seq: int
    started_at: str
    ended_at: str
    open: bool
    files: int = 0
    additions: int = 0
    deletions: int = 0


def find_turns(checkpoints: list[dict[str, Any]]) -> list[Turn]:
    """The turns among ``checkpoints`` (any order, any sessions), newest first."""
    by_session: dict[str | None, list[dict[str, Any]]] = {}
    for cp in checkpoints:
        if cp.get("session") != SAFETY_SESSION:
            by_session.setdefault(cp.get("session"), []).append(cp)
    turns: list[Turn] = []
    for session, cps in by_session.items():
        cps.sort(key=lambda cp: cp["seq"])
        current: Turn | None = None
        for cp in cps:
            label = cp.get("label") or ""
            if label.startswith(BEFORE_PROMPT):
                number = (current.turn if current else 0) + 1
                current = Turn(
                    number, session, label[len(BEFORE_PROMPT):], cp["id"], cp["id"], cp["seq"], cp["seq"],
                    cp["created_at"], cp["created_at"], True,
                )
                turns.append(current)
            elif current is not None and current.open:
                current.end, current.end_seq, current.ended_at = cp["id"], cp["seq"], cp["created_at"]
                current.open = not ends_turn(label)
    turns.sort(key=lambda t: t.started_at, reverse=True)
    return turns


def turn_end(session_checkpoints: list[dict[str, Any]], start: dict[str, Any]) -> dict[str, Any]:
    """The last checkpoint of the turn that ``start`` opens, as :func:`find_turns` ends it: the next
    ``after turn``, else the last before the next prompt (``start`` itself if nothing followed it).
    ``session_checkpoints`` may come in any order."""
    end = start
    for cp in sorted(session_checkpoints, key=lambda c: c["seq"]):
        if cp["seq"] <= start["seq"]:
            continue
        label = cp.get("label") or ""
        if label.startswith(BEFORE_PROMPT):
            break
        end = cp
        if ends_turn(label):
            break
    return end
