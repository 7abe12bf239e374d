"""Requests on one new connection, on the standard library's light modules: an agent hook's fast path.

Every agent event starts a hook process that the agent waits for, and
:class:`~snapshotd.client.rpc.Client` with its framing and dialing costs
more to import than a warm checkpoint takes. :func:`call` does what that
client does in the ordinary case and nothing more: the socket's folder and
listener are checked before anything is sent (the same rules:
:func:`~snapshotd.socketfolder.check_socket_folder`, SO_PEERCRED), a ``ping``
bounds the wait for a daemon that accepts and never answers, sent with the
first request, and every request of the hook goes on that connection
(:class:`Connection`). Anything else (no daemon, a daemon starting or busy, a
folder or listener the rules refuse) raises :class:`Unusual`, and the caller
takes the full client, which starts a daemon, waits for room and words each
refusal.
"""

from __future__ import annotations

# The C module under :mod:`socket`, whose own import (enums, selectors) a hook would pay for.
import _socket
import os

from snapshotd.contract.peers import peer_credentials
from snapshotd.errors import InternalError, SnapshotdError
from snapshotd.jsonlite import dumps, loads
from snapshotd.settings import disabled_facilities
from snapshotd.socketfolder import check_socket_folder

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from typing import Any

_READ_CHUNK = 65536
_LINE_LIMIT = 64 * 1024 * 1024


class Unusual(Exception):
    """Not the ordinary case: the full client deals with it (and says what went wrong)."""


class Silent(InternalError):
    """The daemon accepts connections and answers no ping."""


def _line(message: dict[str, Any]) -> bytes:
    """A request as protocol.md frames it: one compact ASCII JSON object and a newline."""
    return dumps(message).encode("ascii") + b"\n"


class _Lines:
    """The replies on one connection, a line at a time."""

    def __init__(self, sock: _socket.socket, path: str) -> None:
        self.sock, self.path, self.buffer = sock, path, b""

    def reply(self, request_id: int) -> dict[str, Any]:
        """The response to ``request_id`` (notifications and stale replies skipped)."""
        while True:
            while b"\n" not in self.buffer:
                data = self.sock.recv(_READ_CHUNK)
                if not data:
                    raise ConnectionError(f"The connection to snapshotd at {self.path} closed before it replied.")
                self.buffer += data
                if len(self.buffer) > _LINE_LIMIT:
                    raise InternalError(f"snapshotd at {self.path} sent a reply longer than {_LINE_LIMIT} bytes.")
            line, _, self.buffer = self.buffer.partition(b"\n")
            message = loads(line.decode("utf-8"))
            if isinstance(message, dict) and "method" not in message and message.get("id") in (request_id, None):
                return message


class Connection:
    """Requests to the daemon at ``socket_path`` on one connection, made by the first :meth:`call`.

    The first request goes out in the same write as the ``ping`` that bounds
    the wait for a daemon that accepts and never answers (``ping_timeout_s``):
    the daemon answers the ping at once, and a daemon that turns the
    connection away does so before it reads either, so nothing ran when
    :class:`Unusual` is raised. Later requests wait for their answer as long
    as it takes; the hook's own limits bound them.
    """

    def __init__(self, socket_path: str, ping_timeout_s: float) -> None:
        self.path, self.ping_timeout_s = socket_path, ping_timeout_s
        self.sock: _socket.socket | None = None
        self.lines: _Lines | None = None
        self.request_id = 0

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """``method``'s result; its error as a :class:`SnapshotdError`."""
        self.request_id += 1
        request = _line({"jsonrpc": "2.0", "id": self.request_id, "method": method, "params": params})
        if self.sock is None or self.lines is None:
            self.lines = self._open(request)
        else:
            self.sock.sendall(request)
        response = self.lines.reply(self.request_id)
        error = response.get("error")
        if isinstance(error, dict):
            raise SnapshotdError.from_dict(error)
        result = response.get("result")
        if not isinstance(result, dict):
            raise InternalError(f"snapshotd at {self.path} answered {method} with no result.")
        return result

    def _open(self, request: bytes) -> _Lines:
        """Connect, check the listener, send the ping and ``request``, and read the ping's answer."""
        try:
            check_socket_folder(os.path.dirname(os.path.abspath(self.path)))
        except OSError as exc:
            raise Unusual(str(exc)) from exc
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.settimeout(self.ping_timeout_s)
            try:
                sock.connect(self.path)
            except OSError as exc:  # nobody listens, a daemon starts, or its queue is full
                raise Unusual(str(exc)) from exc
            peer = peer_credentials(sock, switched_off="peercred" in disabled_facilities())  # None without SO_PEERCRED: the folder checked is the guard
            if peer is not None and peer[1] != os.geteuid():
                raise Unusual("another user listens")
            lines = _Lines(sock, self.path)
            try:
                sock.sendall(_line({"jsonrpc": "2.0", "id": 0, "method": "ping", "params": {}}) + request)
                answer = lines.reply(0)
            except TimeoutError:
                raise Silent(
                    f"snapshotd at {self.path} accepts connections but did not answer within {self.ping_timeout_s:g} s; "
                    "see its log, or restart it (snapshotd stop)."
                ) from None
            except OSError as exc:  # turned away before it read anything
                raise Unusual(str(exc)) from exc
            if "error" in answer:  # a busy daemon turns the connection away with an error: the full client waits for room
                raise Unusual(str(answer["error"]))
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        self.sock = sock
        return lines

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = self.lines = None


def call(socket_path: str, method: str, params: dict[str, Any], ping_timeout_s: float) -> dict[str, Any]:
    """``method``'s result from the daemon at ``socket_path``, on a connection of its own (:class:`Connection`).

    Raises :class:`Unusual` when the full client should take over, and
    :class:`~snapshotd.errors.InternalError` when the daemon accepts but does
    not answer a ``ping`` within ``ping_timeout_s``.
    """
    connection = Connection(socket_path, ping_timeout_s)
    try:
        return connection.call(method, params)
    finally:
        connection.close()
