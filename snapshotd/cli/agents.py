"""The commands that plug snapshotd into agent tools: ``hook``, ``integrate`` and ``mcp``.

They only parse and call into :mod:`snapshotd.agents.hooks`,
:mod:`snapshotd.agents.integrate` and :mod:`snapshotd.agents.mcp`;
:mod:`.main` registers them on the main group.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from snapshotd.agents.payload import EVENT_SETS, INTEGRATIONS
from snapshotd.cli.options import CONTEXT, fail, json_option, use_json
from snapshotd.cli.output import to_json
from snapshotd.client.launcher import Runner
from snapshotd.errors import SnapshotdError


@click.command(context_settings=CONTEXT)
@click.argument("tool", metavar="claude-code|codex", required=False, default="")
@click.option("--budget", type=float, metavar="SECONDS", help="Wait at most this long for the checkpoint (default: 55 before a prompt or a tool, else 0: it finishes in the background).")
@click.pass_context
def hook(ctx: click.Context, tool: str, budget: float | None) -> None:
    """Checkpoint the worktree for one hook payload of the agent on stdin; always exits 0.

    The label says what happened (`before: <prompt>`, `after turn`, `after Bash:
    <command>`) and the session is the agent's session id. A hook before a
    prompt or a tool returns once its checkpoint is recorded; the others hand
    it to a background process at once. A failure is one line on stderr and, at
    most once in ten minutes, one line for the user as the agent's
    `systemMessage` on stdout. `integrate` installs the same hook as a lighter
    program (`python -I -S .../snapshotd/agents/hookentry.py TOOL`).
    """
    from snapshotd.agents.hookentry import main

    runner: Runner = ctx.obj
    sys.exit(main([tool], runner.socket_path, budget))


def _what_changed(change: Any, our_handlers: Any, tool: str) -> str:
    """One line naming the events snapshotd's hooks were added to or taken from."""
    before, after = ({event for event, _, _ in our_handlers(text or "", tool)} for text in (change.old, change.new))
    if not before:
        return f"added snapshotd's hooks ({', '.join(sorted(after))}) to {change.path}"
    parts = [f"{label} {', '.join(sorted(events))}" for label, events in (("added", after - before), ("removed", before - after)) if events]
    detail = "; ".join(parts) or "same events, entries rewritten"
    return f"snapshotd's hooks in {change.path} now run at {', '.join(sorted(after))} ({detail})"


def _opencode_message(change: Any, remove: bool) -> str:
    """What happened to the OpenCode plug-in file, in one line."""
    from snapshotd.agents import opencode

    if remove:
        return f"removed snapshotd's OpenCode plug-in {change.path}"
    events = opencode.events_of(change.new) or ""
    before = opencode.events_of(change.old)
    what = f"it checkpoints {opencode.EVENT_WORDS.get(events, events)}"
    if before is None:
        return f"installed snapshotd's OpenCode plug-in at {change.path}; {what}"
    if before != events:
        return f"snapshotd's OpenCode plug-in at {change.path} now takes --events {events} (was {before}); {what}"
    return f"rewrote snapshotd's OpenCode plug-in at {change.path} (new paths to the Node client or to snapshotd); {what}"


def _tracked_local_settings(path: Path) -> list[str]:
    """A warning when git does not ignore the local settings file: checkpoints then hold it, and a restore to
    one from before it deletes it (Claude Code ignores it only when it made the file itself)."""
    from snapshotd.git.process import GitTarget, run_git_sync
    from snapshotd.store.identity import locate

    located = locate(str(path.parent.parent))
    if located.git_dir is None:
        return []
    name = os.path.relpath(path, located.root)
    if run_git_sync(GitTarget(located.git_dir, located.root), ["check-ignore", "--", name], ok_codes=(0, 1)).strip():
        return []
    return [f"git does not ignore {name}, so checkpoints hold it and restoring one from before it removes it; "
            f"add '/{name}' to .git/info/exclude (or .gitignore) to keep it out of git."]


@click.command(context_settings=CONTEXT)
@click.argument("tool", type=click.Choice(INTEGRATIONS), metavar="claude-code|codex|opencode")
@click.option("--project", "scope", flag_value="project", help="The worktree's settings (.claude/settings.json, .codex/hooks.json, .opencode/plugins/).")
@click.option("--user", "scope", flag_value="user", default=True, help="Your own settings in your home folder (default; OpenCode: ~/.config/opencode/plugins/).")
@click.option("--local", "scope", flag_value="local", help="Claude Code only: your own settings for the worktree (.claude/settings.local.json; a warning unless git ignores it).")
@click.option("--events", type=click.Choice(EVENT_SETS), default="turns", show_default=True, help="turns: before each prompt and after each turn; tools: also after each edit or shell tool (OpenCode: before and after).")
@click.option("--remove", is_flag=True, help="Take snapshotd's hook entries (OpenCode: its plug-in file) out again.")
@click.option("--dry-run", is_flag=True, help="Show the change as a diff; write nothing.")
@json_option
@click.pass_context
def integrate(ctx: click.Context, tool: str, scope: str, events: str, remove: bool, dry_run: bool, json_output: bool) -> None:
    """Add snapshotd's hooks to the settings of Claude Code or Codex, or its plug-in to OpenCode (or remove them).

    Other settings and hooks stay as they were, byte for byte; running it
    twice changes nothing. For OpenCode, a file `snapshotd.js` in its plug-in
    folder imports snapshotd's Node client by absolute path.
    """
    from snapshotd.agents import (
        integrate as integrate_mod,  # difflib, tomllib: kept off the hook's start-up path
    )

    runner = use_json(ctx)
    try:
        change = integrate_mod.plan(tool, scope, remove=remove, events=events, cwd=os.getcwd())
        if not dry_run:
            integrate_mod.apply(change)
        if scope == "local" and not remove:
            change.warnings += _tracked_local_settings(change.path)
    except SnapshotdError as error:
        fail(runner, error)
    if runner.json:
        click.echo(to_json({**change.to_wire(), "dry_run": dry_run, "diff": change.diff()}))
        return
    if dry_run:
        click.echo(change.diff() or f"no change to {change.path}", nl=not change.changed)
    elif not change.changed:
        click.echo(f"{change.path}: already as wanted")
    elif tool == "opencode":
        click.echo(_opencode_message(change, remove))
    elif remove:
        gone = " (nothing else was left in it: the file is removed)" if change.new is None else ""
        click.echo(f"removed snapshotd's hooks from {change.path}{gone}")
    else:
        click.echo(_what_changed(change, integrate_mod.our_handlers, tool))
    if change.trust is not None and not dry_run:
        done = "forgot Codex's trust in the removed entries" if remove else "recorded Codex's trust in them (as its /hooks screen does)"
        click.echo(f"{done} in {change.trust.path}")
    for warning in change.warnings:
        click.echo(click.style("warning: ", fg="yellow", bold=True) + warning, err=True)


@click.command(context_settings=CONTEXT)
@click.option(
    "--any-worktree", is_flag=True,
    help="Let the agent reach every repository of yours, not only the project the server starts in.",
)
@click.pass_context
def mcp(ctx: click.Context, any_worktree: bool) -> None:
    """Serve snapshotd's tools to an agent over MCP on stdio (needs the `mcp` extra).

    The tools work only in the project (the worktree of the folder the server
    starts in) unless --any-worktree is given.
    """
    runner: Runner = ctx.obj
    try:
        from snapshotd.agents.mcp import serve_stdio
    except ImportError as exc:
        click.echo(f"error: the MCP server needs the mcp package ({exc}); install snapshotd[mcp].", err=True)
        sys.exit(1)
    serve_stdio(Runner(runner.socket_path, runner.embedded, json_output=True), any_worktree=any_worktree)


@click.command(context_settings=CONTEXT)
@click.argument("tool", type=click.Choice(INTEGRATIONS), metavar="[claude-code|codex|opencode]", required=False)
@json_option
@click.pass_context
def doctor(ctx: click.Context, tool: str | None, json_output: bool) -> None:
    """Check the chain from the agent's hooks to a recorded checkpoint, for this worktree; say what to fix.

    The daemon answers; the tool's settings run snapshotd's hook by an absolute
    command; Codex trusts those entries; the tool's last hook recorded its
    checkpoint. Exits 1 when a check fails.
    """
    from snapshotd.agents.doctor import run_checks
    from snapshotd.client.rpc import connect_or_none
    from snapshotd.settings import resolve_socket_path

    runner = use_json(ctx)
    socket_path = resolve_socket_path(runner.socket_path)

    def ping() -> dict[str, Any]:
        client = connect_or_none(socket_path, timeout=2)
        if client is None:
            raise FileNotFoundError(socket_path)
        with client:
            return client.call("ping")

    checks = run_checks(tool, os.getcwd(), ping, socket_path)
    if runner.json:
        click.echo(to_json({"checks": [check.to_wire() for check in checks], "ok": all(c.ok for c in checks)}))
    else:
        for check in checks:
            mark = click.style("ok  ", fg="green") if check.ok else click.style("FAIL", fg="red", bold=True)
            click.echo(f"{mark} {check.name}: {check.detail}")
            if check.fix:
                click.echo(f"     fix: {check.fix}")
    sys.exit(0 if all(check.ok for check in checks) else 1)
