"""The commands that change files or delete checkpoints, each asking first.

``restore``, ``undo``, ``revert``, ``delete`` and ``gc`` go ahead with ``--yes`` or
when a person at the terminal says yes; restore, undo and revert show their
dry run before asking.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from snapshotd.cli.launcher import Runner
from snapshotd.cli.options import (
    CONTEXT,
    Finishes,
    PathsAfterDashDash,
    fail,
    invoke,
    json_option,
    paths_after_dash,
    ref_session_option,
    reference_params,
    use_json,
    yes_option,
)
from snapshotd.cli.output import print_changes
from snapshotd.errors import NotFound, SnapshotdError
from snapshotd.server.refs import is_reference
from snapshotd.settings import SAFETY_SESSION


def _refuse_without_terminal(ctx: click.Context) -> None:
    """Nobody can answer a question without a terminal on stdin: refuse, pointing to --yes."""
    if not sys.stdin.isatty():
        raise click.UsageError(
            f"'{ctx.info_name}' changes things and stdin is not a terminal to ask on; pass --yes to go ahead."
        )


def _resolved(ctx: click.Context, params: dict[str, Any]) -> str:
    """The full id of the checkpoint a reference names, or the command fails with why."""
    runner = use_json(ctx)
    try:
        return str(runner.call("resolve", {k: v for k, v in params.items() if v is not None})["checkpoint"]["id"])
    except SnapshotdError as error:
        fail(runner, error)


def _may_go_ahead(ctx: click.Context, question: str, yes: bool) -> bool:
    """Whether a destructive command may run: --yes, or a person at the terminal said yes.

    The question goes to stderr, so it is seen whatever stdout is piped to.
    """
    if yes:
        return True
    _refuse_without_terminal(ctx)
    return click.confirm(question, default=False, err=True)


def _confirm_preview(ctx: click.Context, method: str, params: dict[str, Any], yes: bool) -> dict[str, Any] | None:
    """Unless --yes or a dry run, show the dry run at the terminal and ask before writing anything.

    Returns None to go ahead, or the dry run's result when there is nothing
    to do or the answer was no.
    """
    runner: Runner = ctx.obj
    if yes or params.get("dry_run"):
        return None
    _refuse_without_terminal(ctx)
    try:
        preview = runner.call(method, {**{k: v for k, v in params.items() if v is not None}, "dry_run": True})
    except SnapshotdError as error:
        fail(runner, error)
    print_changes(preview, True, err=True)
    if (preview.get("written") or preview.get("deleted")) and click.confirm("Go ahead?", default=False, err=True):
        return None
    return preview


@click.command(cls=PathsAfterDashDash, context_settings=CONTEXT)
@click.argument("checkpoint_id", metavar="CHECKPOINT")
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
    where = reference_params([checkpoint_id], ref_session)
    if into and where:  # @ counts here, and the restore goes into the other worktree
        checkpoint_id = _resolved(ctx, {"checkpoint": checkpoint_id, **where})
        where = {}
    params = {
        "checkpoint": checkpoint_id,
        "paths": [os.path.abspath(p) for p in paths] or None,
        "dry_run": dry_run or None,
        "path": os.path.abspath(into) if into else where.get("path"),
        "session": where.get("session"),
        "allow_other_worktree": True if into else None,
    }
    if _confirm_preview(ctx, "restore", params, yes) is not None:
        return
    finishes = None if dry_run else Finishes("restore", params["path"])
    invoke(ctx, "restore", params, lambda r: print_changes(r, dry_run), progress="restoring", finishes=finishes)


@click.command(context_settings=CONTEXT)
@click.argument("path", default=".", type=click.Path(file_okay=False))
@yes_option
@json_option
@click.pass_context
def undo(ctx: click.Context, path: str, yes: bool, json_output: bool) -> None:
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
    params = {"checkpoint": found[0]["id"], "path": folder}
    if _confirm_preview(ctx, "restore", params, yes) is not None:
        return
    invoke(ctx, "restore", params, lambda r: print_changes(r, False), progress="undoing", finishes=Finishes("restore", folder))


@click.command(cls=PathsAfterDashDash, context_settings=CONTEXT)
@click.argument("source", metavar="FROM")
@click.argument("rest", nargs=-1, metavar="[TO] [PATHS...]")
@click.option("--dry-run", is_flag=True, help="Report what would change; change nothing.")
@click.option("--force", is_flag=True, help="Also take back paths changed since TO.")
@ref_session_option
@yes_option
@json_option
@click.pass_context
def revert(
    ctx: click.Context,
    source: str,
    rest: tuple[str, ...],
    dry_run: bool,
    force: bool,
    ref_session: str | None,
    yes: bool,
    json_output: bool,
) -> None:
    """Undo the changes from FROM to TO (default: the session's newest), leaving other work alone.

    TO is told from PATHS by its look (a checkpoint reference that is not an
    existing path); everything after `--` is a path.
    """
    target = None
    paths = list(rest)
    if paths and is_reference(paths[0]) and not os.path.exists(paths[0]):
        target = paths.pop(0)
    paths += paths_after_dash(ctx)
    params = {
        "from": source,
        "to": target,
        "paths": [os.path.abspath(p) for p in paths] or None,
        "dry_run": dry_run or None,
        "force": force or None,
        **reference_params([source, *([target] if target else [])], ref_session),
    }
    preview = _confirm_preview(ctx, "revert", params, yes)
    if preview is None:
        finishes = None if dry_run else Finishes("revert")
        preview = invoke(ctx, "revert", params, lambda r: print_changes(r, dry_run), progress="reverting", finishes=finishes)
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
            + f"{len(conflicts)} path(s) left unreverted: {names}{more}; pass --force to revert them anyway.",
            err=True,
        )
    sys.exit(1)


@click.command(context_settings=CONTEXT)
@click.argument("checkpoints", nargs=-1, metavar="CHECKPOINT... | --session S [PATH]")
@click.option("--session", metavar="S", help="Delete every checkpoint of this session (of PATH's worktree, default: here).")
@click.option("-C", "--path", "path", type=click.Path(file_okay=False), help="The worktree, with --session (same as PATH), or where @ and #N count.")
@yes_option
@json_option
@click.pass_context
def delete(ctx: click.Context, checkpoints: tuple[str, ...], session: str | None, path: str | None, yes: bool, json_output: bool) -> None:
    """Delete checkpoints by id, or every checkpoint of a session."""
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
    what = f"every checkpoint of session {session!r}" if session is not None else f"{len(checkpoints)} checkpoint(s)"
    if not _may_go_ahead(ctx, f"Delete {what}?", yes):
        return
    invoke(ctx, "delete", params, lambda r: click.echo(f"deleted {r['deleted']} checkpoint(s)"))


@click.command(context_settings=CONTEXT)
@click.argument("path", required=False, type=click.Path(file_okay=False))
@click.option("--keep", type=click.IntRange(min=0), metavar="N", help="Keep the newest N per session (default 50).")
@click.option("--older-than", "older_than", type=click.IntRange(min=0), metavar="SECONDS", help="Delete only those older than this.")
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
    if not dry_run and not _may_go_ahead(ctx, "Delete old checkpoints?", yes):
        return

    def human(result: dict[str, Any]) -> None:
        if not dry_run:
            click.echo(f"deleted {result['deleted']} checkpoint(s)")
            return
        if not result["would_delete"]:
            click.echo("nothing to delete")
        for item in result["would_delete"]:
            session = item["session"] if item["session"] is not None else "-"
            click.echo(f"would delete {len(item['checkpoints'])} checkpoint(s) of session {session} in {item['path']}")

    params = {
        "path": None if every else os.path.abspath(path or "."),
        "all": every or None,
        "keep": keep,
        "older_than_s": older_than,
        "dry_run": dry_run or None,
        "include_safety": include_safety or None,
    }
    invoke(ctx, "gc", params, human, progress="collecting")
