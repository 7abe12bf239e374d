"""What every command shares: click settings, ``--json`` and ``--yes``, paths after ``--``, one call.

:func:`invoke` calls a command's method through the :class:`~snapshotd.client.launcher.Runner`
and prints its result, or fails with the error on one line (or as JSON) and
exit status 1.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import click

from snapshotd.cli.completion import complete_reference, complete_session
from snapshotd.cli.interrupt import INTERRUPTED_STATUS, finish_on_interrupt
from snapshotd.cli.output import show_progress, to_json
from snapshotd.client.launcher import Runner
from snapshotd.contract.params import INT_PARAM_MAX, MAX_PATCH_BYTES, validate_session
from snapshotd.contract.refs import is_relative
from snapshotd.errors import NeedsForce, SnapshotdError, TooLarge

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_DASH_PATHS = "snapshotd.paths_after_dash"

Command = TypeVar("Command", bound=Callable[..., Any])
"""A command's function, as a decorator hands it on."""


def reference_argument(name: str, metavar: str, **kwargs: Any) -> Callable[[Command], Command]:
    """A CHECKPOINT argument: any reference, completed from the worktree here."""
    return click.argument(name, metavar=metavar, shell_complete=complete_reference, **kwargs)


class SessionName(click.ParamType[str]):
    """A session's name as the daemon takes it: 1 to 200 characters, none of them a control character."""

    name = "session"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            session = validate_session(value)
        except SnapshotdError:
            session = None
        if session is None:
            self.fail(f"{value!r} is not a session name: give 1 to 200 characters, none of them a control character.",
                      param, ctx)
        return session


SESSION_NAME = SessionName()
json_option = click.option("--json", "json_output", is_flag=True, help="Print the result as JSON.")
yes_option = click.option("-y", "--yes", is_flag=True, help="Do not ask; needed when stdin is not a terminal.")
ref_session_option = click.option(
    "--session", "ref_session", metavar="S", type=SESSION_NAME, shell_complete=complete_session,
    help="The session @, @~N and #N count in (default: the newest).",
)


class Duration(click.ParamType[int]):
    """An age as people write it: seconds (``90``), or numbers with s, m, h, d or w (``12h``, ``1d``, ``1h30m``)."""

    name = "duration"
    _UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    _PART = re.compile(r"(\d+)([smhdw])")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        text = str(value).strip().lower()
        if text.isdigit():
            return min(int(text), INT_PARAM_MAX)
        parts = self._PART.findall(text)
        if not parts or "".join(number + unit for number, unit in parts) != text:
            self.fail(f"{value!r} is not an age: give seconds, or numbers with s, m, h, d or w (90m, 12h, 1d, 1h30m).", param, ctx)
        return min(sum(int(number) * self._UNITS[unit] for number, unit in parts), INT_PARAM_MAX)  # older than all


DURATION = Duration()


class AtMost(click.IntRange):
    """A count of at least ``least``; one past ``most`` (what the wire carries) means all and is taken as
    ``most``, as git takes ``-U999999999``."""

    def __init__(self, most: int = INT_PARAM_MAX, least: int = 0) -> None:
        super().__init__(min=least)
        self.most = most

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        return min(int(super().convert(value, param, ctx)), self.most)


COUNT = AtMost()


def reference_params(refs: Iterable[str], session: str | None, path: str | None = None) -> dict[str, Any]:
    """Where ``@``, ``@~N`` and ``#N`` count: the worktree here (or ``path``) and ``session``.

    Nothing when every reference is an id and no ``path`` is given, so a
    checkpoint named by id is found from any folder.
    """
    if path is None and not any(is_relative(ref) for ref in refs):
        return {}
    return {"path": os.path.abspath(path or "."), "session": session}


def emit(runner: Runner, result: dict[str, Any], human: Callable[[dict[str, Any]], Any]) -> None:
    if runner.json:
        click.echo(to_json(result))
    else:
        human(result)


def fail(runner: Runner, error: SnapshotdError) -> NoReturn:
    if runner.json:
        click.echo(to_json({"error": error.to_dict()}, indent=None))
    else:
        message = " ".join(error.message.split())  # always one line
        click.echo(click.style("error: ", fg="red", bold=True) + message, err=True)
    sys.exit(1)


def use_json(ctx: click.Context) -> Runner:
    runner: Runner = ctx.obj
    if ctx.params.get("json_output"):
        runner.json = True
    return runner


def invoke(
    ctx: click.Context,
    method: str,
    params: dict[str, Any],
    human: Callable[[dict[str, Any]], Any],
    progress: str | None = None,
    ask_force: bool = True,
    finishes: Finishes | None = None,
    paged: bool = False,
) -> dict[str, Any]:
    """Call ``method`` and print its result; with ``paged``, every page of it (:func:`whole_result`).

    With ``ask_force`` (all but ``revert``, whose ``force`` means more), a
    refusal that needs ``force`` (a broad folder such as ``$HOME``) is asked
    at a terminal. With ``finishes`` (work that cannot stop half-way: a restore),
    Ctrl-C is answered by :mod:`.interrupt` and ends the command with 130
    once the result is printed.
    """
    runner = use_json(ctx)
    params = {key: value for key, value in params.items() if value is not None}
    guard = finish_on_interrupt(finishes.what, runner.embedded, finishes.folder) if finishes else nullcontext(None)
    with guard as interrupts:
        try:
            try:
                with show_progress(progress if not runner.json else None):
                    result = whole_result(runner, method, params) if paged else runner.call(method, params)
            except NeedsForce as error:
                if not (ask_force and sys.stdin.isatty()):
                    raise
                click.echo(error.message, err=True)
                if not click.confirm("Go ahead anyway?", default=False, err=True):
                    sys.exit(1)
                with show_progress(progress if not runner.json else None):
                    result = runner.call(method, {**params, "force": True})
        except SnapshotdError as error:
            fail(runner, error)
    emit(runner, result, human)
    if interrupts is not None and interrupts.count:
        sys.exit(INTERRUPTED_STATUS)
    return result


@dataclass(frozen=True)
class Finishes:
    """Work that goes on to its end whatever Ctrl-C says: its name and, where known, its worktree."""

    what: str
    folder: str | None = None


def whole_result(runner: Runner, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A ``diff`` with its patch, every page of it (``next_offset``) asked for and joined into one result.

    Pages after the first read the worktree's tree the first captured
    (``worktree_tree``), so a file written meanwhile cannot mix two states.
    One file whose patch alone is over what a reply carries is ``too_large``,
    told with the git command that shows it (a checkpoint is a commit).
    """
    params = {**params, "max_patch_bytes": MAX_PATCH_BYTES}
    try:
        result = runner.call(method, params)
        if result.get("worktree_tree") is not None:
            params["worktree_tree"] = result["worktree_tree"]
        while result.get("next_offset") is not None:
            page = runner.call(method, {**params, "offset": result["next_offset"]})
            result = {**page, "files": result["files"] + page["files"], "patch": result["patch"] + page["patch"]}
    except TooLarge as error:
        refs = [ref for ref in (params.get("from"), params.get("to")) if ref and ref != "worktree"]
        named = " (each checkpoint by the id `snapshotd resolve` gives)" if any(map(is_relative, refs)) else ""
        raise TooLarge(
            f"The patch of {error.data.get('path')} has {error.data.get('bytes')} bytes, more than one reply "
            f"carries ({MAX_PATCH_BYTES}); git shows it: git diff {' '.join(refs)} -- "
            f"{shlex.quote(str(error.data.get('path')))}{named}.",
            **error.data,
        ) from error
    return result


class PathsAfterDashDash(click.Command):
    """A command where every argument after ``--`` is one of PATHS, never a checkpoint."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            ctx.meta[_DASH_PATHS] = list(args[at + 1 :])
            args = args[:at]
        return super().parse_args(ctx, args)


def paths_after_dash(ctx: click.Context) -> list[str]:
    return list(ctx.meta.get(_DASH_PATHS, []))


def refuse_missing_paths(paths: Iterable[str]) -> None:
    """Refuse a path before ``--`` that is not on disk, as git does: it may be a misspelt reference,
    and a path that matches nothing would show nothing and succeed."""
    for path in paths:
        if not os.path.lexists(path):
            raise click.UsageError(
                f"{path!r} is neither a checkpoint nor a path here; put a path that is not on disk after '--'."
            )
