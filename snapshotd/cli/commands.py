"""The ``snapshotd`` command line: parses, calls one method, prints.

Each command maps to one method of the contract. It talks to the daemon when
one answers on the socket (starting one in the background when none does),
or runs the same engine in-process with ``--embedded``. ``--json`` prints the
method's result object, or ``{"error": {...}}`` with exit status 1.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, BinaryIO

import click

from snapshotd.errors import Busy, InternalError, NeedsForce, NotFound, SnapshotdError
from snapshotd.fsutil import check_socket_folder, pid_alive
from snapshotd.settings import SAFETY_SESSION, VERSION

if TYPE_CHECKING:
    from snapshotd.server.client import Client

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
DAEMON_START_TIMEOUT_S = 10.0
DAEMON_STOP_TIMEOUT_S = 10.0
_POLL_S = 0.05
_DASH_PATHS = "snapshotd.paths_after_dash"

# Daemons started in the background; kept so that their Popen objects are not
# collected (and warned about) while this process runs.
_STARTED: list[subprocess.Popen[bytes]] = []


class DaemonUnreachable(InternalError):
    """The command could not reach a daemon, or lost it during the call."""


class Runner:
    """Carries the global options and performs one call, embedded or through the daemon."""

    def __init__(self, socket_path: str | None, embedded: bool, json_output: bool) -> None:
        self.socket_path = socket_path
        self.embedded = embedded
        self.json = json_output
        self.daemon_was_running = True

    def call(self, method: str, params: dict[str, Any], *, progress: str | None = None) -> dict[str, Any]:
        """Run ``method``; every failure comes out as a :class:`SnapshotdError`."""
        with _progress(progress if not self.json else None):
            if self.embedded:
                return _call_embedded(method, params)
            return self._call_daemon(method, params)

    def _call_daemon(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        from snapshotd.settings import resolve_socket_path

        path = os.path.abspath(resolve_socket_path(self.socket_path))
        try:
            client = _connect(path)
            if client is None:
                if method == "shutdown":
                    self.daemon_was_running = False
                    return {}
                client = _start_and_connect(path)
            with client:
                if method == "shutdown":
                    return _shutdown(client, path)
                return client.call(method, **params)
        except SnapshotdError:
            raise
        except (OSError, ConnectionError) as exc:
            raise _transport_error(exc, path) from exc


def _another_daemon_starting(path: str) -> bool:
    """Whether some daemon holds the lock file beside the socket (it is starting or running)."""
    try:
        fd = os.open(path + ".lock", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing also drops a lock taken here
    return False


def _listener_pid(path: str) -> int:
    """The pid of the process that listens on ``path``, as this process sees it (0 if unknown)."""
    from snapshotd.server.peers import peer_credentials

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(DAEMON_STOP_TIMEOUT_S)
        probe.connect(path)
        return peer_credentials(probe)[0]
    except OSError:
        return 0
    finally:
        probe.close()


def _shutdown(client: Client, path: str) -> dict[str, Any]:
    """Ask the daemon to stop and return once it has.

    When the daemon itself listens on the socket (it is the peer that
    SO_PEERCRED names), wait for its process to end, by which time it has
    removed its socket. Under systemd socket activation (the listener is
    systemd, which keeps the socket) or across pid namespaces, wait only for
    the daemon to close this connection.
    """
    daemon_pid = client.call("ping")["pid"]
    own_listener = _listener_pid(path) == daemon_pid
    result = client.call("shutdown")
    deadline = time.monotonic() + DAEMON_STOP_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            client.call("ping")
            time.sleep(_POLL_S)
    except (OSError, ConnectionError, SnapshotdError):
        pass  # the daemon closed the connection (or refused new work): it is stopping
    while own_listener and pid_alive(daemon_pid):
        if time.monotonic() > deadline:
            raise DaemonUnreachable(
                f"The daemon (pid {daemon_pid}) accepted shutdown but has not exited within "
                f"{DAEMON_STOP_TIMEOUT_S:.0f} s.",
                socket=path,
            )
        time.sleep(_POLL_S)
    return result


def _os_message(exc: OSError) -> str:
    """One sentence for an OSError, without the ``[Errno N]`` prefix."""
    if len(exc.args) == 2 and isinstance(exc.args[1], str):
        text = exc.args[1]
        if exc.filename:
            text = f"{text}: {exc.filename}"
    else:
        text = str(exc) or type(exc).__name__
    text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else text + "."


def _transport_error(exc: OSError, path: str) -> DaemonUnreachable:
    if isinstance(exc, TimeoutError):
        message = f"The daemon at {path} did not answer in time."
    elif isinstance(exc, ConnectionError) and not isinstance(exc, ConnectionRefusedError):
        message = f"The connection to snapshotd at {path} was lost before it replied; see its log: {_daemon_log(path)}."
    else:
        message = f"Cannot talk to snapshotd at {path}: {_os_message(exc)}"
    return DaemonUnreachable(message, socket=path)


def _autostart_log(socket_path: str) -> str:
    """Where a daemon this command starts writes its log: ``snapshotd.log`` beside the socket."""
    return os.path.join(os.path.dirname(socket_path), "snapshotd.log")


def _daemon_log(socket_path: str) -> str:
    """Where the log of the daemon on ``socket_path`` most likely is, said for a person."""
    log_path = _autostart_log(socket_path)
    if os.path.isfile(log_path):
        return log_path
    return "the systemd journal (journalctl --user -u snapshotd) or the terminal running 'snapshotd serve'"


def _log_embedded_failure(method: str, exc: BaseException) -> str:
    """Append the traceback of an unexpected failure to ``embedded.log`` in snapshotd's home; its path.

    An embedded run has no daemon log, and the one-line error cannot hold a traceback.
    """
    from snapshotd.settings import data_home

    home = data_home()
    log_path = str(home / "embedded.log")
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        with _open_log(log_path) as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            log.write(f"{stamp} snapshotd --embedded {method}: {type(exc).__name__}\n".encode())
            log.write("".join(traceback.format_exception(exc)).encode("utf-8", "replace"))
    except OSError:
        return "nowhere: snapshotd's home could not take it"
    return log_path


def _call_embedded(method: str, params: dict[str, Any]) -> dict[str, Any]:
    import trio

    from snapshotd.engine.core import Engine

    async def run() -> dict[str, Any]:
        engine = Engine()
        try:
            return await engine.call(method, params)
        finally:
            await engine.aclose()

    try:
        return trio.run(run)
    except SnapshotdError:
        raise
    except Exception as exc:  # the daemon answers these with an internal error too
        where = _log_embedded_failure(method, exc)
        raise InternalError(
            f"The operation {method!r} failed unexpectedly ({type(exc).__name__}: {exc}); the details are in {where}.",
            log=where,
        ) from exc


def _connect(path: str) -> Client | None:
    """A connected blocking client, or None when no daemon listens at ``path``.

    Calls have no time limit: a capture of a large worktree or a restore may
    take long, and Ctrl-C stops the wait.
    """
    from snapshotd.server.client import Client

    try:
        return Client(path, timeout=None)
    except (FileNotFoundError, ConnectionRefusedError):
        return None


def _start_and_connect(path: str) -> Client:
    """Start a daemon in the background and connect to it (or to one started meanwhile)."""
    proc, log_path = _start_daemon(path)
    deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
    while True:
        client = _connect(path)
        if client is not None:
            return client
        if proc.poll() is not None and not _another_daemon_starting(path):
            # It stopped, and no other daemon holds the path (one that won a
            # race with it would hold the lock beside the socket).
            client = _connect(path)
            if client is not None:
                return client
            raise DaemonUnreachable(
                f"The daemon could not start on {path} (exit status {proc.returncode}); see {log_path}.",
                socket=path,
                log=log_path,
            )
        if time.monotonic() > deadline:
            raise DaemonUnreachable(
                f"The daemon did not start on {path} within {DAEMON_START_TIMEOUT_S:.0f} s; see {log_path}.",
                socket=path,
                log=log_path,
            )
        time.sleep(_POLL_S)


def _start_daemon(path: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``snapshotd serve`` detached from this terminal, logging beside the socket.

    The daemon runs in its own session, from ``/`` (so that it holds no
    worktree as its current folder), and finds this package even when it is
    not installed.
    """
    folder = os.path.dirname(path)
    check_socket_folder(folder, create=True)
    log_path = _autostart_log(path)
    env = dict(os.environ)
    # Run from the current folder (`python -m snapshotd` in a checkout), the
    # package is found only there; the daemon runs from `/`, so point it back.
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    first = os.path.abspath(sys.path[0]) if sys.path and sys.path[0] else os.getcwd()
    if os.path.realpath(first) == os.path.realpath(package_parent):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    if env.get("SNAPSHOTD_HOME"):
        env["SNAPSHOTD_HOME"] = os.path.abspath(env["SNAPSHOTD_HOME"])
    with _open_log(log_path) as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "snapshotd", "serve", "--socket", path],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd="/",
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    _STARTED.append(proc)
    return proc, log_path


def _open_log(log_path: str) -> BinaryIO:
    """The autostarted daemon's log, for appending: a regular file of this user, mode 0600, never a symlink.

    Its folder has passed :func:`check_socket_folder`, so only this user can
    have put anything there; a link is still refused rather than followed.
    """
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PermissionError(f"Refusing the log {log_path}: it is a symlink; remove it and try again.") from exc
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"Refusing the log {log_path}: it is not a regular file of yours; remove it and try again.")
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


@contextmanager
def _progress(message: str | None) -> Iterator[None]:
    """Show a ticking line on a terminal when the work takes longer than a second."""
    if message is None or not sys.stderr.isatty():
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        if done.wait(1.0):
            return
        while not done.wait(0.1):
            click.echo(f"\r{message}… {time.monotonic() - started:.1f}s", nl=False, err=True)
        click.echo("\r\033[K", nl=False, err=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def to_json(value: Any, *, indent: int | None = 2) -> str:
    """JSON text that is valid UTF-8 whatever the value holds.

    Non-ASCII text stays readable; a lone surrogate (a file name that is not
    UTF-8) is written as a ``\\uXXXX`` escape, as on the wire.
    """
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _let_output_carry_raw_names() -> None:
    """Print file names that are not UTF-8 as their own bytes instead of failing."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (getattr(stream, "encoding", "") or "").lower().replace("-", "") == "utf8":
            with suppress(ValueError, OSError):
                reconfigure(errors="surrogateescape")


def _emit(runner: Runner, result: dict[str, Any], human: Callable[[dict[str, Any]], Any]) -> None:
    if runner.json:
        click.echo(to_json(result))
    else:
        human(result)


def _fail(runner: Runner, error: SnapshotdError) -> None:
    if runner.json:
        click.echo(to_json({"error": error.to_dict()}, indent=None))
    else:
        message = " ".join(error.message.split())  # always one line
        click.echo(click.style("error: ", fg="red", bold=True) + message, err=True)
    sys.exit(1)


def _use_json(ctx: click.Context) -> Runner:
    runner: Runner = ctx.obj
    if ctx.params.get("json_output"):
        runner.json = True
    return runner


def _invoke(
    ctx: click.Context,
    method: str,
    params: dict[str, Any],
    human: Callable[[dict[str, Any]], Any],
    progress: str | None = None,
    ask_force: bool = False,
) -> dict[str, Any]:
    """Call ``method`` and print its result; with ``ask_force``, a refusal that needs ``force`` is asked at a terminal."""
    runner = _use_json(ctx)
    params = {key: value for key, value in params.items() if value is not None}
    try:
        try:
            result = runner.call(method, params, progress=progress)
        except NeedsForce as error:
            if not (ask_force and sys.stdin.isatty()):
                raise
            click.echo(error.message, err=True)
            if not click.confirm("Go ahead anyway?", default=False, err=True):
                sys.exit(1)
            result = runner.call(method, {**params, "force": True}, progress=progress)
    except SnapshotdError as error:
        _fail(runner, error)
    _emit(runner, result, human)
    return result


class _PathsAfterDashDash(click.Command):
    """A command where every argument after ``--`` is one of PATHS, never a checkpoint."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            ctx.meta[_DASH_PATHS] = list(args[at + 1 :])
            args = args[:at]
        return super().parse_args(ctx, args)


def _paths_after_dash(ctx: click.Context) -> list[str]:
    return list(ctx.meta.get(_DASH_PATHS, []))


def _short(hex_id: str | None) -> str:
    return hex_id[:12] if hex_id else "-"


def _size(count: int) -> str:
    """A byte count as people read it (``80.0 MiB``)."""
    units = ("bytes", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while count >= 1024 ** (power + 1) and power < len(units) - 1:
        power += 1
    return f"{count} bytes" if power == 0 else f"{count / 1024**power:.1f} {units[power]}"


def _skip_reason(item: dict[str, Any]) -> str:
    """Why a capture left a path out, with its size against the cap where that is the reason."""
    if "size" in item and "cap" in item:
        return f"{_size(item['size'])}, over the {_size(item['cap'])} cap for untracked files (--size-cap on serve)"
    return item["reason"]


def _checkpoint_line(cp: dict[str, Any]) -> str:
    mark = "" if cp.get("changed", True) else click.style(" (unchanged)", dim=True)
    label = cp.get("label") or ""
    session = cp.get("session") or "-"
    return (
        f"{click.style(_short(cp['id']), fg='yellow')}  #{cp['seq']:<4} {cp['created_at'][:19].replace('T', ' ')}"
        f"  {session:<12} {label}{mark}"
    )


json_option = click.option("--json", "json_output", is_flag=True, help="Print the result as JSON.")
yes_option = click.option("-y", "--yes", is_flag=True, help="Do not ask; needed when stdin is not a terminal.")


@click.group(context_settings=CONTEXT)
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket (default: $SNAPSHOTD_SOCKET, then the runtime folder).")
@click.option("--embedded", is_flag=True, help="Run the operation in this process, without a daemon.")
@json_option
@click.version_option(VERSION, prog_name="snapshotd")
@click.pass_context
def main(ctx: click.Context, socket_path: str | None, embedded: bool, json_output: bool) -> None:
    """Git snapshots and checkpoints of working trees, for agent servers and people.

    Checkpoints are real git commits whose trees equal what `git add -A && git
    write-tree` gives on a copy of your index; your index, HEAD, branches and
    ignored files are never touched.
    """
    _let_output_carry_raw_names()
    ctx.obj = Runner(socket_path, embedded, json_output)


@main.command(context_settings=CONTEXT)
@click.option("--socket", "socket_path", metavar="PATH", help="Listen on this socket.")
@click.option("--allow-root", is_flag=True, help="Also serve connections from root.")
@click.option("--size-cap", type=click.IntRange(min=0), metavar="BYTES", help="Leave out untracked files larger than this (0: no cap).")
@click.option("--no-watch", is_flag=True, help="Do not watch worktrees; every capture scans.")
@click.pass_context
def serve(ctx: click.Context, socket_path: str | None, allow_root: bool, size_cap: int | None, no_watch: bool) -> None:
    """Run the daemon in the foreground until stopped (SIGTERM, Ctrl-C or `snapshotd stop`)."""
    from snapshotd.daemon import run_daemon

    runner: Runner = ctx.obj
    try:
        run_daemon(socket_path or runner.socket_path, allow_root=allow_root, size_cap=size_cap, watch=not no_watch)
    except Busy as error:
        _serve_failed(error.message)
    except OSError as error:  # PermissionError, FileExistsError, NotADirectoryError, a path too long
        _serve_failed(_os_message(error))
    except ValueError as error:  # an inherited socket that is not a Unix stream socket
        _serve_failed(str(error))


def _serve_failed(message: str) -> None:
    click.echo(click.style("error: ", fg="red", bold=True) + " ".join(message.split()), err=True)
    sys.exit(1)


@main.command(context_settings=CONTEXT)
@click.argument("path", default=".", type=click.Path(file_okay=False))
@click.option("-m", "--label", metavar="LABEL", help="A label for the checkpoint.")
@click.option("--session", metavar="S", help="The session (agent thread) the checkpoint belongs to.")
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
        click.echo(_checkpoint_line(cp))
        detail = f"{stats['scan']} scan, {stats['hashed']} hashed, {stats['processes']} processes, {stats['ms']:.0f} ms"
        click.echo(click.style(detail, dim=True))
        for item in stats["skipped_files"]:
            click.echo(click.style(f"left out {item['path']}: {_skip_reason(item)}", fg="magenta"), err=True)

    params = {"path": os.path.abspath(path), "label": label, "session": session, "exact": exact or None, "force": force or None}
    _invoke(ctx, "checkpoint", params, human, progress="capturing", ask_force=True)


@main.command(name="list", context_settings=CONTEXT)
@click.argument("path", default=".", type=click.Path(file_okay=False))
@click.option("--session", metavar="S", help="Only this session's checkpoints.")
@click.option("--limit", type=click.IntRange(min=0), metavar="N", help="At most N, newest first.")
@json_option
@click.pass_context
def list_(ctx: click.Context, path: str, session: str | None, limit: int | None, json_output: bool) -> None:
    """List the checkpoints of the worktree holding PATH, newest first."""

    def human(result: dict[str, Any]) -> None:
        if not result["checkpoints"]:
            click.echo("no checkpoints")
        for cp in result["checkpoints"]:
            click.echo(_checkpoint_line(cp))

    _invoke(ctx, "list", {"path": os.path.abspath(path), "session": session, "limit": limit}, human)


@main.command(context_settings=CONTEXT)
@click.argument("checkpoint_id", metavar="CHECKPOINT")
@json_option
@click.pass_context
def show(ctx: click.Context, checkpoint_id: str, json_output: bool) -> None:
    """Show one checkpoint (a full id or a unique prefix of 7+ hex digits)."""

    def human(result: dict[str, Any]) -> None:
        cp = result["checkpoint"]
        width = max(len(key) for key in cp)
        for key, value in cp.items():
            click.echo(f"{click.style(key.ljust(width), bold=True)}  {value if value is not None else '-'}")

    _invoke(ctx, "show", {"checkpoint": checkpoint_id}, human)


_STATUS_LETTERS = {"added": "A", "modified": "M", "deleted": "D", "renamed": "R", "type_changed": "T"}
_STATUS_COLOURS = {"A": "green", "M": "yellow", "D": "red", "R": "cyan", "T": "magenta"}


def _print_patch(text: str) -> None:
    for line in text.splitlines():
        colour = None
        if line.startswith(("+++", "---", "diff --git", "index ")):
            click.echo(click.style(line, bold=True))
            continue
        if line.startswith("+"):
            colour = "green"
        elif line.startswith("-"):
            colour = "red"
        elif line.startswith("@@"):
            colour = "cyan"
        click.echo(click.style(line, fg=colour) if colour else line)


@main.command(cls=_PathsAfterDashDash, context_settings=CONTEXT)
@click.argument("source", metavar="FROM")
@click.argument("target", metavar="[TO]", required=False, default="worktree")
@click.argument("paths", nargs=-1, metavar="[-- PATHS...]")
@click.option("--stat", "mode", flag_value="stat", help="Lines added and removed per file.")
@click.option("--name-status", "mode", flag_value="name-status", default=True, help="One letter and a path per file (default).")
@click.option("--patch", "mode", flag_value="patch", help="The unified patch.")
@click.option("-U", "--context", type=click.IntRange(min=0), metavar="N", help="Lines of context in the patch.")
@click.option("-C", "--path", "path", metavar="PATH", type=click.Path(file_okay=False), help="The worktree, when FROM or TO is 'worktree' (default: here).")
@json_option
@click.pass_context
def diff(ctx: click.Context, source: str, target: str, paths: tuple[str, ...], mode: str, context: int | None, path: str | None, json_output: bool) -> None:
    """Show what changed from FROM to TO (a checkpoint or 'worktree', the default TO).

    PATHS (after `--`) limit the comparison to those files and folders.
    """

    def human(result: dict[str, Any]) -> None:
        if mode == "patch":
            _print_patch(result.get("patch", ""))
            return
        if not result["files"]:
            click.echo("no changes")
        width = max((len(f["path"]) for f in result["files"]), default=0)
        for change in result["files"]:
            letter = _STATUS_LETTERS.get(change["status"], "?")
            name = change["path"] if not change.get("old_path") else f"{change['old_path']} -> {change['path']}"
            if mode == "stat":
                counts = "bin" if change["binary"] else f"+{change['additions']} -{change['deletions']}"
                click.echo(f"{name.ljust(width)}  {counts}")
            else:
                click.echo(f"{click.style(letter, fg=_STATUS_COLOURS.get(letter))}  {name}")

    needs_worktree = "worktree" in (source, target)
    paths = (*paths, *_paths_after_dash(ctx))
    params = {
        "from": source,
        "to": target,
        "paths": [os.path.abspath(p) for p in paths] or None,
        "patch": True if mode == "patch" else None,
        "context": context,
        "path": os.path.abspath(path or ".") if needs_worktree or path else None,
    }
    _invoke(ctx, "diff", params, human, progress="comparing")


def _print_changes(result: dict[str, Any], dry_run: bool, err: bool = False) -> None:
    """Written, deleted, left alone (and why) and kept paths, a summary, and how to undo."""
    verb = "would " if dry_run else ""
    for path in result.get("written", []):
        click.echo(f"{click.style('W', fg='green')}  {path}", err=err)
    for path in result.get("deleted", []):
        click.echo(f"{click.style('D', fg='red')}  {path}", err=err)
    for item in result.get("conflicts", []) + result.get("skipped", []):
        click.echo(f"{click.style('!', fg='magenta')}  {item['path']}: {item['reason']}", err=err)
    for item in result.get("kept", []):
        click.echo(f"{click.style('K', fg='cyan')}  {item['path']}: {item['reason']}", err=err)
    summary = f"{verb}write {len(result.get('written', []))}, {verb}delete {len(result.get('deleted', []))}"
    click.echo(click.style(summary, dim=True), err=err)
    safety = result.get("safety_checkpoint")
    if safety:
        click.echo(f"undo with: snapshotd restore {safety['id'][:12]}  (or: snapshotd undo)", err=err)


def _refuse_without_terminal(ctx: click.Context) -> None:
    """Nobody can answer a question without a terminal on stdin: refuse, pointing to --yes."""
    if not sys.stdin.isatty():
        raise click.UsageError(
            f"'{ctx.info_name}' changes things and stdin is not a terminal to ask on; pass --yes to go ahead."
        )


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
        _fail(runner, error)
    _print_changes(preview, True, err=True)
    if (preview.get("written") or preview.get("deleted")) and click.confirm("Go ahead?", default=False, err=True):
        return None
    return preview


@main.command(cls=_PathsAfterDashDash, context_settings=CONTEXT)
@click.argument("checkpoint_id", metavar="CHECKPOINT")
@click.argument("paths", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Report what would change; change nothing.")
@click.option("--into", "into", metavar="PATH", type=click.Path(file_okay=False), help="Restore into this worktree (another than the checkpoint's own).")
@yes_option
@json_option
@click.pass_context
def restore(ctx: click.Context, checkpoint_id: str, paths: tuple[str, ...], dry_run: bool, into: str | None, yes: bool, json_output: bool) -> None:
    """Make the worktree (or PATHS in it) equal CHECKPOINT again; a safety checkpoint comes first."""
    paths = (*paths, *_paths_after_dash(ctx))
    params = {
        "checkpoint": checkpoint_id,
        "paths": [os.path.abspath(p) for p in paths] or None,
        "dry_run": dry_run or None,
        "path": os.path.abspath(into) if into else None,
        "allow_other_worktree": True if into else None,
    }
    if _confirm_preview(ctx, "restore", params, yes) is not None:
        return
    _invoke(ctx, "restore", params, lambda r: _print_changes(r, dry_run), progress="restoring")


@main.command(context_settings=CONTEXT)
@click.argument("path", default=".", type=click.Path(file_okay=False))
@yes_option
@json_option
@click.pass_context
def undo(ctx: click.Context, path: str, yes: bool, json_output: bool) -> None:
    """Put the worktree holding PATH back as it was before its last restore or revert.

    That is its newest safety checkpoint, restored in turn (with a safety
    checkpoint of its own, so a second undo is a redo).
    """
    runner = _use_json(ctx)
    folder = os.path.abspath(path)
    try:
        found = runner.call("list", {"path": folder, "session": SAFETY_SESSION, "limit": 1})["checkpoints"]
    except SnapshotdError as error:
        _fail(runner, error)
    if not found:
        _fail(runner, NotFound(f"There is no restore or revert to undo in the worktree holding {folder}."))
    params = {"checkpoint": found[0]["id"], "path": folder}
    if _confirm_preview(ctx, "restore", params, yes) is not None:
        return
    _invoke(ctx, "restore", params, lambda r: _print_changes(r, False), progress="undoing")


@main.command(cls=_PathsAfterDashDash, context_settings=CONTEXT)
@click.argument("source", metavar="FROM")
@click.argument("rest", nargs=-1, metavar="[TO] [PATHS...]")
@click.option("--dry-run", is_flag=True, help="Report what would change; change nothing.")
@click.option("--force", is_flag=True, help="Also take back paths changed since TO.")
@yes_option
@json_option
@click.pass_context
def revert(ctx: click.Context, source: str, rest: tuple[str, ...], dry_run: bool, force: bool, yes: bool, json_output: bool) -> None:
    """Undo the changes from FROM to TO (default: the session's newest), leaving other work alone.

    TO is told from PATHS by its look (7+ hex digits, not an existing path);
    everything after `--` is a path.
    """
    target = None
    paths = list(rest)
    if paths and len(paths[0]) >= 7 and all(c in "0123456789abcdefABCDEF" for c in paths[0]) and not os.path.exists(paths[0]):
        target = paths.pop(0)
    paths += _paths_after_dash(ctx)
    params = {
        "from": source,
        "to": target,
        "paths": [os.path.abspath(p) for p in paths] or None,
        "dry_run": dry_run or None,
        "force": force or None,
    }
    preview = _confirm_preview(ctx, "revert", params, yes)
    if preview is None:
        preview = _invoke(ctx, "revert", params, lambda r: _print_changes(r, dry_run), progress="reverting")
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


@main.command(context_settings=CONTEXT)
@click.argument("checkpoints", nargs=-1, metavar="CHECKPOINT... | --session S [PATH]")
@click.option("--session", metavar="S", help="Delete every checkpoint of this session (of PATH's worktree, default: here).")
@click.option("-C", "--path", "path", type=click.Path(file_okay=False), help="The worktree, with --session (same as PATH).")
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
        if path is not None:
            raise click.UsageError("-C/--path goes with --session; checkpoint ids need no worktree.")
        params = {"checkpoints": list(checkpoints)}
    else:
        raise click.UsageError("Give checkpoint ids, or --session S.")
    what = f"every checkpoint of session {session!r}" if session is not None else f"{len(checkpoints)} checkpoint(s)"
    if not _may_go_ahead(ctx, f"Delete {what}?", yes):
        return
    _invoke(ctx, "delete", params, lambda r: click.echo(f"deleted {r['deleted']} checkpoint(s)"))


@main.command(context_settings=CONTEXT)
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
    _invoke(ctx, "gc", params, human, progress="collecting")


@main.command(context_settings=CONTEXT)
@click.argument("path", required=False, type=click.Path(file_okay=False))
@json_option
@click.pass_context
def repair(ctx: click.Context, path: str | None, json_output: bool) -> None:
    """Re-attach worktrees that moved (PATH: the new place of one), keeping ids and checkpoints."""

    def human(result: dict[str, Any]) -> None:
        if not result["moved"]:
            click.echo("nothing moved")
        for item in result["moved"]:
            click.echo(f"{item['worktree']}  {item['from']} -> {item['to']}")

    _invoke(ctx, "repair", {"path": os.path.abspath(path) if path else None}, human)


@main.command(context_settings=CONTEXT)
@json_option
@click.pass_context
def status(ctx: click.Context, json_output: bool) -> None:
    """Show the daemon's worktrees and counters."""

    def human(result: dict[str, Any]) -> None:
        spawn_info = result.get("spawn", {})
        helper = "native posix_spawn" if spawn_info.get("native") else f"fallback ({spawn_info.get('error')})"
        click.echo(f"snapshotd {result.get('version')}  pid {result.get('pid')}  spawn: {helper}")
        for wt in result["worktrees"]:
            watching = click.style("watching", fg="green") if wt["watching"] else "not watching"
            click.echo(f"{wt['id']}  {wt['kind']:<5} {watching:<12} {wt['path']}")
        counters = result["counters"]
        if counters:
            width = max(len(key) for key in counters)
            for key in sorted(counters):
                click.echo(f"  {key.ljust(width)}  {counters[key]}")

    _invoke(ctx, "status", {}, human)


@main.command(context_settings=CONTEXT)
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

    result = _invoke(ctx, "verify", {"path": os.path.abspath(path)}, human, progress="scanning")
    if result["differences"]:
        sys.exit(1)


@main.command(name="open", context_settings=CONTEXT)
@click.argument("path", default=".", type=click.Path(file_okay=False))
@json_option
@click.pass_context
def open_(ctx: click.Context, path: str, json_output: bool) -> None:
    """Open (register) the worktree holding PATH and show it."""

    def human(result: dict[str, Any]) -> None:
        wt = result["worktree"]
        click.echo(f"{wt['id']}  {wt['kind']}  {wt['path']}  {wt.get('branch') or ''} {_short(wt.get('head'))}")

    _invoke(ctx, "open", {"path": os.path.abspath(path)}, human)


@main.command(context_settings=CONTEXT)
@json_option
@click.pass_context
def worktrees(ctx: click.Context, json_output: bool) -> None:
    """List the worktrees the daemon has open."""

    def human(result: dict[str, Any]) -> None:
        if not result["worktrees"]:
            click.echo("no worktrees open")
        for wt in result["worktrees"]:
            click.echo(f"{wt['id']}  {wt['kind']:<5} {wt['path']}")

    _invoke(ctx, "worktrees", {}, human)


@main.command(context_settings=CONTEXT)
@json_option
@click.pass_context
def stop(ctx: click.Context, json_output: bool) -> None:
    """Stop the daemon cleanly; returns once it has stopped."""
    runner: Runner = ctx.obj
    if runner.embedded:
        raise click.UsageError("--embedded runs no daemon, so there is none to stop.")
    _invoke(ctx, "shutdown", {}, lambda r: click.echo("stopped" if runner.daemon_was_running else "no daemon was running"))


@main.command(context_settings=CONTEXT)
@json_option
@click.pass_context
def ping(ctx: click.Context, json_output: bool) -> None:
    """Check that the daemon answers (starting it if needed); show its version and pid."""

    def human(result: dict[str, Any]) -> None:
        click.echo(f"snapshotd {result['version']}  pid {result['pid']}  up {result['uptime_s']:.1f} s")

    _invoke(ctx, "ping", {}, human)


# The agent-tool commands live in their own module, which uses the helpers above.
from snapshotd.cli.agents import hook, integrate, mcp  # noqa: E402

for _command in (hook, integrate, mcp):
    main.add_command(_command)

if __name__ == "__main__":
    main()
