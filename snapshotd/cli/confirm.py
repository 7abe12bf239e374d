"""Asking before a command changes files or deletes checkpoints.

It goes ahead with ``--yes``, or when a person at the terminal, shown what
would happen, says yes. Without a terminal on stdin nobody can answer: that
is one error (JSON under ``--json``) pointing to ``--yes``. A declined
question says that nothing changed. Questions and listings go to stderr, so
they are seen whatever stdout is piped to.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import click

from snapshotd.cli.options import fail, use_json
from snapshotd.cli.output import print_changes
from snapshotd.errors import NeedsForce, SnapshotdError

DECLINED = "nothing changed"


def refuse_without_terminal(ctx: click.Context) -> None:
    """Nobody can answer a question without a terminal on stdin: fail, pointing to --yes."""
    if not sys.stdin.isatty():
        fail(
            use_json(ctx),
            NeedsForce(
                f"'{ctx.info_name}' changes things and stdin is not a terminal to ask on; pass --yes (-y) to go ahead."
            ),
        )


def ask(question: str) -> bool:
    """Ask at the terminal; a no says that nothing changed."""
    if click.confirm(question, default=False, err=True):
        return True
    click.echo(DECLINED, err=True)
    return False


def may_go_ahead(ctx: click.Context, question: str, yes: bool, listing: Iterable[str] = ()) -> bool:
    """Whether to go ahead: --yes, or a person at the terminal, shown ``listing``, says yes."""
    if yes:
        return True
    refuse_without_terminal(ctx)
    for line in listing:
        click.echo(line, err=True)
    return ask(question)


def call_or_fail(ctx: click.Context, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One call whose failure ends the command, as :func:`~.options.invoke` would end it."""
    runner = use_json(ctx)
    try:
        return runner.call(method, {key: value for key, value in params.items() if value is not None})
    except SnapshotdError as error:
        fail(runner, error)


def confirm_preview(ctx: click.Context, method: str, params: dict[str, Any], yes: bool) -> dict[str, Any] | None:
    """Unless --yes or a dry run, show the dry run at the terminal and ask before writing anything.

    Returns None to go ahead, or the dry run's result when there is nothing
    to do or the answer was no.
    """
    if yes or params.get("dry_run"):
        return None
    preview = call_or_fail(ctx, method, {**params, "dry_run": True})  # a bad reference is told first
    refuse_without_terminal(ctx)
    print_changes(preview, True, err=True)
    if (preview.get("written") or preview.get("deleted")) and ask("Go ahead?"):
        return None
    return preview
