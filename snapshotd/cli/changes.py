"""The commands that change files: ``restore``, ``undo`` and ``revert``.

Each shows its dry run at the terminal and asks first (:mod:`.confirm`);
``--yes`` goes ahead without asking and ``--dry-run`` only reports.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from snapshotd.cli.confirm import call_or_fail, confirm_preview
from snapshotd.cli.options import (
    CONTEXT,
    Finishes,
    PathsAfterDashDash,
    fail,
    invoke,
    json_option,
    paths_after_dash,
    ref_session_option,
    reference_argument,
    reference_params,
    refuse_missing_paths,
    use_json,
    yes_option,
)
from snapshotd.cli.output import print_changes
from snapshotd.cli.turns import turn_option, turn_range
from snapshotd.client.launcher import Runner
from snapshotd.contract.refs import is_reference
from snapshotd.errors import NotFound, SnapshotdError
from snapshotd.settings import SAFETY_SESSION
from snapshotd.wording import plural


@click.command(cls=PathsAfterDashDash, context_settings=CONTEXT)
@reference_argument("checkpoint_id", "CHECKPOINT")
@click.argument("paths", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Report what would change; change nothing.")
@click.option("--into", "into", metavar="PATH", type=click.Path(file_okay=False), help="Restore into this worktree (another than the checkpoint's own).")
@ref_session_option
@yes_option
@json_option
@click.pass_context
def restore(
    ctx: click.Context,
    checkpoint_id: str,
    paths: tuple[str, ...],
    dry_run: bool,
    into: str | None,
    ref_session: str | None,
    yes: bool,
    json_output: bool,
) -> None:
    """Make the worktree (or PATHS in it) equal CHECKPOINT again; a safety checkpoint comes first.

    CHECKPOINT is an id or @, @~N, #N, SESSION@, SESSION@~N of the worktree here.
    """
    paths = (*paths, *paths_after_dash(ctx))
    # Run here, it acts here: a checkpoint of another worktree is refused, even named by id, unless --into.
    where = reference_params([checkpoint_id], ref_session, None if into else ".")
    if into and where:  # @ counts here, and the restore goes into the other worktree
        checkpoint_id = call_or_fail(ctx, "resolve", {"checkpoint": checkpoint_id, **where})["checkpoint"]["id"]
        where = {}
    params = {
        "checkpoint": checkpoint_id,
        "paths": [os.path.abspath(p) for p in paths] or None,
        "dry_run": dry_run or None,
        "path": os.path.abspath(into) if into else where.get("path"),
        "session": where.get("session"),
        "allow_other_worktree": True if into else None,
    }
    if confirm_preview(ctx, "restore", params, yes) is not None:
        return
    finishes = None if dry_run else Finishes("restore", str(params["path"]) if params["path"] else None)
    invoke(ctx, "restore", params, lambda r: print_changes(r, dry_run), progress="restoring", finishes=finishes)


@click.command(context_settings=CONTEXT)
@click.argument("path", default=".", type=click.Path(file_okay=False))
@click.option("--dry-run", is_flag=True, help="Report what undo would change; change nothing.")
@yes_option
@json_option
@click.pass_context
def undo(ctx: click.Context, path: str, dry_run: bool, yes: bool, json_output: bool) -> None:
    """Put the worktree holding PATH back as it was before its last restore or revert.

    That is its newest safety checkpoint, restored in turn (with a safety
    checkpoint of its own, so a second undo is a redo).
    """
    runner = use_json(ctx)
    folder = os.path.abspath(path)
    try:
        found = runner.call("list", {"path": folder, "session": SAFETY_SESSION, "limit": 1})["checkpoints"]
    except SnapshotdError as error:
        fail(runner, error)
    if not found:
        fail(runner, NotFound(f"There is no restore or revert to undo in the worktree holding {folder}."))
    params = {"checkpoint": found[0]["id"], "path": folder, "dry_run": dry_run or None}
    if confirm_preview(ctx, "restore", params, yes) is not None:
        return
    finishes = None if dry_run else Finishes("restore", folder)
    invoke(ctx, "restore", params, lambda r: print_changes(r, dry_run), progress="undoing", finishes=finishes)


@click.command(cls=PathsAfterDashDash, context_settings=CONTEXT)
@reference_argument("source", "FROM", required=False)
@reference_argument("rest", "[TO] [PATHS...]", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Report what would change; change nothing.")
@click.option("--force", is_flag=True, help="Also take back paths changed since TO.")
@turn_option
@ref_session_option
@yes_option
@json_option
@click.pass_context
def revert(
    ctx: click.Context,
    source: str | None,
    rest: tuple[str, ...],
    dry_run: bool,
    force: bool,
    turn: int | None,
    ref_session: str | None,
    yes: bool,
    json_output: bool,
) -> None:
    """Undo the changes from FROM to TO (default: the session's newest), leaving other work alone.

    TO is told from PATHS by its look (a checkpoint reference that is not an
    existing path); everything after `--` is a path. With --turn N, FROM
    and TO are turn N's first and last checkpoints and the rest are PATHS.
    """
    target = None
    paths = list(rest)
    if turn is not None:
        paths = [p for p in (source, *paths) if p is not None]
        found = turn_range(ctx, os.path.abspath("."), ref_session, turn)
        source, target = found.start, found.end
    elif source is None:
        raise click.UsageError("revert needs FROM (a checkpoint) or --turn N; `snapshotd log` lists the turns.")
    elif paths and is_reference(paths[0]) and not os.path.exists(paths[0]):
        target = paths.pop(0)
    refuse_missing_paths(paths)
    paths += paths_after_dash(ctx)
    params = {
        "from": source,
        "to": target,
        "paths": [os.path.abspath(p) for p in paths] or None,
        "dry_run": dry_run or None,
        "force": force or None,
        **reference_params([source, *([target] if target else [])], ref_session, "."),  # run here, it acts here
    }
    preview = confirm_preview(ctx, "revert", params, yes)
    if preview is None:
        finishes = None if dry_run else Finishes("revert")
        preview = invoke(
            ctx, "revert", params, lambda r: print_changes(r, dry_run), progress="reverting", finishes=finishes,
            ask_force=False,
        )
    elif preview.get("written") or preview.get("deleted"):
        return  # the answer was no
    _fail_on_conflicts(ctx.obj, preview)


def _fail_on_conflicts(runner: Runner, result: dict[str, Any]) -> None:
    """A revert that left any path unreverted exits 1, saying which (already listed) and why."""
    conflicts = result.get("conflicts") or []
    if not conflicts:
        return
    if not runner.json:
        names = ", ".join(f"{c['path']} ({c['reason']})" for c in conflicts[:5])
        more = f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
        click.echo(
            click.style("error: ", fg="red", bold=True)
            + f"{plural(len(conflicts), 'path')} left unreverted: {names}{more}; pass --force to revert them anyway.",
            err=True,
        )
    sys.exit(1)
