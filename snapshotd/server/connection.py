"""One client connection: reads lines, runs requests concurrently, writes replies within its limits.

Each request runs in its own task in the connection's nursery, so a client
may pipeline and responses may come back out of order. The connection is the
client its requests' thread calls queue under (:mod:`snapshotd.threads`
takes turns between clients), and while the client leaves more than half its
budget of replies unread its calls wait, so a client that pipelines heavy
requests and never reads makes the daemon do a bounded amount of work.
Writes go through one lock per connection. Every byte held for the client
counts against its :class:`~snapshotd.server.budget.Budget` and the
daemon-wide one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import select
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from snapshotd.contract.framing import (
    LineBuffer,
    encode_message,
    error_response,
    is_blank,
    notification_message,
)
from snapshotd.errors import Busy, SnapshotdError
from snapshotd.server.budget import READ_CHUNK, REQUEST_RETRY_MS, Budget, Limits
from snapshotd.server.dispatch import Service, dispatch, reject
from snapshotd.threads import Caller, current_caller

log = logging.getLogger(__name__)

_WRITE_CHUNK = 256 * 1024
_HANGUP_POLL_S = 0.05
_STOP_GRACE_S = 2.0
_SMALL_HOLD = 1024 * 1024  # what a connection may hold even when the daemon-wide budget is spent
_ROOM_WAIT_S = 30.0  # how long a reader waits for daemon-wide room before giving up the connection


def _peer_hung_up(sock: trio.socket.SocketType) -> bool:
    """True once the peer closed both directions (not just its writing side)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLHUP)
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))


class Connection:
    """One client: reads lines, runs requests concurrently, serialises writes.

    It is also the :class:`~snapshotd.server.dispatch.Session` the service sees. Every byte
    held for the client (its unfinished line, the lines of its running
    requests, replies and notifications not yet written) counts against the
    connection's budget and the daemon-wide one. Past its own budget nothing
    more is read (the client's writes then wait in the kernel), and a reply
    that does not fit becomes a ``busy`` error, so a client that sends without
    reading holds a bounded amount.
    """

    def __init__(self, stream: trio.SocketStream, service: Service, limits: Limits) -> None:
        self._stream = stream
        self._service = service
        self._limits = limits
        self._own = Budget(limits.queue_bytes)
        self._order = itertools.count()  # each request's place in the pipeline
        self._write_lock = trio.Lock()
        self._scope = trio.CancelScope()
        self._write_scopes: set[trio.CancelScope] = set()
        self._write_deadline = math.inf
        self._in_flight = 0
        self._unwritten = 0  # reply bytes waiting for (or in) a write
        self._aborted = False
        self._ended = False
        self._callbacks: list[Callable[[], None]] = []
        self._notes: deque[bytes] = deque()
        self._notes_bytes = 0
        self._notes_ready = trio.Event()

    # Session ---------------------------------------------------------------

    async def notify(
        self,
        method: str,
        params: dict[str, Any],
        fallback: dict[str, Any] | None = None,
        fallback_method: str | None = None,
    ) -> bool:
        """Queue a notification; False when the client has gone or is too far behind.

        A client behind by more than the notification budget gets ``fallback``
        (a short notice, sent as ``fallback_method``, default ``method``)
        instead, if given; the caller should then stop.
        """
        data = encode_message(notification_message(method, params))
        await trio.lowlevel.checkpoint()
        if self._aborted or self._ended:
            return False
        room = self._limits.notification_bytes - self._notes_bytes
        if len(data) <= room and self._limits.total.fits(len(data)):
            self._queue_note(data)
            return True
        log.warning("a client fell %d bytes of notifications behind", self._notes_bytes)
        if fallback is not None:
            self._queue_note(encode_message(notification_message(fallback_method or method, fallback)))
        return False

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the connection ends (at once if it has ended)."""
        if self._ended:
            self._run_callback(callback)
        else:
            self._callbacks.append(callback)

    # Running ---------------------------------------------------------------

    async def run(self) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_notifications)
                    try:
                        if await self._read_requests(nursery):
                            await self._finish_in_flight()
                    except trio.Cancelled:
                        # The daemon is stopping: ready responses get a short
                        # grace period to go out, then everything ends.
                        self._limit_writes(trio.current_time() + _STOP_GRACE_S)
                        raise
                    self._abort()
        finally:
            self._ended = True
            self._limits.total.give(self._own.held)  # whatever was still held for this client
            self._notes.clear()
            callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                self._run_callback(callback)
            with trio.CancelScope(shield=True):
                await self._stream.aclose()

    def _abort(self) -> None:
        """End the connection now: cancel its requests and any write in progress."""
        self._aborted = True
        self._scope.cancel()
        for scope in self._write_scopes:
            scope.cancel()

    def _limit_writes(self, deadline: float) -> None:
        self._write_deadline = min(self._write_deadline, deadline)
        for scope in self._write_scopes:
            scope.deadline = min(scope.deadline, deadline)

    def _hold(self, size: int) -> None:
        self._own.take(size)
        self._limits.total.take(size)

    def _release(self, size: int) -> None:
        self._own.give(size)
        self._limits.total.give(size)

    async def _wait_to_read(self) -> bool:
        """Wait until this connection may read more; False once daemon-wide room did not come in time.

        Over its own budget it waits as long as it takes: its requests finish
        and its replies are read, or the write timeout drops the client. A
        connection holding little may always read; one holding more also
        needs room in the daemon-wide budget, and waits for it a bounded time.
        """
        total = self._limits.total
        deadline: float | None = None
        while True:
            if self._own.held >= self._own.limit:
                deadline = None
            elif self._own.held < _SMALL_HOLD or total.held < total.limit:
                return True
            elif deadline is None:
                deadline = trio.current_time() + _ROOM_WAIT_S
            elif trio.current_time() >= deadline:
                return False
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await total.freed()  # every release gives back to the total too

    def _rehold(self, before: int, after: int) -> None:
        if after > before:
            self._hold(after - before)
        elif after < before:
            self._release(before - after)

    async def _read_requests(self, nursery: trio.Nursery) -> bool:
        """Read and start requests until end of input or a refused line.

        Returns True when requests in flight should still be answered: the
        client only closed its writing side, or sent a line over the limit
        (everything before that line is still answered; nothing more is read).
        """
        buffer = LineBuffer(self._limits.line_limit)
        buffered = 0
        while True:
            if not await self._wait_to_read():
                busy = Busy(
                    "The daemon holds its limit of bytes for other clients; send this again later.",
                    retry_after_ms=REQUEST_RETRY_MS,
                )
                await self._send(encode_message(error_response(None, busy)))
                return False
            try:
                data = await self._stream.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return False
            if not data:
                break
            lines = buffer.feed(data)
            self._rehold(buffered, len(buffer))
            buffered = len(buffer)
            for line in lines:
                await self._submit(line, nursery)
            if buffer.overflow is not None:
                log.warning("closing a connection: %s", buffer.overflow.message)
                await self._send(encode_message(error_response(None, buffer.overflow)))
                return True
        if _peer_hung_up(self._stream.socket):
            return False
        last = buffer.finish()
        self._release(buffered)
        if last is not None:
            await self._submit(last, nursery)
        return True

    async def _submit(self, line: bytes, nursery: trio.Nursery) -> None:
        if is_blank(line):
            return
        if self._in_flight >= self._limits.max_in_flight:
            busy = Busy(
                f"This connection already has {self._limits.max_in_flight} requests "
                "in flight; wait for some to finish.",
                retry_after_ms=REQUEST_RETRY_MS,
            )
            response = reject(line, busy)
            if response is not None:
                await self._send(response)
            return
        self._in_flight += 1
        self._hold(len(line))
        nursery.start_soon(self._run_request, line, next(self._order))

    async def _run_request(self, line: bytes, order: int) -> None:
        try:
            current_caller.set(Caller(self, order))  # this request's thread calls queue under this connection
            reply = await self._answer(line)
            if reply is not None:
                await self._send_reply(reply)
        finally:
            self._in_flight -= 1
            self._release(len(line))

    def ready(self) -> bool:
        """Whether this client's work may use a worker thread: not while it leaves over half its budget unread.

        Its replies would only be refused as ``busy`` once computed; its work
        waits until it reads, or the write timeout drops it.
        """
        return self._unwritten <= self._own.limit // 2

    async def wait_ready(self) -> None:
        await self._own.freed()  # written replies give their bytes back

    async def _answer(self, line: bytes) -> bytes | None:
        """The reply line that will be sent; a refused large reply is not kept while waiting to write."""
        response = await dispatch(self._service, line, self)
        return None if response is None else self._fitting(line, response)

    def _fitting(self, line: bytes, response: bytes) -> bytes:
        """``response``, or a ``busy`` error for its request when it does not fit the budgets.

        One reply always fits a connection with nothing else waiting to be
        written, however large, if the daemon-wide budget has room.
        """
        size = len(response)
        if not self._limits.total.fits(size):
            message = (
                f"The daemon already holds its limit of {self._limits.total.limit} bytes of replies "
                f"for its clients, and this reply has {size}; try again once they have read theirs."
            )
        elif self._unwritten and not self._own.fits(size):
            message = (
                f"This connection has {self._unwritten} bytes of replies unread, and this reply of "
                f"{size} would pass its limit of {self._own.limit}; read the replies before sending more."
            )
        else:
            return response
        return reject(line, Busy(message, retry_after_ms=REQUEST_RETRY_MS)) or b""

    async def _send_reply(self, data: bytes) -> None:
        self._hold(len(data))
        self._unwritten += len(data)
        try:
            await self._send(data)
        finally:
            self._unwritten -= len(data)
            self._release(len(data))

    def _queue_note(self, data: bytes) -> None:
        self._notes.append(data)
        self._notes_bytes += len(data)
        self._hold(len(data))
        self._notes_ready.set()

    async def _finish_in_flight(self) -> None:
        """Wait for running requests after a half-close, unless the peer hangs up."""
        while self._in_flight and not self._aborted:
            if _peer_hung_up(self._stream.socket):
                return
            await trio.sleep(_HANGUP_POLL_S)

    async def _write_notifications(self) -> None:
        while True:
            if not self._notes:
                await self._notes_ready.wait()
                self._notes_ready = trio.Event()
                continue
            data = self._notes.popleft()
            try:
                await self._send(data)
            finally:
                self._notes_bytes -= len(data)
                self._release(len(data))

    async def _send(self, data: bytes) -> None:
        """Write one message whole; on failure end the connection.

        The write is shielded so that a response that is ready still goes out
        while the daemon stops (within a grace period). A peer that takes no
        bytes for the write timeout is dropped, and aborting the connection
        stops the write at once.
        """
        if self._aborted or not data:
            return
        view = memoryview(data)
        if not self._write_lock.locked():  # no write before it: what the socket takes now goes at once
            try:
                view = view[os.write(self._stream.socket.fileno(), view[:_WRITE_CHUNK]) :]
            except BlockingIOError:
                pass
            except OSError as exc:  # the peer went (EPIPE), or the socket is closed
                log.debug("write to a client failed: %r", exc)
                self._abort()
                return
            if not view:
                return
        with trio.CancelScope(shield=True, deadline=self._write_deadline) as scope:
            self._write_scopes.add(scope)
            try:
                async with self._write_lock:
                    for start in range(0, len(view), _WRITE_CHUNK):
                        with trio.fail_after(self._limits.write_timeout):
                            await self._stream.send_all(view[start : start + _WRITE_CHUNK])
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError) as exc:
                log.debug("write to a client failed: %r", exc)
                self._abort()
            finally:
                self._write_scopes.discard(scope)
        if scope.cancelled_caught:
            self._abort()  # a partial message may have gone out: nothing more can follow

    @staticmethod
    def _run_callback(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("a connection close callback failed")


async def refuse(stream: trio.SocketStream, err: SnapshotdError) -> None:
    """Send one error line to a connection that will not be served."""
    with trio.move_on_after(1):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(encode_message(error_response(None, err)))

