"""The commands that take and read checkpoints: ``checkpoint``, ``list``, ``show`` and ``diff``."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import click

from snapshotd.cli.completion import complete_session
from snapshotd.cli.confirm import call_or_fail
from snapshotd.cli.diffstat import stat_lines
from snapshotd.cli.options import (
    CONTEXT,
    COUNT,
    SESSION_NAME,
    AtMost,
    PathsAfterDashDash,
    emit,
    fail,
    invoke,
    json_option,
    paths_after_dash,
    ref_session_option,
    reference_argument,
    reference_params,
    refuse_missing_paths,
    use_json,
)
from snapshotd.cli.output import (
    checkpoint_line,
    print_patch,
    skip_reason,
)
from snapshotd.cli.turns import no_refs_with_turn, turn_option, turn_range
from snapshotd.contract.params import MAX_CONTEXT
from snapshotd.contract.refs import is_reference, is_relative
from snapshotd.errors import NotFound, SnapshotdError
from snapshotd.paths import quote_path
from snapshotd.wording import one_line, plural

_STATUS_LETTERS = {"added": "A", "modified": "M", "deleted": "D", "renamed": "R", "type_changed": "T"}
_STATUS_COLOURS = {"A": "green", "M": "yellow", "D": "red", "R": "cyan", "T": "magenta"}

def print_files(files: list[dict[str, Any]]) -> None:
    """One line per changed file: its letter and name, quoted as git quotes them; a rename is ``old -> new``."""
    for change in files:
        old_path = change.get("old_path")
        name = f"{quote_path(old_path)} -> {quote_path(change['path'])}" if old_path else quote_path(change["path"])
        letter = _STATUS_LETTERS.get(change["status"], "?")
        click.echo(f"{click.style(letter, fg=_STATUS_COLOURS.get(letter))}  {name}")


@click.command(context_settings=CONTEXT)
@click.argument("path", default=".", type=click.Path(file_okay=False))
@click.option("-m", "--label", metavar="LABEL", help="A label for the checkpoint.")
@click.option("--session", metavar="S", type=SESSION_NAME, shell_complete=complete_session, help="The session (agent thread) the checkpoint belongs to.")
@click.option("--exact", is_flag=True, help="Scan the whole worktree even when a watcher is warm.")
@click.option("--force", is_flag=True, help="Checkpoint even your home folder or /.")
@json_option
@click.pass_context
def checkpoint(
    ctx: click.Context, path: str, label: str | None, session: str | None, exact: bool, force: bool, json_output: bool
) -> None:
    """Record the worktree holding PATH as a checkpoint."""

    def human(result: dict[str, Any]) -> None:
        cp, stats = result["checkpoint"], result["stats"]
        click.echo(checkpoint_line(cp))
        detail = f"{stats['scan']} scan, {stats['hashed']} hashed, {plural(stats['processes'], 'process')}, {stats['ms']:.0f} ms"
        click.echo(click.style(detail, dim=True))
        for item in stats["skipped_files"]:
            click.echo(click.style(f"left out {item['path']}: {skip_reason(item)}", fg="magenta"), err=True)

    params = {"path": os.path.abspath(path), "label": label, "session": session, "exact": exact or None, "force": force or None}
    invoke(ctx, "checkpoint", params, human, progress="capturing", ask_force=True)


@click.command(name="list", context_settings=CONTEXT)
@click.argument("path", default=".", type=click.Path(file_okay=False))
@click.option("--session", metavar="S", type=SESSION_NAME, shell_complete=complete_session, help="Only this session's checkpoints.")
@click.option("--limit", type=COUNT, metavar="N", help="At most N, newest first.")
@click.option(
    "--remote", is_flag=False, flag_value="", default=None, metavar="[REMOTE]",
    help="Also the checkpoints fetched from REMOTE (from every remote when no name follows).",
)
@json_option
@click.pass_context
def list_(
    ctx: click.Context, path: str, session: str | None, limit: int | None, remote: str | None, json_output: bool
) -> None:
    """List the checkpoints of the worktree holding PATH, newest first."""

    def human(result: dict[str, Any]) -> None:
        if not result["checkpoints"] and limit != 0:  # --limit 0 asks for none, it does not find none
            click.echo("no checkpoints" if remote is None else "no checkpoints here or fetched; 'snapshotd fetch' brings a remote's")
        width = max((len(one_line(cp.get("session") or "-")) for cp in result["checkpoints"]), default=12)
        seq_width = max((len(str(cp["seq"])) for cp in result["checkpoints"]), default=4)
        for cp in result["checkpoints"]:
            origin = f"  {click.style(_where_taken(cp), fg='cyan')}" if "remote" in cp else ""
            click.echo(checkpoint_line(cp, max(width, 12), max(seq_width, 4)) + origin)

    params = {"path": os.path.abspath(path), "session": session, "limit": limit, "remote": True if remote == "" else remote}
    invoke(ctx, "list", params, human)


def _where_taken(cp: dict[str, Any]) -> str:
    """A fetched checkpoint's origin for ``list``: the remote, the machine it was taken on, its worktree id."""
    host = f"{one_line(cp['host'])} " if cp.get("host") else ""
    return f"{cp['remote']} {host}{cp['worktree']}"


def _origin(cp: dict[str, Any]) -> str:
    """What ``show`` adds to a fetched checkpoint's worktree: where it was fetched from and taken."""
    if not cp.get("remote"):
        return ""
    return f" (fetched from {cp['remote']}" + (f", taken on {one_line(cp['host'])})" if cp.get("host") else ")")


def _session_name(session: str | None) -> str:
    return "the default session" if session is None else f"session {one_line(session)}"


def print_header(cp: dict[str, Any]) -> None:
    """The checkpoint as ``git show`` heads a commit: id, then session and seq, label, time, base, tree, agent ids."""
    click.echo(click.style(f"checkpoint {cp['id']}", fg="yellow"))
    rows = [
        ("Session", f"{'(default)' if cp['session'] is None else one_line(cp['session'])}, #{cp['seq']}"),
        ("Label", one_line(cp["label"]) if cp.get("label") else "-"),
        ("Date", f"{cp['created_at'].replace('T', ' ').removesuffix('Z')} UTC"),
        ("Base", cp.get("base") or "- (no commit yet)"),
        ("Tree", cp["tree"]),
        ("Worktree", cp["worktree"] + _origin(cp)),
        ("Previous", cp.get("parent") or f"- (the first of {_session_name(cp['session'])})"),
        ("Changed", "yes" if cp.get("changed", True) else "no (the same tree as the previous)"),
    ]
    # the agent's ids, as its Snapshotd-Agent-* trailers: one per line, the first headed
    rows += [("Agent" if n == 0 else "", f"{key} {value}") for n, (key, value) in enumerate((cp.get("agent") or {}).items())]
    for name, value in rows:
        click.echo(f"{name + ':' if name else '':<10} {value}")


def _print_changes(ctx: click.Context, cp: dict[str, Any], patch: bool, since: str | None = None) -> None:
    """The files ``cp`` changed against ``since`` (default: the previous checkpoint of its session), and the patch."""
    since = since or cp.get("parent")
    if not since:
        click.echo(f"\nno previous checkpoint to compare with; git show {cp['id'][:12]} compares it with its base")
        return
    runner = use_json(ctx)
    try:
        result = runner.call("diff", {"from": since, "to": cp["id"], **({"patch": True} if patch else {})})
    except NotFound:
        click.echo(f"\nthe previous checkpoint {since[:12]} was deleted, so there is nothing to compare with")
        return
    except SnapshotdError as error:
        fail(runner, error)
    click.echo("")
    if not result["files"]:
        click.echo("no changes")
    print_files(result["files"])
    if patch and result.get("patch"):
        click.echo("")
        print_patch(result["patch"])


@click.command(context_settings=CONTEXT)
@reference_argument("checkpoint_id", "[CHECKPOINT]", required=False)
@click.option("-p", "--patch", is_flag=True, help="Also the patch against the previous checkpoint (of a turn: its start).")
@turn_option
@ref_session_option
@json_option
@click.pass_context
def show(
    ctx: click.Context, checkpoint_id: str | None, patch: bool, turn: int | None, ref_session: str | None, json_output: bool
) -> None:
    """Show one checkpoint and the files it changed against the previous one of its session.

    CHECKPOINT is an id (7+ hex digits), @, @~N, #N, SESSION@ or SESSION@~N.
    With --turn N: turn N of `snapshotd log`, its last checkpoint and what the
    whole turn changed.
    """
    if turn is None:
        if checkpoint_id is None:
            raise click.UsageError("show needs CHECKPOINT (such as @ or #3) or --turn N; `snapshotd list` lists them.")

        def human(result: dict[str, Any]) -> None:
            print_header(result["checkpoint"])
            _print_changes(ctx, result["checkpoint"], patch)

        invoke(ctx, "show", {"checkpoint": checkpoint_id, **reference_params([checkpoint_id], ref_session)}, human)
        return
    no_refs_with_turn(ctx, [checkpoint_id] if checkpoint_id else [])
    found = turn_range(ctx, os.path.abspath("."), ref_session, turn)
    shown = call_or_fail(ctx, "show", {"checkpoint": found.end})

    def human_turn(result: dict[str, Any]) -> None:
        mark = " (open: no stop recorded yet)" if found.open else ""
        click.echo(f"{click.style(f'turn {found.turn}', fg='yellow')}: {one_line(found.prompt)}{mark}")
        click.echo(f"{'Spans:':<10} #{found.start_seq}..#{found.end_seq} of {_session_name(found.session)}")
        print_header(result["checkpoint"])
        _print_changes(ctx, result["checkpoint"], patch, since=found.start)

    emit(use_json(ctx), {**shown, "turn": asdict(found)}, human_turn)


@click.command(context_settings=CONTEXT)
@reference_argument("checkpoint_id", "CHECKPOINT")
@ref_session_option
@json_option
@click.pass_context
def resolve(ctx: click.Context, checkpoint_id: str, ref_session: str | None, json_output: bool) -> None:
    """Print the full id of the checkpoint a reference names (for git: `git show $(snapshotd resolve @)`)."""
    params = {"checkpoint": checkpoint_id, **reference_params([checkpoint_id], ref_session)}
    invoke(ctx, "resolve", params, lambda result: click.echo(result["checkpoint"]["id"]))



@click.command(cls=PathsAfterDashDash, context_settings=CONTEXT)
@reference_argument("source", "FROM", required=False)
@reference_argument("target", "[TO]", required=False)
@click.argument("paths", nargs=-1, metavar="[-- PATHS...]")
@click.option("--stat", is_flag=True, help="Lines added and removed per file, as git diff --stat (with --patch: both).")
@click.option("--name-status", is_flag=True, help="One letter and a path per file (the default; over --stat and --patch, as in git).")
@click.option("-p", "--patch", is_flag=True, help="The unified patch.")
@click.option("-U", "--context", type=AtMost(MAX_CONTEXT), metavar="N", help="Lines of context in the patch.")
@click.option("-C", "--path", "path", metavar="PATH", type=click.Path(file_okay=False), help="The worktree, for 'worktree', @ and #N (default: here).")
@turn_option
@ref_session_option
@json_option
@click.pass_context
def diff(
    ctx: click.Context,
    source: str | None,
    target: str | None,
    paths: tuple[str, ...],
    stat: bool,
    name_status: bool,
    patch: bool,
    context: int | None,
    path: str | None,
    turn: int | None,
    ref_session: str | None,
    json_output: bool,
) -> None:
    """Show what changed from FROM to TO (a checkpoint or 'worktree', the default TO).

    PATHS (after `--`) limit the comparison to those files and folders.
    With --turn N, FROM and TO are turn N's first and last checkpoints.
    """
    if turn is not None:
        no_refs_with_turn(ctx, [ref for ref in (source, target) if ref is not None])
        found = turn_range(ctx, os.path.abspath(path or "."), ref_session, turn)
        source, target = found.start, found.end
    elif source is None:
        raise click.UsageError("diff needs FROM (a checkpoint) or --turn N; `snapshotd log` lists the turns.")
    if target is not None and target != "worktree" and not is_reference(target):
        refuse_missing_paths([target])  # TO is told from a path by its look, as revert tells it
        paths = (target, *paths)
        target = None
    target = target or "worktree"

    patch = patch or context is not None  # -U implies the patch, as in git
    if name_status:
        stat = patch = False

    def human(result: dict[str, Any]) -> None:
        if stat and result["files"]:
            for line in stat_lines(result["files"]):
                click.echo(line)
            if patch:
                click.echo("")
        if patch:
            print_patch(result.get("patch", ""))
        elif not result["files"]:
            click.echo("no changes")
        elif not stat:
            print_files(result["files"])

    needs_worktree = "worktree" in (source, target)
    refuse_missing_paths(paths)
    paths = (*paths, *paths_after_dash(ctx))
    params = {
        "from": source,
        "to": target,
        "paths": [os.path.abspath(p) for p in paths] or None,
        "patch": True if patch else None,
        "context": context,
        "path": os.path.abspath(path or ".") if needs_worktree or path else None,
        **reference_params([source, target], ref_session, path),
    }
    named = [ref for ref in (source, target) if ref != "worktree"]
    if needs_worktree and path is None and named and not is_relative(named[0]):
        # An id compares with its own worktree from any folder, as restore acts on it.
        found = call_or_fail(ctx, "resolve", {"checkpoint": named[0]})["checkpoint"]
        if "remote" not in found:  # a fetched one's worktree is on another machine: it compares with this one
            params = {**params, "path": None, "worktree": found["worktree"]}
    invoke(ctx, "diff", params, human, progress="comparing", paged=patch)
