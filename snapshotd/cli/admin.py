"""The commands that run and look after the daemon and its worktrees.

``serve``, ``status``, ``verify``, ``open``, ``worktrees``, ``stop``, ``ping``,
``repair``, ``forget``, and ``completion`` (the shell's completion script).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from click.shell_completion import get_completion_class

from snapshotd.cli.completion import SHELLS
from snapshotd.cli.health import print_status
from snapshotd.cli.options import CONTEXT, emit, fail, invoke, json_option, use_json
from snapshotd.cli.output import short_id
from snapshotd.client.launcher import Runner, os_message
from snapshotd.errors import Busy, SnapshotdError
from snapshotd.settings import resolve_socket_path


@click.command(context_settings=CONTEXT)
@click.option("--socket", "socket_path", metavar="PATH", help="Listen on this socket.")
@click.option("--allow-root", is_flag=True, help="Also serve connections from root.")
@click.option("--size-cap", type=click.IntRange(min=0), metavar="BYTES", help="Leave out untracked files larger than this (0: no cap).")
@click.option("--no-watch", is_flag=True, help="Do not watch worktrees; every capture scans.")
@click.option(
    "--max-connections", type=click.IntRange(min=1), metavar="N",
    help="Serve at most N connections at once (default: $SNAPSHOTD_MAX_CONNECTIONS, else 4096).",
)
@click.pass_context
def serve(
    ctx: click.Context,
    socket_path: str | None,
    allow_root: bool,
    size_cap: int | None,
    no_watch: bool,
    max_connections: int | None,
) -> None:
    """Run the daemon in the foreground until stopped (SIGTERM, Ctrl-C or `snapshotd stop`)."""
    from snapshotd.daemon import run_daemon

    runner: Runner = ctx.obj
    try:
        run_daemon(
            socket_path or runner.socket_path,
            allow_root=allow_root,
            size_cap=size_cap,
            watch=not no_watch,
            max_connections=max_connections,
        )
    except Busy as error:
        _serve_failed(error.message)
    except OSError as error:  # PermissionError, FileExistsError, NotADirectoryError, a path too long
        _serve_failed(os_message(error))
    except ValueError as error:  # an inherited socket that is not a Unix stream socket, a bad setting
        _serve_failed(str(error))


def _serve_failed(message: str) -> None:
    click.echo(click.style("error: ", fg="red", bold=True) + " ".join(message.split()), err=True)
    sys.exit(1)



@click.command(context_settings=CONTEXT)
@click.argument("path", required=False, type=click.Path(file_okay=False))
@json_option
@click.pass_context
def repair(ctx: click.Context, path: str | None, json_output: bool) -> None:
    """Re-attach worktrees that moved (PATH: the new place of one), keeping ids and checkpoints."""

    def human(result: dict[str, Any]) -> None:
        moved = {item["worktree"] for item in result["moved"]}
        links = [item for item in result.get("mended") or [] if item["worktree"] not in moved]
        if not result["moved"] and not links:
            click.echo("nothing moved")
        for item in result["moved"]:
            click.echo(f"{item['worktree']}  {item['from']} -> {item['to']}")
        for item in links:
            click.echo(f"{item['worktree']}  {item['path']}: git's link to it mended ('git worktree list' showed it prunable)")
        gone = result.get("gone") or []
        if gone:
            count = f"{len(gone)} worktree{'s' if len(gone) != 1 else ''}"
            click.echo(f"{count} gone (deleted, or moved elsewhere):")
            for item in gone:
                click.echo(f"  {item['worktree']}  {item['path']}")
            click.echo("if one moved, run 'snapshotd repair NEW_PATH'; if it was deleted, 'snapshotd forget PATH|ID'")

    invoke(ctx, "repair", {"path": os.path.abspath(path) if path else None}, human)


@click.command(context_settings=CONTEXT)
@click.argument("target", metavar="PATH|ID")
@json_option
@click.pass_context
def forget(ctx: click.Context, target: str, json_output: bool) -> None:
    """Forget a worktree that is gone (deleted on purpose): the daemon drops it and its record.

    PATH is where the worktree was, ID its id (wt_..., as `worktrees` and
    `status` show). A worktree still there is refused. Its checkpoints are
    not deleted: in a repository's shared store (linked worktrees) they stay
    reachable until `snapshotd gc`; a worktree made at that path later is a
    new one, with a new id.
    """

    def human(result: dict[str, Any]) -> None:
        for item in result["forgotten"]:
            click.echo(f"forgot {item['worktree']}  {item['path']}")

    is_id = target.startswith("wt_") and "/" not in target and not os.path.exists(target)
    params = {"worktree": target} if is_id else {"path": os.path.abspath(target)}
    invoke(ctx, "forget", params, human)


def _problem(wt: dict[str, Any]) -> None:
    """Under a worktree's line: that it is gone or moved (with the remedy), or why it is not watched."""
    if wt.get("presence") not in (None, "here"):
        shown = wt["presence"] if wt["presence"] == "removed" else click.style(wt["presence"], fg="red")
        click.echo(f"    {shown}: {wt.get('problem')}")
    elif wt.get("watch_error"):
        click.echo(f"    cold: {wt['watch_error']}")


@click.command(context_settings=CONTEXT)
@click.option("-v", "--verbose", is_flag=True, help="Also the daemon's counters.")
@json_option
@click.pass_context
def status(ctx: click.Context, verbose: bool, json_output: bool) -> None:
    """A table of the daemon's worktrees and one health line (--verbose adds the counters)."""

    runner: Runner = ctx.obj

    def human(result: dict[str, Any]) -> None:
        print_status(result, verbose, runner.embedded)

    invoke(ctx, "status", {}, human)


@click.command(context_settings=CONTEXT)
@click.argument("path", default=".", type=click.Path(file_okay=False))
@json_option
@click.pass_context
def verify(ctx: click.Context, path: str, json_output: bool) -> None:
    """Compare the daemon's warm state of the worktree holding PATH with a full scan; exit 1 on a difference."""

    def human(result: dict[str, Any]) -> None:
        for difference in result["differences"]:
            click.echo(f"{difference['path']}: {difference['cause']}")
        if not result["differences"]:
            click.echo(f"no difference (full scan {result['scan_ms']:.0f} ms)")

    result = invoke(ctx, "verify", {"path": os.path.abspath(path)}, human, progress="scanning")
    if result["differences"]:
        sys.exit(1)


@click.command(name="open", context_settings=CONTEXT)
@click.argument("path", default=".", type=click.Path(file_okay=False))
@json_option
@click.pass_context
def open_(ctx: click.Context, path: str, json_output: bool) -> None:
    """Open (register) the worktree holding PATH and show it."""

    def human(result: dict[str, Any]) -> None:
        wt = result["worktree"]
        click.echo(f"{wt['id']}  {wt['kind']}  {wt['path']}  {wt.get('branch') or ''} {short_id(wt.get('head'))}")

    invoke(ctx, "open", {"path": os.path.abspath(path)}, human)


@click.command(context_settings=CONTEXT)
@json_option
@click.pass_context
def worktrees(ctx: click.Context, json_output: bool) -> None:
    """List the worktrees the daemon has open."""

    def human(result: dict[str, Any]) -> None:
        if not result["worktrees"]:
            click.echo("no worktrees open")
        for wt in result["worktrees"]:
            click.echo(f"{wt['id']}  {wt['kind']:<5} {wt['path']}")
            _problem(wt)
            if wt.get("watched_folders") is not None:
                left_out = wt.get("unwatched_ignored") or []
                shown = f"; not watched, as git ignores them: {', '.join(left_out)}" if left_out else ""
                click.echo(f"    watching {wt['watched_folders']} folders{shown}")

    invoke(ctx, "worktrees", {}, human)


@click.command(context_settings=CONTEXT)
@json_option
@click.pass_context
def stop(ctx: click.Context, json_output: bool) -> None:
    """Stop the daemon cleanly (`stop` and `shutdown` are one command); returns once it has stopped, saying whether one ran."""
    runner = use_json(ctx)
    if runner.embedded:
        raise click.UsageError("--embedded runs no daemon, so there is none to stop.")
    where = os.path.abspath(resolve_socket_path(runner.socket_path))

    def human(result: dict[str, Any]) -> None:
        click.echo(f"stopped the daemon on {where}" if result["stopped"] else f"no daemon was running on {where}")

    try:
        runner.call("shutdown", {})
    except SnapshotdError as error:
        fail(runner, error)
    emit(runner, {"stopped": runner.daemon_was_running, "socket": where}, human)


@click.command(context_settings=CONTEXT)
@json_option
@click.pass_context
def ping(ctx: click.Context, json_output: bool) -> None:
    """Check that the daemon answers (starting it if needed); show its version and pid."""

    def human(result: dict[str, Any]) -> None:
        click.echo(f"snapshotd {result['version']}  pid {result['pid']}  up {result['uptime_s']:.1f} s")

    invoke(ctx, "ping", {}, human)


@click.command(context_settings=CONTEXT)
@click.argument("shell", type=click.Choice(SHELLS), metavar="bash|zsh|fish")
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script of a shell: bash, zsh or fish.

    \b
    bash:  eval "$(snapshotd completion bash)"   in ~/.bashrc
    zsh:   eval "$(snapshotd completion zsh)"    in ~/.zshrc
    fish:  snapshotd completion fish > ~/.config/fish/completions/snapshotd.fish
    """
    root = ctx.find_root()
    script = get_completion_class(shell)
    assert script is not None  # every one of SHELLS is click's own
    click.echo(script(root.command, {}, root.info_name or "snapshotd", "_SNAPSHOTD_COMPLETE").source())
