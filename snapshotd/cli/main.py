"""The ``snapshotd`` command line: parses, calls one method, prints.

Each command maps to one method of the contract. It talks to the daemon when
one answers on the socket (starting one in the background when none does),
or runs the same engine in-process with ``--embedded``. ``--json`` prints the
method's result object, or ``{"error": {...}}`` with exit status 1.

The commands live by group in :mod:`.checkpoints`, :mod:`.changes`,
:mod:`.admin` and :mod:`.agents`; this module is the group that holds them.
"""

from __future__ import annotations

import click

from snapshotd.cli import (
    admin,
    agents,
    changes,
    checkpoints,
    collect,
    terminal,
    transfer,
    turns,
    ui,
)
from snapshotd.cli.options import CONTEXT, json_option
from snapshotd.cli.output import let_output_carry_raw_names
from snapshotd.client.launcher import Runner
from snapshotd.fsutil import no_world_writes
from snapshotd.settings import VERSION


class _Commands(click.Group):
    """The group: a command whose reader went away (``| head``) ends by SIGPIPE, as git's do, not with click's 1."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            if not terminal.output_gone():
                raise  # a pipe of its own (the daemon's socket): the command's error, not its reader's leaving
            terminal.end_as_git_does()
            raise


@click.group(cls=_Commands, context_settings=CONTEXT)
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket (default: $SNAPSHOTD_SOCKET, then the runtime folder).")
@click.option("--embedded", is_flag=True, help="Run the operation in this process, without a daemon.")
@json_option
@click.option(
    "--color", "color", type=click.Choice(terminal.COLOR_CHOICES), default="auto", metavar="WHEN",
    help="Colour: auto (a terminal, unless NO_COLOR is set), always or never.",
)
@click.option("--no-pager", is_flag=True, help="Print diff, show, log and list directly, not through $PAGER (less).")
@click.version_option(VERSION, prog_name="snapshotd")
@click.pass_context
def main(ctx: click.Context, socket_path: str | None, embedded: bool, json_output: bool, color: str, no_pager: bool) -> None:
    """Git snapshots and checkpoints of working trees, for agent servers and people.

    Checkpoints are real git commits whose trees equal what `git add -A && git
    write-tree` gives on a copy of your index; your index, HEAD, branches and
    ignored files are never touched.

    References: a checkpoint is named by its id (7 or more hex digits), @ (the
    newest of the session here), @~N, #N (the seq `list` shows), SESSION@ or
    SESSION@~N. Completion for bash, zsh and fish: see snapshotd(1), COMPLETION.
    """
    let_output_carry_raw_names()
    no_world_writes()
    terminal.set_up(ctx, color, no_pager)
    ctx.obj = Runner(socket_path, embedded, json_output)



for _command in (
    checkpoints.checkpoint,
    checkpoints.list_,
    checkpoints.show,
    checkpoints.resolve,
    checkpoints.diff,
    turns.log,
    changes.restore,
    changes.undo,
    changes.revert,
    collect.delete,
    collect.gc,
    transfer.push,
    transfer.fetch,
    admin.serve,
    admin.status,
    admin.verify,
    admin.open_,
    admin.worktrees,
    admin.stop,
    admin.ping,
    admin.repair,
    admin.forget,
    admin.completion,
    agents.hook,
    agents.integrate,
    agents.mcp,
    agents.doctor,
    ui.ui,
):
    main.add_command(_command)
main.add_command(admin.stop, name="shutdown")  # the method's own name

if __name__ == "__main__":
    main()
