"""``snapshotd ui``: the timeline of every worktree in the browser, served on loopback by this process."""

from __future__ import annotations

import os
import webbrowser

import click

from snapshotd.cli.options import CONTEXT, fail, json_option, use_json
from snapshotd.cli.output import to_json
from snapshotd.errors import SnapshotdError, Unsupported
from snapshotd.settings import resolve_socket_path


@click.command(name="ui", context_settings=CONTEXT)
@click.argument("path", required=False, type=click.Path(file_okay=False))
@click.option("--no-open", is_flag=True, help="Print the address; do not open a browser.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="Port on 127.0.0.1 (0: any free one).")
@json_option
@click.pass_context
def ui(ctx: click.Context, path: str | None, no_open: bool, port: int, json_output: bool) -> None:
    """A local web page: every worktree's turns, their diffs, restore, revert and undo.

    It listens on 127.0.0.1 only, on a random port, and answers only with
    the random token in the address it prints (kept, mode 0600, in
    snapshotd's home under ui/). With PATH, the page opens on that worktree.
    Ctrl-C stops it. With --json the address is one line of JSON
    ({"url", "port", "token_file"}).
    """
    runner = use_json(ctx)
    if runner.embedded:
        fail(runner, Unsupported("The page needs the daemon (it hears of new checkpoints from it); drop --embedded."))
    try:
        runner.call("ping", {})  # starts a daemon when none answers
        focus = runner.call("open", {"path": os.path.abspath(path)})["worktree"]["id"] if path else None
    except SnapshotdError as error:
        fail(runner, error)
    try:
        from snapshotd.ui.serve import Address, run
    except ImportError as error:
        raise click.ClickException(
            f"The page needs the ui extra ({error.name} is missing): pip install 'snapshotd[ui]'."
        ) from error

    def announce(address: Address) -> None:
        if runner.json:
            click.echo(to_json({"url": address.url, "port": address.port, "token_file": str(address.token_file)}, indent=None))
        else:
            click.echo(f"snapshotd ui: {address.url}")
            click.echo(click.style(f"(the address is also in {address.token_file}; Ctrl-C stops)", dim=True))
        if not no_open:
            webbrowser.open(address.url)

    try:
        run(resolve_socket_path(runner.socket_path), focus, announce, port)
    except OSError as error:
        raise click.ClickException(f"Cannot serve the page on 127.0.0.1:{port}: {error.strerror or error}.") from error
    except KeyboardInterrupt:
        pass
