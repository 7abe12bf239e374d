"""Clients for the daemon: :class:`Client` (blocking) and :class:`AsyncClient` (trio).

trio is imported only by :class:`AsyncClient`'s methods, so that the command
line and the agent hooks, which use the blocking client, do not pay for it.

Both frame and parse with :mod:`snapshotd.contract.framing` and raise the
server's errors as the matching :class:`~snapshotd.errors.SnapshotdError`
subclass. A lost connection raises :class:`ConnectionError`; a failed connect
raises the :class:`OSError` from the socket (see :func:`connect_or_none`).

A busy daemon is waited for, not failed on: both clients retry a full listen
queue, a daemon that is starting and a connection the daemon turned away at
its cap, for their connect timeout, then raise :class:`~snapshotd.errors.Busy`
(see :mod:`.dialing`). :class:`AsyncClient` confirms each connection with a
``ping`` before handing it out; :class:`Client` sends its first call at once
and sends it again on a new connection if the daemon turned that one away.

Nothing is sent before the socket is known to be this user's daemon (its
folder and its listener are checked, see :mod:`.dialing`), else
:class:`UntrustedDaemon`. Another user could otherwise prepare the folder,
listen there and collect every request (paths, labels) while answering "saved".
"""

from __future__ import annotations

import copy
import itertools
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from snapshotd.client.dialing import (
    STOPPED_CHECK_S,
    RoomWait,
    closed_error,
    connect_blocking,
    dial_async,
    is_refusal,
    listener_pid,
    stopped_daemon,
)
from snapshotd.contract.framing import (
    LineBuffer,
    Notification,
    Response,
    encode_message,
    parse_incoming,
    request_message,
)
from snapshotd.errors import SnapshotdError, UntrustedDaemon
from snapshotd.settings import connect_timeout as default_connect_timeout, resolve_socket_path

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


class Client:
    """A blocking connection to the daemon; one call at a time, not thread-safe.

    ``timeout`` bounds each socket operation (None waits forever); a timeout
    raises :class:`TimeoutError`. ``connect_timeout`` bounds the wait for room
    at a busy daemon (default: ``timeout``, or ``$SNAPSHOTD_CONNECT_TIMEOUT``
    when that is None). Notifications that arrive are discarded: use
    :class:`AsyncClient` to subscribe.
    """

    def __init__(
        self,
        socket_path: str | None = None,
        timeout: float | None = 30,
        *,
        line_limit: int = DEFAULT_RESPONSE_LIMIT,
        connect_timeout: float | None = None,
    ) -> None:
        self.socket_path = resolve_socket_path(socket_path)
        self._timeout = timeout
        self._ids = itertools.count(1)
        self._line_limit = line_limit
        self._buffer = LineBuffer(line_limit)
        self._lines: list[bytes] = []
        if connect_timeout is None:
            connect_timeout = timeout if timeout is not None else default_connect_timeout()
        # Kept until the first reply: until then the daemon may still turn the connection away.
        self._wait: RoomWait | None = RoomWait(self.socket_path, connect_timeout)
        self._sock: socket.socket | None = self._dial(self._wait)

    def _dial(self, wait: RoomWait) -> socket.socket:
        sock = connect_blocking(self.socket_path, wait, self._timeout)
        self._daemon_pid = listener_pid(sock)
        return sock

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def time_limit(self, seconds: float) -> Iterator[None]:
        """Bound each socket operation of the calls in the block to ``seconds`` (:class:`TimeoutError`)."""
        previous = self._timeout
        self._timeout = seconds
        if self._sock is not None:
            self._sock.settimeout(seconds)
        try:
            yield
        finally:
            self._timeout = previous
            if self._sock is not None:
                self._sock.settimeout(previous)

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
        request_id = next(self._ids)
        data = encode_message(request_message(method, _merge(params, kwparams), request_id))
        while True:
            sock = self._sock
            if sock is None:
                raise ConnectionError("This client is closed.")
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                if self._wait is None:
                    raise
                # Turned away before it read anything? The line waiting says.
            response = self._reply(sock, request_id)
            wait = self._wait
            if wait is not None and is_refusal(response.error):
                assert response.error is not None
                self.close()
                time.sleep(wait.refused(response.error))
                self._buffer, self._lines = LineBuffer(self._line_limit), []
                self._sock = self._dial(wait)
                continue
            self._wait = None
            return _unwrap(response)

    def _reply(self, sock: socket.socket, request_id: int) -> Response:
        while True:
            message = parse_incoming(self._next_line(sock))
            if isinstance(message, Notification):
                continue
            if message.id == request_id or (message.id is None and message.error is not None):
                return message
            # A late reply to a call that timed out earlier: skip it.

    def _next_line(self, sock: socket.socket) -> bytes:
        while not self._lines:
            if self._buffer.overflow is not None:
                self.close()
                raise self._buffer.overflow
            data = self._recv(sock)
            if not data:
                self.close()
                raise closed_error(self.socket_path)
            self._lines.extend(self._buffer.feed(data))
        return self._lines.pop(0)


    def _recv(self, sock: socket.socket) -> bytes:
        """What the daemon sends next, within the timeout; a daemon found stopped while waiting is :class:`Busy`."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"snapshotd at {self.socket_path} did not answer within {self._timeout:g} s.")
            sock.settimeout(STOPPED_CHECK_S if left is None else min(left, STOPPED_CHECK_S))
            try:
                return sock.recv(_READ_CHUNK)
            except TimeoutError:
                stopped = stopped_daemon(self._daemon_pid, self.socket_path)
                if stopped is not None:
                    raise stopped from None
            finally:
                sock.settimeout(self._timeout)


def _unwrap(response: Response) -> dict[str, Any]:
    if response.error is not None:
        raise response.error
    assert response.result is not None
    return response.result


def connect_or_none(socket_path: str | None = None, timeout: float | None = 30) -> Client | None:
    """A :class:`Client` if a daemon answers at the socket, else None.

    None means no socket file (ENOENT) or nobody listening (ECONNREFUSED)
    while no daemon is starting; other errors, such as a permission problem
    or :class:`~snapshotd.errors.Busy`, are raised.
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
    client.call(...)`` at once on one connection. One connection serves any
    number of sessions (``session`` is a param of each call), up to 256
    requests running at once; more sessions in flight share a small pool of
    connections (``python -m bench --only scale --pool N``) rather than one each.
    """

    def __init__(self, stream: trio.SocketStream, socket_path: str) -> None:
        """Wrap a connected stream; prefer :meth:`connect`, which runs the reader."""
        import trio

        self.socket_path = socket_path
        self.daemon: dict[str, Any] = {}  # the ping result of the connection's handshake
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
        cls,
        socket_path: str | None = None,
        *,
        line_limit: int = DEFAULT_RESPONSE_LIMIT,
        connect_timeout: float | None = None,
    ) -> AsyncIterator[AsyncClient]:
        """Connect, run the reader task for the block, then close.

        ``connect_timeout`` (default ``$SNAPSHOTD_CONNECT_TIMEOUT``, 30 s) bounds
        the wait for room at a busy daemon; then :class:`~snapshotd.errors.Busy`.
        The connection is confirmed with a ``ping``, whose result is :attr:`daemon`.
        """
        import trio

        path = resolve_socket_path(socket_path)
        wait = RoomWait(path, default_connect_timeout() if connect_timeout is None else connect_timeout)
        stream, daemon = await dial_async(path, wait)
        client = cls(stream, path)
        client.daemon = daemon
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
            raise closed_error(self.socket_path) from exc
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
        error: BaseException = closed_error(self.socket_path)
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

