"""The agent's turns on the command line: ``snapshotd log`` and the ``--turn N`` of diff and revert.

What a turn is (its labels, where it starts and ends, its number) is read
from the checkpoints by :func:`snapshotd.turns.find_turns`.
"""

from __future__ import annotations

import os
import time
from calendar import timegm
from dataclasses import asdict
from typing import Any

import click

from snapshotd.cli.completion import complete_session
from snapshotd.cli.confirm import call_or_fail
from snapshotd.cli.options import (
    CONTEXT,
    COUNT,
    SESSION_NAME,
    AtMost,
    Command,
    emit,
    fail,
    json_option,
    use_json,
)
from snapshotd.errors import NotFound
from snapshotd.turns import Turn, find_turns
from snapshotd.wording import one_line


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
    last = max((turn.turn for turn in turns if turn.session == session), default=0)
    fail(runner, NotFound(
        f"There is no turn {number} in the session {one_line(session or '-')} (it has {last}); "
        "`snapshotd log` lists the turns.",
        session=session, turns=last,
    ))


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
@click.option("--session", metavar="S", type=SESSION_NAME, shell_complete=complete_session, help="Only this session's turns.")
@click.option("--limit", type=COUNT, default=20, show_default=True, metavar="N", help="At most N turns, newest first.")
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
    names = {turn.session: one_line(turn.session or "-") for turn in turns}
    width = max(map(len, names.values()), default=0)

    def human(result: dict[str, Any]) -> None:
        if not turns and limit != 0:
            click.echo("no agent turns (checkpoints from `snapshotd integrate`'s hooks make them)")
        for turn in turns:
            if len(names) > 1:  # each session whole: it is what --session takes
                click.echo(click.style(f"{names[turn.session]:<{width}} ", dim=True), nl=False)
            click.echo(turn_line(turn))

    emit(use_json(ctx), {"turns": [asdict(turn) for turn in turns]}, human)


def turn_option(func: Command) -> Command:
    """``--turn N``: FROM and TO are turn N's first and last checkpoints (in --session, else the newest)."""
    return click.option(
        "--turn", type=AtMost(least=1), metavar="N",
        help="Turn N of `snapshotd log` (in --session, else the newest session with turns) as FROM and TO.",
    )(func)


def no_refs_with_turn(ctx: click.Context, given: list[str]) -> None:
    """``--turn`` names both ends; a FROM or TO beside it is a usage error (exit 2), in one sentence."""
    if given:
        raise click.UsageError(f"--turn names both checkpoints; drop {given[0]!r} or --turn.", ctx)
