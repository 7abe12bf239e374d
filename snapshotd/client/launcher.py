"""The launcher: how a command reaches the engine, through a daemon it finds or starts, or embedded.

:class:`Runner` carries the global options and performs one call. Through the
daemon it connects to the socket, starting ``snapshotd serve`` in the
background when nobody listens (its log beside the socket), and waits for a
stopped daemon to be gone. ``--embedded`` runs the engine in this process and
keeps the traceback of an unexpected failure in ``embedded.log``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import snapshotd
from snapshotd.client.dialing import daemon_starting
from snapshotd.contract.peers import peer_credentials
from snapshotd.errors import InternalError, InvalidParams, SnapshotdError, Untrusted
from snapshotd.fsutil import check_private_home, pid_alive
from snapshotd.settings import connect_timeout, data_home, disabled_facilities, resolve_socket_path
from snapshotd.socketfolder import check_socket_folder

if TYPE_CHECKING:
    from snapshotd.client.rpc import Client

DAEMON_START_TIMEOUT_S = 10.0
DAEMON_STOP_TIMEOUT_S = 10.0
_POLL_S = 0.05

# Daemons started in the background; kept so that their Popen objects are not
# collected (and warned about) while this process runs.
_STARTED: list[subprocess.Popen[bytes]] = []


class Runner:
    """Carries the global options and performs one call, embedded or through the daemon."""

    def __init__(self, socket_path: str | None, embedded: bool, json_output: bool) -> None:
        self.socket_path = socket_path
        self.embedded = embedded
        self.json = json_output
        self.daemon_was_running = True

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Run ``method``; every failure comes out as a :class:`SnapshotdError`."""
        if self.embedded:
            return _call_embedded(method, params)
        return self._call_daemon(method, params)

    def _call_daemon(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
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


def _listener_pid(path: str) -> int:
    """The pid of the process that listens on ``path``, as this process sees it (0 if unknown)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(DAEMON_STOP_TIMEOUT_S)
        probe.connect(path)
        peer = peer_credentials(probe, switched_off="peercred" in disabled_facilities())
        return peer[0] if peer is not None else 0  # unknown without SO_PEERCRED
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
    wait = connect_timeout()
    try:
        with client.time_limit(wait):
            daemon_pid = client.call("ping")["pid"]
    except TimeoutError:
        listener = _listener_pid(path)
        hint = f" (pid {listener}; one stopped by Ctrl-Z goes on with `kill -CONT {listener}`)" if listener else ""
        raise InternalError(
            f"The daemon at {path} accepts connections but did not answer within {wait:g} s{hint}.", socket=path
        ) from None
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
            raise InternalError(
                f"The daemon (pid {daemon_pid}) accepted shutdown but has not exited within "
                f"{DAEMON_STOP_TIMEOUT_S:.0f} s.",
                socket=path,
            )
        time.sleep(_POLL_S)
    return result


def os_message(exc: OSError) -> str:
    """One sentence for an OSError, without the ``[Errno N]`` prefix."""
    if len(exc.args) == 2 and isinstance(exc.args[1], str):
        text = exc.args[1]
        if exc.filename:
            text = f"{text}: {exc.filename}"
    else:
        text = str(exc) or type(exc).__name__
    text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else text + "."


def _transport_error(exc: OSError, path: str) -> InternalError:
    if isinstance(exc, TimeoutError):
        message = f"The daemon at {path} did not answer in time."
    elif isinstance(exc, ConnectionError) and not isinstance(exc, ConnectionRefusedError):
        message = f"The connection to snapshotd at {path} was lost before it replied; see its log: {_daemon_log(path)}."
    else:
        message = f"Cannot talk to snapshotd at {path}: {os_message(exc)}"
    return InternalError(message, socket=path)


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
    home = data_home()
    log_path = str(home / "embedded.log")
    try:
        check_private_home(home, create=True)
        with _open_log(log_path) as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            log.write(f"{stamp} snapshotd --embedded {method}: {type(exc).__name__}\n".encode())
            log.write("".join(traceback.format_exception(exc)).encode("utf-8", "replace"))
    except (OSError, Untrusted):
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


def _connect(path: str, connect_timeout: float | None = None) -> Client | None:
    """A connected blocking client, or None when no daemon listens at ``path``.

    Calls have no time limit: a capture of a large worktree or a restore may
    take long, and Ctrl-C stops the wait. A busy daemon is waited for up to
    ``connect_timeout`` (default ``$SNAPSHOTD_CONNECT_TIMEOUT``), then
    :class:`~snapshotd.errors.Busy` says so.
    """
    from snapshotd.client.rpc import Client

    try:
        return Client(path, timeout=None, connect_timeout=connect_timeout)
    except (FileNotFoundError, ConnectionRefusedError):
        return None


def _start_and_connect(path: str) -> Client:
    """Start a daemon in the background and connect to it (or to one started meanwhile)."""
    _refuse_a_non_socket(path)
    proc, log_path = _start_daemon(path)
    deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
    while True:
        client = _connect(path, max(deadline - time.monotonic(), 0.0))
        if client is not None:
            _end_if_spare(proc, client)
            return client
        if proc.poll() is not None and not daemon_starting(path):
            # It stopped, and no other daemon holds the path (one that won a
            # race with it would hold the lock beside the socket).
            client = _connect(path)
            if client is not None:
                return client
            raise InternalError(
                f"The daemon could not start on {path} (exit status {proc.returncode}); see {log_path}.",
                socket=path,
                log=log_path,
            )
        if time.monotonic() > deadline:
            raise InternalError(
                f"The daemon did not start on {path} within {DAEMON_START_TIMEOUT_S:.0f} s; see {log_path}.",
                socket=path,
                log=log_path,
            )
        time.sleep(_POLL_S)


def _end_if_spare(proc: subprocess.Popen[bytes], client: Client) -> None:
    """End the daemon started here when another one answered.

    One that lost a start race would otherwise take the socket over once the
    winner stops, serving no one. The child leads its own process group, so a
    daemon outside that group is not the one started here.
    """
    if proc.poll() is not None:
        return
    try:
        answered = client.call("ping")
    except (SnapshotdError, OSError):
        return
    if answered.get("pgid", answered.get("pid")) != proc.pid:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)


def _refuse_a_non_socket(path: str) -> None:
    """Refuse a socket path that names a file or folder before anything is written beside it.

    A daemon would refuse to replace it anyway, but only after the log had
    been created in that folder (a worktree, say).
    """
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise InvalidParams(
            f"The socket path {path} exists and is not a socket; give a free path or a daemon's socket "
            "(--socket or $SNAPSHOTD_SOCKET).",
            socket=path,
        )


def _start_daemon(path: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``snapshotd serve`` detached from this terminal, logging beside the socket.

    The daemon runs in its own session, from ``/`` (so that it holds no
    worktree as its current folder), and finds this package even when it is
    not installed.
    """
    folder = os.path.dirname(path)
    check_socket_folder(folder, create=True)
    log_path = _autostart_log(path)
    env = daemon_environment()
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


def daemon_environment() -> dict[str, str]:
    """The environment of a daemon this command starts: this one, made to work from ``/``.

    Run from the folder holding the package (``python -m snapshotd`` in a
    checkout), the package is found only there; the daemon runs from ``/``, so
    ``PYTHONPATH`` points it back. A relative ``SNAPSHOTD_HOME`` is made absolute.
    """
    env = dict(os.environ)
    package_parent = str(Path(snapshotd.__file__).resolve().parent.parent)
    first = os.path.abspath(sys.path[0]) if sys.path and sys.path[0] else os.getcwd()
    if os.path.realpath(first) == package_parent:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    if env.get("SNAPSHOTD_HOME"):
        env["SNAPSHOTD_HOME"] = os.path.abspath(env["SNAPSHOTD_HOME"])
    return env


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
