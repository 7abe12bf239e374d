"""Reaching a busy daemon: wait for room within the client's time, then say so in one sentence.

A burst of clients (a fleet's hooks firing at once) finds the daemon busy in
three ways, and each means "wait", not "fail":

- the listen queue is full: ``connect`` on a Unix socket with a timeout (or
  non-blocking) fails at once with EAGAIN;
- the daemon is starting or stopping: its lock beside the socket is held but
  nobody listens yet (ECONNREFUSED, or ENOENT before the socket is bound);
- the daemon serves its limit of connections: it answers the new one with a
  ``busy`` error (``"accepted": false``, ``retry_after_ms``) and closes it,
  having read nothing from it, so whatever was sent may be sent again.

:class:`RoomWait` paces the retries of one connect (a short, growing,
jittered delay, at least the daemon's ``retry_after_ms``) and, once the
client's time is spent, raises :class:`~snapshotd.errors.Busy` with a
sentence that says why, never a raw errno.

Nothing is sent before the socket is known to be this user's daemon: its
folder passes the daemon's own rule (:func:`~snapshotd.socketfolder.check_socket_folder`)
and the listener's credentials (SO_PEERCRED) name this user, else
:class:`~snapshotd.errors.UntrustedDaemon`. trio is imported only by
:func:`dial_async`, so that the command line and the hooks stay light.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import pwd
import random
import socket
import time
from typing import TYPE_CHECKING, Any

from snapshotd.contract.framing import (
    LineBuffer,
    Response,
    encode_message,
    parse_incoming,
    request_message,
)
from snapshotd.contract.peers import peer_credentials
from snapshotd.errors import Busy, SnapshotdError, UntrustedDaemon
from snapshotd.settings import disabled_facilities
from snapshotd.socketfolder import check_socket_folder

if TYPE_CHECKING:
    import trio

__all__ = ["RoomWait", "closed_error", "connect_blocking", "daemon_starting", "dial_async", "is_refusal"]

FIRST_DELAY_S = 0.005
MAX_DELAY_S = 0.25
_HANDSHAKE_LINE_LIMIT = 1024 * 1024
_HANDSHAKE_READ = 64 * 1024


def check_folder(socket_path: str) -> None:
    """Refuse a socket whose folder another user owns or may write to (before connecting)."""
    check_socket_folder(os.path.dirname(os.path.abspath(socket_path)))


def check_listener(sock: socket.socket | trio.socket.SocketType, socket_path: str) -> None:
    """Refuse a connected socket whose listener is not this user (SO_PEERCRED; without it, :func:`check_folder` is the check)."""
    peer = peer_credentials(sock, switched_off="peercred" in disabled_facilities())
    own = os.geteuid()
    if peer is not None and (uid := peer[1]) != own:
        try:
            name = f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
        except KeyError:
            name = f"uid {uid}"
        raise UntrustedDaemon(
            f"Refusing the daemon at {socket_path}: it runs as another user ({name}, not uid {own}), "
            "so nothing was sent to it; set SNAPSHOTD_SOCKET or XDG_RUNTIME_DIR to a folder of your own."
        )


def closed_error(socket_path: str) -> ConnectionError:
    return ConnectionError(
        f"The connection to snapshotd at {socket_path} closed before it replied."
    )


def daemon_starting(path: str) -> bool:
    """Whether some daemon holds the lock file beside the socket (it is starting, running or stopping)."""
    try:
        fd = os.open(path + ".lock", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
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


def waiting_reason(exc: OSError, path: str) -> str | None:
    """Why a failed ``connect`` is worth retrying (a clause for :class:`Busy`), or None if it is not."""
    if isinstance(exc, BlockingIOError) or exc.errno == errno.EAGAIN:
        return f"its queue of connections waiting at {path} is full"
    if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)) and daemon_starting(path):
        return f"the daemon at {path} is starting or stopping"
    return None


def is_refusal(error: SnapshotdError | None) -> bool:
    """Whether the daemon turned this connection away unread (its connection cap): send again elsewhere."""
    return isinstance(error, Busy) and error.data.get("accepted") is False


def refusal_reason(error: SnapshotdError) -> str:
    limit = error.data.get("limit")
    if isinstance(limit, int):
        return f"it serves its limit of {limit} connections"
    return "it turns new connections away"


class RoomWait:
    """The retries of one connect: growing, jittered delays until ``seconds`` have passed, then :class:`Busy`.

    ``seconds`` of None waits as long as it takes.
    """

    def __init__(self, path: str, seconds: float | None) -> None:
        self.path = path
        self.seconds = seconds
        self.started = time.monotonic()
        self.deadline = math.inf if seconds is None else self.started + max(seconds, 0.0)
        self._next = FIRST_DELAY_S

    def remaining(self) -> float | None:
        """Seconds left (at least a little, so a connect may still be tried), or None without a limit."""
        if self.deadline == math.inf:
            return None
        return max(self.deadline - time.monotonic(), 0.001)

    def delay(self, reason: str, retry_after_ms: Any = None) -> float:
        """Seconds to sleep before the next try; raises :class:`Busy` once the time is spent."""
        now = time.monotonic()
        if now >= self.deadline:
            raise self.busy(reason)
        delay = self._next * random.uniform(0.5, 1.0)
        self._next = min(self._next * 2, MAX_DELAY_S)
        if isinstance(retry_after_ms, (int, float)) and not isinstance(retry_after_ms, bool):
            delay = max(delay, min(retry_after_ms / 1000, MAX_DELAY_S * 4) * random.uniform(1.0, 1.5))
        return min(delay, self.deadline - now)

    def refused(self, error: SnapshotdError) -> float:
        """:meth:`delay` for a connection the daemon turned away with ``error``."""
        return self.delay(refusal_reason(error), error.data.get("retry_after_ms"))

    def busy(self, reason: str) -> Busy:
        waited = time.monotonic() - self.started
        return Busy(
            f"snapshotd is busy: {reason}, and no room came within {waited:.1f} s; try again in a moment, "
            "allow a longer connect timeout, or share one connection between sessions.",
            socket=self.path,
            waited_s=round(waited, 3),
        )


STOPPED_CHECK_S = 2.0
"""How long a reply is waited for before the daemon is looked at: a stopped one (Ctrl-Z, SIGSTOP) never answers."""


def listener_pid(sock: socket.socket) -> int | None:
    """The pid of the daemon at the other end of ``sock`` (SO_PEERCRED), None where it cannot be had."""
    peer = peer_credentials(sock, switched_off="peercred" in disabled_facilities())
    return peer[0] if peer is not None and peer[0] > 0 else None


def stopped_daemon(pid: int | None, socket_path: str) -> Busy | None:
    """The error for a daemon ``pid`` that is stopped (Ctrl-Z, SIGSTOP, a debugger), None when it runs or is not known.

    Read from ``/proc/<pid>/stat``'s state (``T``, ``t``); without ``/proc`` nothing is known.
    """
    if pid is None or "proc" in disabled_facilities():
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return None
    if state not in (b"T", b"t"):
        return None
    return Busy(
        f"The daemon on {socket_path} (pid {pid}) is stopped (Ctrl-Z or SIGSTOP) and cannot answer; "
        f"resume it with `kill -CONT {pid}`.",
        pid=pid,
    )


def connect_blocking(path: str, wait: RoomWait, timeout: float | None) -> socket.socket:
    """A checked socket connected to ``path`` (``timeout`` set), retrying while the daemon is busy."""
    check_folder(path)
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(wait.remaining())
            sock.connect(path)
            sock.settimeout(timeout)
            check_listener(sock, path)
            return sock
        except OSError as exc:
            sock.close()
            reason = waiting_reason(exc, path)
            if reason is None:
                raise
            time.sleep(wait.delay(reason))
        except BaseException:
            sock.close()
            raise


async def dial_async(path: str, wait: RoomWait) -> tuple[trio.SocketStream, dict[str, Any]]:
    """A checked, confirmed stream to the daemon and its ``ping`` result, waiting while it is busy."""
    import trio

    while True:
        check_folder(path)
        sock = trio.socket.from_stdlib_socket(await _connect_async(path, wait))
        stream = trio.SocketStream(sock)
        try:
            check_listener(sock, path)
            response = await _handshake(stream, path, wait)
        except BaseException:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            raise
        if is_refusal(response.error):
            assert response.error is not None
            await stream.aclose()
            await trio.sleep(wait.refused(response.error))
            continue
        return stream, response.result or {}  # any other answer (even an error) shows it serves


async def _connect_async(path: str, wait: RoomWait) -> socket.socket:
    import trio

    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(path)  # a Unix socket connects at once or fails at once
            return sock
        except OSError as exc:
            sock.close()
            reason = waiting_reason(exc, path)
            if reason is None:
                raise
        await trio.sleep(wait.delay(reason))


async def _handshake(stream: trio.SocketStream, path: str, wait: RoomWait) -> Response:
    """Send ``ping`` (id 0) and read its answer, or the daemon's refusal of the connection."""
    import trio

    buffer = LineBuffer(_HANDSHAKE_LINE_LIMIT)
    remaining = wait.remaining()
    try:
        with trio.fail_after(math.inf if remaining is None else remaining):
            with contextlib.suppress(trio.BrokenResourceError):
                # Turned away before it read anything? The line waiting says.
                await stream.send_all(encode_message(request_message("ping", {}, 0)))
            while True:
                data = await stream.receive_some(_HANDSHAKE_READ)
                if not data:
                    raise closed_error(path)
                for line in buffer.feed(data):
                    message = parse_incoming(line)
                    if isinstance(message, Response) and message.id in (0, None):
                        return message
    except trio.TooSlowError:
        raise wait.busy(f"the daemon at {path} answers no new connection") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise closed_error(path) from exc
