"""The commands that delete checkpoints: ``delete`` and ``gc``.

At a terminal each lists what it would delete and asks first
(:mod:`.confirm`); ``--yes`` goes ahead without asking.
"""

from __future__ import annotations

import os
from typing import Any

import click

from snapshotd.cli.completion import complete_session
from snapshotd.cli.confirm import call_or_fail, may_go_ahead, refuse_without_terminal
from snapshotd.cli.options import (
    CONTEXT,
    COUNT,
    DURATION,
    SESSION_NAME,
    invoke,
    json_option,
    reference_argument,
    reference_params,
    yes_option,
)
from snapshotd.cli.output import checkpoint_line, short_id
from snapshotd.wording import one_line, plural

LISTED = 20  # checkpoints listed before a question; the rest are counted


def _listing(lines: list[str]) -> list[str]:
    more = [f"… and {len(lines) - LISTED} more"] if len(lines) > LISTED else []
    return lines[:LISTED] + more


@click.command(context_settings=CONTEXT)
@reference_argument("checkpoints", "CHECKPOINT... | --session S [PATH]", nargs=-1)
@click.option("--session", metavar="S", type=SESSION_NAME, shell_complete=complete_session, help="Delete every checkpoint of this session (of PATH's worktree, default: here).")
@click.option("-C", "--path", "path", type=click.Path(file_okay=False), help="The worktree, with --session (same as PATH), or where @ and #N count.")
@yes_option
@json_option
@click.pass_context
def delete(ctx: click.Context, checkpoints: tuple[str, ...], session: str | None, path: str | None, yes: bool, json_output: bool) -> None:
    """Delete checkpoints (ids or references such as @~3), or every checkpoint of a session."""
    params: dict[str, Any]
    if session is not None:
        if len(checkpoints) > 1 or (checkpoints and path is not None):
            raise click.UsageError("With --session give at most one PATH (the worktree), not checkpoint ids.")
        folder = checkpoints[0] if checkpoints else (path or ".")
        params = {"session": session, "path": os.path.abspath(folder)}
    elif checkpoints:
        params = {"checkpoints": list(checkpoints), **reference_params(checkpoints, None, path)}
    else:
        raise click.UsageError("Give checkpoint ids, or --session S.")
    if not yes:
        refuse_without_terminal(ctx)
        if session is not None:
            found = call_or_fail(ctx, "list", {"path": params["path"], "session": session})["checkpoints"]
        else:
            where = {key: params.get(key) for key in ("path",)}
            found = [call_or_fail(ctx, "resolve", {"checkpoint": ref, **where})["checkpoint"] for ref in checkpoints]
        unique = list({cp["id"]: cp for cp in found}.values())
        question = f"Delete {plural(len(unique), 'checkpoint')}?" if session is None else (
            f"Delete {plural(len(unique), 'checkpoint')} of session {session!r}?"
        )
        if unique and not may_go_ahead(ctx, question, False, _listing([checkpoint_line(cp) for cp in unique])):
            return
    invoke(ctx, "delete", params, lambda r: click.echo(f"deleted {plural(r['deleted'], 'checkpoint')}"))


def _would_delete(result: dict[str, Any]) -> list[str]:
    """One line per worktree and session of a dry run, with the short ids."""
    lines = []
    for item in result["would_delete"]:
        session = f"session {one_line(item['session'])}" if item["session"] is not None else "the default session"
        ids = " ".join(short_id(each) for each in item["checkpoints"][:LISTED])
        more = f" … and {len(item['checkpoints']) - LISTED} more" if len(item["checkpoints"]) > LISTED else ""
        lines.append(f"would delete {plural(len(item['checkpoints']), 'checkpoint')} of {session} in {item['path']}")
        lines.append(f"  {ids}{more}")
    return lines


@click.command(context_settings=CONTEXT)
@click.argument("path", required=False, type=click.Path(file_okay=False))
@click.option("--keep", type=COUNT, metavar="N", help="Keep the newest N per session (default 50).")
@click.option("--older-than", "older_than", type=DURATION, metavar="AGE", help="Delete only those older than AGE: seconds, or 90m, 12h, 1d, 2w.")
@click.option("--all", "every", is_flag=True, help="Collect every known worktree, not only PATH's.")
@click.option("--dry-run", is_flag=True, help="List what would be deleted, per worktree and session; delete nothing.")
@click.option("--include-safety", is_flag=True, help="Also collect the safety checkpoints taken before restores.")
@yes_option
@json_option
@click.pass_context
def gc(
    ctx: click.Context,
    path: str | None,
    keep: int | None,
    older_than: int | None,
    every: bool,
    dry_run: bool,
    include_safety: bool,
    yes: bool,
    json_output: bool,
) -> None:
    """Delete old checkpoints of the worktree holding PATH (default: here), or with --all of every one."""
    if every and path is not None:
        raise click.UsageError("Give PATH or --all, not both.")
    params = {
        "path": None if every else os.path.abspath(path or "."),
        "all": every or None,
        "keep": keep,
        "older_than_s": older_than,
        "dry_run": dry_run or None,
        "include_safety": include_safety or None,
    }
    if not dry_run and not yes:
        refuse_without_terminal(ctx)
        preview = call_or_fail(ctx, "gc", {**params, "dry_run": True})
        total = sum(len(item["checkpoints"]) for item in preview["would_delete"])
        if total and not may_go_ahead(ctx, f"Delete {plural(total, 'checkpoint')}?", False, _would_delete(preview)):
            return

    def human(result: dict[str, Any]) -> None:
        if not dry_run:
            click.echo(f"deleted {plural(result['deleted'], 'checkpoint')}")
        elif not result["would_delete"]:
            click.echo("nothing to delete")
        else:
            click.echo("\n".join(_would_delete(result)))

    invoke(ctx, "gc", params, human, progress="collecting")
