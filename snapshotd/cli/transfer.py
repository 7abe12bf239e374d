"""``push`` and ``fetch``: a worktree's checkpoints to and from a remote, over git's own transport."""

from __future__ import annotations

import os
from typing import Any

import click

from snapshotd.cli.options import CONTEXT, invoke, json_option
from snapshotd.store.refnames import session_of_key
from snapshotd.wording import plural


def _where(args: tuple[str, ...]) -> tuple[str, str | None]:
    """(PATH, REMOTE) from ``[PATH] [REMOTE]``: one word alone is PATH when it is a folder, else REMOTE."""
    if len(args) > 2:
        raise click.UsageError("give at most PATH and REMOTE.")
    if len(args) == 2:
        return args[0], args[1]
    if len(args) == 1 and not os.path.isdir(args[0]):
        return ".", args[0]
    return (args[0] if args else "."), None


def _sessions(refs: list[str]) -> str:
    """The sessions of ``refs/snapshotd/<worktree>/<key>`` names, as people gave them."""
    names = (session_of_key(ref.rsplit("/", 1)[-1]) for ref in refs)
    return ", ".join("the default session" if name is None else name for name in names)


@click.command(context_settings=CONTEXT)
@click.argument("where", nargs=-1, metavar="[PATH] [REMOTE]")
@click.option("--force", is_flag=True, help="Replace what the last fetch saw on the remote (after 'snapshotd fetch').")
@click.option(
    "--background/--no-background", default=None,
    help="From now on also push after every checkpoint of this worktree (the daemon does, batched), or stop.",
)
@json_option
@click.pass_context
def push(ctx: click.Context, where: tuple[str, ...], force: bool, background: bool | None, json_output: bool) -> None:
    """Send the checkpoints of the worktree holding PATH to REMOTE (default: snapshotd.remote, the upstream, origin).

    Only refs/snapshotd/<worktree>/<session> move on the remote, each only
    if it still holds what this machine last pushed there.
    """
    path, remote = _where(where)

    def human(result: dict[str, Any]) -> None:
        if result["pushed"]:
            pushed = result["pushed"]
            click.echo(f"pushed {plural(len(pushed), 'session')} to {result['remote']}: {_sessions(pushed)}")
        else:
            click.echo(f"{result['remote']} is up to date ({plural(len(result['up_to_date']), 'session')})")
        if "background" in result:
            click.echo("pushing after every checkpoint from now on" if result["background"] else "background push off")

    params = {"path": os.path.abspath(path), "remote": remote, "force": force or None, "background": background}
    invoke(ctx, "push", params, human, progress="pushing")


@click.command(context_settings=CONTEXT)
@click.argument("where", nargs=-1, metavar="[PATH] [REMOTE]")
@json_option
@click.pass_context
def fetch(ctx: click.Context, where: tuple[str, ...], json_output: bool) -> None:
    """Bring REMOTE's checkpoints here, under refs/snapshotd-remote/<remote>/; 'list --remote' shows them."""
    path, remote = _where(where)

    def human(result: dict[str, Any]) -> None:
        if result["fetched"]:
            click.echo(f"fetched {plural(len(result['fetched']), 'session')} from {result['remote']}")
        else:
            click.echo(f"nothing new on {result['remote']}")

    invoke(ctx, "fetch", {"path": os.path.abspath(path), "remote": remote}, human, progress="fetching")
