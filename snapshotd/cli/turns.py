"""The agent's turns, as the hooks recorded them: ``snapshotd log`` and the ``--turn N`` of diff and revert.

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

import os
import time
from calendar import timegm
from dataclasses import asdict, dataclass
from typing import Any

import click

from snapshotd.agents.hooks import BEFORE_PROMPT, ends_turn
from snapshotd.cli.completion import complete_session
from snapshotd.cli.confirm import call_or_fail
from snapshotd.cli.options import CONTEXT, Command, emit, fail, json_option, use_json
from snapshotd.cli.output import one_line
from snapshotd.errors import InvalidParams, NotFound
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


def _list_all(ctx: click.Context, path: str, session: str | None) -> list[dict[str, Any]]:
    checkpoints: list[dict[str, Any]] = call_or_fail(ctx, "list", {"path": path, "session": session})["checkpoints"]
    return checkpoints


def count_changes(ctx: click.Context, turn: Turn) -> None:
    """Fill in the files, lines added and lines removed from the turn's first checkpoint to its last."""
    if turn.start == turn.end:
        return
    files = call_or_fail(ctx, "diff", {"from": turn.start, "to": turn.end})["files"]
    turn.files = len(files)
    turn.additions = sum(f.get("additions") or 0 for f in files)
    turn.deletions = sum(f.get("deletions") or 0 for f in files)


def turn_range(ctx: click.Context, path: str, session: str | None, number: int) -> Turn:
    """Turn ``number`` of ``session`` (default: the session of the newest turn) in the worktree holding ``path``."""
    turns = find_turns(_list_all(ctx, path, session))
    if session is None and turns:
        session = turns[0].session
    for turn in turns:
        if turn.session == session and turn.turn == number:
            return turn
    runner = use_json(ctx)
    if not turns:
        fail(runner, NotFound(f"There are no agent turns in the worktree holding {path}; `snapshotd integrate` records them."))
    fail(runner, NotFound(f"There is no turn {number} in that session; `snapshotd log` lists the turns."))


def age(stamp: str, now: float | None = None) -> str:
    """How long ago an ISO UTC time was, as people say it (``5 minutes ago``)."""
    then = timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    seconds = max(0, int((time.time() if now is None else now) - then))
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''} ago"
    return "just now"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def turn_line(turn: Turn) -> str:
    """One line: number, the references of its first and last checkpoints, changes, age, the prompt."""
    refs = f"#{turn.start_seq}..#{turn.end_seq}"
    changes = f"{_plural(turn.files, 'file'):>8} {click.style(f'+{turn.additions}', fg='green')} {click.style(f'-{turn.deletions}', fg='red')}"
    mark = click.style(" (open)", dim=True) if turn.open else ""
    return (
        f"{click.style(f'turn {turn.turn:<3}', fg='yellow')} {refs:<12} {changes}  {age(turn.ended_at):<15}"
        f"{one_line(turn.prompt)}{mark}"
    )


@click.command(name="log", context_settings=CONTEXT)
@click.argument("path", default=".", type=click.Path(file_okay=False))
@click.option("--session", metavar="S", shell_complete=complete_session, help="Only this session's turns.")
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True, metavar="N", help="At most N turns, newest first.")
@json_option
@click.pass_context
def log(ctx: click.Context, path: str, session: str | None, limit: int, json_output: bool) -> None:
    """One line per agent turn in the worktree holding PATH, newest first.

    A turn is a prompt and what the agent changed answering it, as the hooks
    of `snapshotd integrate` record it. `snapshotd diff --turn N` and
    `snapshotd revert --turn N` act on turn N (with --session, of that session).
    """
    folder = os.path.abspath(path)
    turns = find_turns(_list_all(ctx, folder, session))[:limit]
    for turn in turns:
        count_changes(ctx, turn)
    sessions = {turn.session for turn in turns}

    def human(result: dict[str, Any]) -> None:
        if not turns and limit != 0:
            click.echo("no agent turns (checkpoints from `snapshotd integrate`'s hooks make them)")
        for turn in turns:
            if len(sessions) > 1:
                click.echo(click.style(f"{one_line(turn.session or '-')[:12]:<12} ", dim=True), nl=False)
            click.echo(turn_line(turn))

    emit(use_json(ctx), {"turns": [asdict(turn) for turn in turns]}, human)


def turn_option(func: Command) -> Command:
    """``--turn N``: FROM and TO are turn N's first and last checkpoints (in --session, else the newest)."""
    return click.option(
        "--turn", type=click.IntRange(min=1), metavar="N",
        help="Turn N of `snapshotd log` (in --session, else the newest session with turns) as FROM and TO.",
    )(func)


def no_refs_with_turn(ctx: click.Context, given: list[str]) -> None:
    """``--turn`` names both ends; a FROM or TO beside it is refused in one sentence."""
    if given:
        fail(use_json(ctx), InvalidParams(f"--turn names both checkpoints; drop {given[0]!r} or --turn."))
