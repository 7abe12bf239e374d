"""What ``status`` prints for people: a table of worktrees and one health line.

The table is the ``status`` result alone: each worktree carries its
checkpoint count and when its newest was taken, read from the store's index,
so a large store costs no more than a small one. A facility the machine
lacks (inotify, SO_PEERCRED, syncfs, /proc) is one ``warning:`` line under
the health line, once for the daemon. The counters are printed only with
``--verbose``; ``--json`` is the method's result, unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from snapshotd.cli.turns import age
from snapshotd.wording import one_line

WARNING_CHARS = 60
"""A warning longer than this is cut in the table at a terminal; a pipe and ``--json`` carry it whole."""


def _state(wt: dict[str, Any]) -> str:
    """watching (a warm watcher), cold (each capture scans) or the presence when it is not here."""
    if wt.get("presence") not in (None, "here"):
        return str(wt["presence"])
    return "watching" if wt.get("watching") else "cold"


def _warning(wt: dict[str, Any], cut: bool) -> str:
    """The worktree's problem on one line, cut to :data:`WARNING_CHARS` at a terminal (a pipe gets it whole)."""
    text = one_line(str(wt.get("problem") or wt.get("watch_error") or ""))
    return text if not cut or len(text) <= WARNING_CHARS else text[: WARNING_CHARS - 1] + "…"


def _checkpoints(wt: dict[str, Any]) -> tuple[str, str]:
    """The worktree's checkpoint count and the age of its newest, or dashes when they could not be read."""
    count = wt.get("checkpoint_count")
    if wt.get("presence") not in (None, "here") or count is None:
        return "-", "-"
    newest = wt.get("last_checkpoint_at")
    return str(count), age(newest) if newest else "never"


def health_line(result: dict[str, Any], embedded: bool = False) -> str:
    """One line: all well, or how many worktrees need a look and whether captures run cold.

    ``embedded``: the engine ran in this command alone, so no worktree is open or watched.
    """
    worktrees = result["worktrees"]
    if embedded and not worktrees:
        return click.style("ok", fg="green") + ": embedded (no daemon: each command opens its worktree and scans it)"
    gone = sum(1 for wt in worktrees if _state(wt) not in ("watching", "cold", "removed"))
    removed = sum(1 for wt in worktrees if _state(wt) == "removed")
    cold = sum(1 for wt in worktrees if _state(wt) == "cold")
    unwatchable = not result.get("facilities", {}).get("inotify", {}).get("available", True)
    spawn = result.get("spawn", {})
    notes = []
    if gone:
        notes.append(
            f"{gone} worktree{'s' if gone != 1 else ''} not where recorded "
            "(see warnings; `snapshotd repair` lists them, `snapshotd forget PATH` drops a deleted one)"
        )
    if cold and not unwatchable:  # without inotify every worktree is cold: the warning says so once
        notes.append(f"{cold} captured cold (no watcher: each checkpoint scans)")
    if not spawn.get("native", True):
        notes.append(f"git runs through the fallback spawner ({spawn.get('error')})")
    live = len(worktrees) - removed
    count = f"{live} worktree{'s' if live != 1 else ''}"
    # Removed with git is the end of a worktree's life, not trouble: said, never "attention".
    aside = f"; {removed} removed with git (`snapshotd forget ID` drops a record)" if removed else ""
    if not notes:
        how = "captured cold (no inotify: see the warning)" if unwatchable else "all watched"
        return click.style("ok", fg="green") + (f": {count}, {how}{aside}" if live else f": {count}{aside}")
    return click.style("attention", fg="yellow") + f": {count}; " + "; ".join(notes) + aside


def background_push_line(worktree: str, push: dict[str, Any]) -> str:
    """One worktree's background push: in flight or pending, the last push, and the last error in red."""
    state = "pushing" if push["in_flight"] else "pending" if push["pending"] else "idle"
    last = (push.get("last_push_at") or "never")[:19].replace("T", " ")
    line = f"background push {worktree}: {state}, last pushed {last}"
    return line + (click.style(f"; last error: {push['last_error']}", fg="red") if push.get("last_error") else "")


def print_status(result: dict[str, Any], verbose: bool, embedded: bool = False) -> None:
    """The version line, the table of worktrees, the health line, and with ``verbose`` the counters."""
    click.echo(f"snapshotd {result.get('version')}  pid {result.get('pid')}"
               + (f"  log {result['log']}" if result.get("log") and not embedded else ""))
    rows = [("ID", "PATH", "KIND", "STATE", "CHECKPOINTS", "LAST CAPTURE", "WARNINGS")]
    at_terminal = sys.stdout.isatty()
    for wt in result["worktrees"]:
        count, last = _checkpoints(wt)
        rows.append((wt["id"], one_line(wt["path"]), wt["kind"], _state(wt), count, last, _warning(wt, at_terminal)))
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            click.echo("  ".join([*cells, row[-1]]).rstrip())
    elif not embedded:
        click.echo("no worktrees open yet (a checkpoint opens one)")
    click.echo(health_line(result, embedded))
    for text in result.get("warnings") or ():  # a facility this machine lacks: once, whatever the worktrees
        click.echo(click.style("warning: ", fg="yellow") + text)
    for worktree, push in (result.get("background_push") or {}).items():
        click.echo(background_push_line(worktree, push))
    packing = result.get("packing") or {}
    if packing.get("last_error"):  # loose objects pile up until a packing succeeds: say so
        click.echo(click.style(f"background packing failed: {packing['last_error']}", fg="red"))
    counters = result["counters"]
    if verbose and counters:
        width = max(len(key) for key in counters)
        for key in sorted(counters):
            click.echo(f"  {key.ljust(width)}  {counters[key]}")
