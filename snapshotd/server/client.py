"""Clients for the daemon: :class:`Client` (blocking) and :class:`AsyncClient` (trio).

trio is imported only by :class:`AsyncClient`'s methods, so that the command
line and the agent hooks, which use the blocking client, do not pay for it.

Both frame and parse with :mod:`.framing` and raise the server's errors as
the matching :class:`~snapshotd.errors.SnapshotdError` subclass. A lost
connection raises :class:`ConnectionError`; a failed connect raises the
:class:`OSError` from the socket (see :func:`connect_or_none`).

Nothing is sent before the socket is known to be this user's daemon: its
folder passes the daemon's own rule (:func:`~snapshotd.fsutil.check_socket_folder`)
and the listener's credentials (SO_PEERCRED) name this user, else
:class:`UntrustedDaemon`. Another user could otherwise prepare the folder,
listen there and collect every request (paths, labels) while answering "saved".
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
import pwd
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from snapshotd.errors import SnapshotdError, UntrustedDaemon
from snapshotd.fsutil import check_socket_folder
from snapshotd.server.framing import (
    LineBuffer,
    Notification,
    Response,
    encode_message,
    parse_incoming,
    request_message,
)
from snapshotd.server.peers import peer_credentials
from snapshotd.settings import resolve_socket_path

if TYPE_CHECKING:
    import trio

__all__ = ["DEFAULT_RESPONSE_LIMIT", "AsyncClient", "Client", "UntrustedDaemon", "connect_or_none"]

log = logging.getLogger(__name__)

DEFAULT_RESPONSE_LIMIT = 1024 * 1024 * 1024
"""Longest response line a client accepts (a large diff patch can be big)."""

_READ_CHUNK = 256 * 1024
_NOTIFICATION_BUFFER = 4096


def _merge(params: Mapping[str, Any] | None, kwparams: dict[str, Any]) -> dict[str, Any]:
    merged = dict(params or {})
    merged.update(kwparams)
    return merged


def _check_folder(socket_path: str) -> None:
    """Refuse a socket whose folder another user owns or may write to (before connecting)."""
    check_socket_folder(os.path.dirname(os.path.abspath(socket_path)))


def _check_listener(sock: socket.socket | trio.socket.SocketType, socket_path: str) -> None:
    """Refuse a connected socket whose listener is not this user (SO_PEERCRED)."""
    _, uid, _ = peer_credentials(sock)
    own = os.geteuid()
    if uid != own:
        try:
            name = f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
        except KeyError:
            name = f"uid {uid}"
        raise UntrustedDaemon(
            f"Refusing the daemon at {socket_path}: it runs as another user ({name}, not uid {own}), "
            "so nothing was sent to it; set SNAPSHOTD_SOCKET or XDG_RUNTIME_DIR to a folder of your own."
        )


def _closed_error(socket_path: str) -> ConnectionError:
    return ConnectionError(
        f"The connection to snapshotd at {socket_path} closed before it replied."
    )


class Client:
    """A blocking connection to the daemon; one call at a time, not thread-safe.

    ``timeout`` bounds each socket operation (None waits forever); a timeout
    raises :class:`TimeoutError`. Notifications that arrive are discarded: use
    :class:`AsyncClient` to subscribe.
    """

    def __init__(
        self,
        socket_path: str | None = None,
        timeout: float | None = 30,
        *,
        line_limit: int = DEFAULT_RESPONSE_LIMIT,
    ) -> None:
        self.socket_path = resolve_socket_path(socket_path)
        self._ids = itertools.count(1)
        self._buffer = LineBuffer(line_limit)
        self._lines: list[bytes] = []
        _check_folder(self.socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(self.socket_path)
            _check_listener(sock, self.socket_path)
        except BaseException:
            sock.close()
            raise
        self._sock: socket.socket | None = sock

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; further calls raise :class:`ConnectionError`."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def call(
        self, method: str, params: Mapping[str, Any] | None = None, /, **kwparams: Any
    ) -> dict[str, Any]:
        """Run ``method`` and return its result; raise the server's error if it fails.

        Params come from ``params`` and keyword arguments (use the mapping for
        names that are Python keywords, such as ``from``).
        """
        sock = self._sock
        if sock is None:
            raise ConnectionError("This client is closed.")
        request_id = next(self._ids)
        sock.sendall(encode_message(request_message(method, _merge(params, kwparams), request_id)))
        while True:
            message = parse_incoming(self._next_line(sock))
            if isinstance(message, Notification):
                continue
            if message.id == request_id or (message.id is None and message.error is not None):
                return _unwrap(message)
            # A late reply to a call that timed out earlier: skip it.

    def _next_line(self, sock: socket.socket) -> bytes:
        while not self._lines:
            if self._buffer.overflow is not None:
                self.close()
                raise self._buffer.overflow
            data = sock.recv(_READ_CHUNK)
            if not data:
                self.close()
                raise _closed_error(self.socket_path)
            self._lines.extend(self._buffer.feed(data))
        return self._lines.pop(0)


def _unwrap(response: Response) -> dict[str, Any]:
    if response.error is not None:
        raise response.error
    assert response.result is not None
    return response.result


def connect_or_none(socket_path: str | None = None, timeout: float | None = 30) -> Client | None:
    """A :class:`Client` if a daemon answers at the socket, else None.

    None means no socket file (ENOENT) or nobody listening (ECONNREFUSED);
    other errors, such as a permission problem, are raised.
    """
    try:
        return Client(socket_path, timeout)
    except (FileNotFoundError, ConnectionRefusedError):
        return None


class _Pending:
    __slots__ = ("done", "error", "response")

    def __init__(self) -> None:
        import trio

        self.done = trio.Event()
        self.response: Response | None = None
        self.error: BaseException | None = None


class AsyncClient:
    """A trio connection to the daemon that pipelines concurrent calls.

    Open it with ``async with AsyncClient.connect(path) as client:``; a reader
    task matches responses to calls by id, so many tasks may ``await
    client.call(...)`` at once on one connection.
    """

    def __init__(self, stream: trio.SocketStream, socket_path: str) -> None:
        """Wrap a connected stream; prefer :meth:`connect`, which runs the reader."""
        import trio

        self.socket_path = socket_path
        self.dropped_notifications = 0
        self._stream = stream
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._write_lock = trio.Lock()
        self._closed_error: BaseException | None = None
        self._notes_send, self._notes_receive = trio.open_memory_channel[dict[str, Any]](
            _NOTIFICATION_BUFFER
        )

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, socket_path: str | None = None, *, line_limit: int = DEFAULT_RESPONSE_LIMIT
    ) -> AsyncIterator[AsyncClient]:
        """Connect, run the reader task for the block, then close."""
        import trio

        path = resolve_socket_path(socket_path)
        _check_folder(path)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.connect(path)
            _check_listener(sock, path)
        except BaseException:
            sock.close()
            raise
        stream = trio.SocketStream(sock)
        client = cls(stream, path)
        body_error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._read, line_limit)
            try:
                yield client
            except BaseException as exc:
                # Re-raised below, outside the nursery, so that it is not
                # wrapped in an exception group.
                body_error = exc
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await stream.aclose()
        if body_error is not None:
            raise body_error

    async def call(
        self, method: str, params: Mapping[str, Any] | None = None, /, **kwparams: Any
    ) -> dict[str, Any]:
        """Run ``method`` and return its result; raise the server's error if it fails."""
        import trio

        if self._closed_error is not None:
            raise copy.copy(self._closed_error)
        request_id = next(self._ids)
        data = encode_message(request_message(method, _merge(params, kwparams), request_id))
        pending = self._pending[request_id] = _Pending()
        try:
            async with self._write_lock:
                await self._stream.send_all(data)
            await pending.done.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise _closed_error(self.socket_path) from exc
        finally:
            self._pending.pop(request_id, None)
        if pending.error is not None:
            raise copy.copy(pending.error)  # one error may fail many calls
        assert pending.response is not None
        return _unwrap(pending.response)

    def notifications(self) -> trio.MemoryReceiveChannel[dict[str, Any]]:
        """The notifications the daemon sends (``{"method", "params"}``), ending at close.

        Up to a few thousand are buffered; beyond that they are dropped and
        counted in ``dropped_notifications``.
        """
        return self._notes_receive

    async def _read(self, line_limit: int) -> None:
        import trio

        buffer = LineBuffer(line_limit)
        error: BaseException = _closed_error(self.socket_path)
        try:
            while True:
                data = await self._stream.receive_some(_READ_CHUNK)
                if not data:
                    break
                for line in buffer.feed(data):
                    connection_error = self._deliver(parse_incoming(line))
                    if connection_error is not None:
                        error = connection_error
                if buffer.overflow is not None:
                    raise buffer.overflow
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except SnapshotdError as exc:
            log.warning("bad message from snapshotd: %s", exc.message)
            error = exc
        finally:
            self._closed_error = error
            for pending in self._pending.values():
                pending.error = error
                pending.done.set()
            self._notes_send.close()

    def _deliver(self, message: Response | Notification) -> SnapshotdError | None:
        """Hand a message to its waiter; return an error meant for the whole connection."""
        import trio

        if isinstance(message, Notification):
            try:
                self._notes_send.send_nowait({"method": message.method, "params": message.params})
            except trio.WouldBlock:
                self.dropped_notifications += 1
            return None
        if isinstance(message.id, int):
            pending = self._pending.get(message.id)
            if pending is not None:
                pending.response = message
                pending.done.set()
            return None
        # An error with no id is about the connection itself (for example a
        # refused peer); the daemon closes the connection after it.
        return message.error
