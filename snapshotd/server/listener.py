"""The daemon's Unix-socket server: it moves bytes, :mod:`.protocol` decides.

One task per connection reads lines; each request runs in its own task in the
connection's nursery, so a client may pipeline and responses may come back
out of order. Writes go through one lock per connection. The server does not
know the method list: every line goes to :func:`.protocol.dispatch`, which asks
the :class:`.protocol.Service`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import resource
import select
import socket
import stat
import struct
from collections import deque
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import trio

from snapshotd.errors import Busy, InvalidRequest, SnapshotdError
from snapshotd.fsutil import check_socket_folder
from snapshotd.server.protocol import (
    DEFAULT_LINE_LIMIT,
    LineBuffer,
    Service,
    dispatch,
    encode_message,
    error_response,
    is_blank,
    notification_message,
    reject,
)

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_NOTIFICATION_BYTES",
    "DEFAULT_QUEUE_BYTES",
    "DEFAULT_TOTAL_QUEUE_BYTES",
    "DEFAULT_WRITE_TIMEOUT",
    "connection_cap",
    "dispatch",
    "peer_allowed",
    "peer_credentials",
    "serve",
    "systemd_listen_fd",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = 256
"""Requests one connection may have running at once; more get a ``busy`` error."""

DEFAULT_QUEUE_BYTES = 32 * 1024 * 1024
"""Bytes one connection may hold: lines being read or run, replies and notifications unwritten.

While it holds more, nothing more is read from it; a reply that does not fit
becomes a ``busy`` error. At least the line limit, so that one longest line fits.
"""

DEFAULT_TOTAL_QUEUE_BYTES = 128 * 1024 * 1024
"""The same bytes summed over every connection; past it replies become ``busy`` errors."""

DEFAULT_NOTIFICATION_BYTES = 1024 * 1024
"""Notification bytes queued for one client; past it a subscriber gets its overflow notice."""

DEFAULT_MAX_CONNECTIONS = 1000
"""Connections served at once (lowered to fit the descriptor limit); more are refused."""

DEFAULT_WRITE_TIMEOUT = 30.0
"""Seconds a write may make no progress before the client is dropped."""

SD_LISTEN_FDS_START = 3
_READ_CHUNK = 64 * 1024
_WRITE_CHUNK = 256 * 1024
_BACKLOG = 128
_HANGUP_POLL_S = 0.05
_STOP_GRACE_S = 2.0
_SMALL_HOLD = 1024 * 1024  # what a connection may hold even when the daemon-wide budget is spent
_ROOM_WAIT_S = 30.0  # how long a reader waits for daemon-wide room before giving up the connection
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


# --------------------------------------------------------------------------
# Peer credentials and systemd activation.


def peer_credentials(sock: socket.socket | trio.socket.SocketType) -> tuple[int, int, int]:
    """The connected peer's ``(pid, uid, gid)`` from SO_PEERCRED."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def peer_allowed(peer_uid: int, own_uid: int, *, allow_root: bool = False) -> bool:
    """Whether a peer may talk to a daemon run by ``own_uid``: same user, or root if allowed."""
    return peer_uid == own_uid or (allow_root and peer_uid == 0)


def systemd_listen_fd(environ: MutableMapping[str, str] | None = None) -> int | None:
    """The listening socket systemd passed us (socket activation), or None.

    Follows ``sd_listen_fds``: the fd is 3 when ``LISTEN_PID`` is this process
    and ``LISTEN_FDS`` is at least 1. The variables are removed so that child
    processes do not inherit them.
    """
    env = os.environ if environ is None else environ
    try:
        pid = int(env.get("LISTEN_PID", ""))
        count = int(env.get("LISTEN_FDS", ""))
    except ValueError:
        return None
    if pid != os.getpid() or count < 1:
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(name, None)
    if count > 1:
        log.warning("systemd passed %d sockets; only the first is used", count)
    return SD_LISTEN_FDS_START


# --------------------------------------------------------------------------
# The socket file.


def _take_lock(lock_path: str, socket_path: str) -> int:
    """Hold an exclusive lock beside the socket so two daemons never race for it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy(
            f"Another snapshotd is already serving {socket_path}.", socket=socket_path
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


async def _socket_answers(path: str) -> bool:
    """Whether something accepts connections on ``path`` (False only on ECONNREFUSED/ENOENT)."""
    probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with probe:
        try:
            with trio.fail_after(2):
                await probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except trio.TooSlowError:
            return True
    return True


def _refuse_non_socket(path: str) -> bool:
    """Raise if something other than a socket is at ``path``; True when a socket is there."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(info.st_mode):
        raise FileExistsError(f"Refusing to replace {path}: it exists and is not a socket.")
    return True


async def _remove_stale_socket(path: str) -> None:
    """Remove a socket file nobody listens on; refuse if a daemon answers there."""
    if not _refuse_non_socket(path):
        return
    if await _socket_answers(path):
        raise Busy(f"Another snapshotd is already serving {path}.", socket=path)
    log.info("removing stale socket %s", path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _remove_socket(path: str, identity: tuple[int, int]) -> None:
    """Unlink our socket file, unless something else has replaced it since."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if (info.st_dev, info.st_ino) == identity:
        os.unlink(path)


@dataclass
class _Bound:
    sock: trio.socket.SocketType
    path: str | None = None  # set when we own the socket file
    identity: tuple[int, int] = (0, 0)
    lock_fd: int | None = None

    def stop_listening(self) -> None:
        """Remove the socket file (if ours) and close the socket; the lock stays held."""
        try:
            if self.path is not None:
                path, self.path = self.path, None
                _remove_socket(path, self.identity)
        finally:
            self.sock.close()

    def release(self) -> None:
        """Stop listening and drop the lock, so that another daemon may take the path."""
        try:
            self.stop_listening()
        finally:
            if self.lock_fd is not None:
                os.close(self.lock_fd)
                self.lock_fd = None


async def _bind(socket_path: str) -> _Bound:
    path = os.path.abspath(socket_path)
    if len(os.fsencode(path)) >= 108:
        raise OSError(errno.ENAMETOOLONG, f"The socket path {path} is too long for a Unix socket.")
    check_socket_folder(os.path.dirname(path), create=True)
    _refuse_non_socket(path)  # before the lock file, so a refused path leaves nothing beside it
    lock_fd = _take_lock(path + ".lock", path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await _remove_stale_socket(path)
        try:
            await sock.bind(path)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise Busy(f"Another snapshotd is already serving {path}.", socket=path) from exc
            raise
        os.chmod(path, 0o600)
        info = os.stat(path)
        sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        os.close(lock_fd)
        raise
    return _Bound(sock, path, (info.st_dev, info.st_ino), lock_fd)


def _adopt(listen_fd: int) -> _Bound:
    stdlib_sock = socket.socket(fileno=listen_fd)
    if stdlib_sock.family != socket.AF_UNIX or stdlib_sock.type != socket.SOCK_STREAM:
        stdlib_sock.detach()
        raise ValueError(f"The inherited fd {listen_fd} is not a Unix stream socket.")
    if not stdlib_sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        stdlib_sock.listen(_BACKLOG)  # keep the backlog systemd chose if it listens already
    return _Bound(trio.socket.from_stdlib_socket(stdlib_sock))


# --------------------------------------------------------------------------
# Connections.


def connection_cap(wanted: int = DEFAULT_MAX_CONNECTIONS) -> int:
    """Connections to serve at once: ``wanted``, lowered to leave descriptors for the work.

    A quarter of the soft RLIMIT_NOFILE (at least 64) is kept for what
    requests open: git processes and their pipes, repositories, watchers.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    reserve = max(64, soft // 4)
    return max(1, min(wanted, soft - reserve))


class _Budget:
    """Bytes held for clients, counted against a limit; waiters wake when some are given back."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._freed = trio.Event()

    def take(self, size: int) -> None:
        self.held += size

    def give(self, size: int) -> None:
        self.held -= size
        self._freed.set()
        self._freed = trio.Event()

    def fits(self, size: int) -> bool:
        return self.held + size <= self.limit

    async def freed(self) -> None:
        """Wait until some bytes are given back."""
        await self._freed.wait()


@dataclass(frozen=True)
class _Limits:
    line_limit: int
    max_in_flight: int
    queue_bytes: int
    notification_bytes: int
    write_timeout: float
    total: _Budget


def _peer_hung_up(sock: trio.socket.SocketType) -> bool:
    """True once the peer closed both directions (not just its writing side)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLHUP)
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))


class _Connection:
    """One client: reads lines, runs requests concurrently, serialises writes.

    It is also the :class:`.protocol.Session` the service sees. Every byte
    held for the client (its unfinished line, the lines of its running
    requests, replies and notifications not yet written) counts against the
    connection's budget and the daemon-wide one. Past its own budget nothing
    more is read (the client's writes then wait in the kernel), and a reply
    that does not fit becomes a ``busy`` error, so a client that sends without
    reading holds a bounded amount.
    """

    def __init__(self, stream: trio.SocketStream, service: Service, limits: _Limits) -> None:
        self._stream = stream
        self._service = service
        self._limits = limits
        self._own = _Budget(limits.queue_bytes)
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
        self, method: str, params: dict[str, Any], fallback: dict[str, Any] | None = None
    ) -> bool:
        """Queue a notification; False when the client has gone or is too far behind.

        A client behind by more than the notification budget gets ``fallback``
        (a short notice) instead, if given; the caller should then stop.
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
            self._queue_note(encode_message(notification_message(method, fallback)))
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
                busy = Busy("The daemon holds its limit of bytes for other clients; send this again later.")
                await self._send(encode_message(error_response(None, busy)))
                return False
            try:
                data = await self._stream.receive_some(_READ_CHUNK)
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
            )
            response = reject(line, busy)
            if response is not None:
                await self._send(response)
            return
        self._in_flight += 1
        self._hold(len(line))
        nursery.start_soon(self._run_request, line)

    async def _run_request(self, line: bytes) -> None:
        try:
            reply = await self._answer(line)
            if reply is not None:
                await self._send_reply(reply)
        finally:
            self._in_flight -= 1
            self._release(len(line))

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
        return reject(line, Busy(message)) or b""

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


async def _refuse(stream: trio.SocketStream, err: SnapshotdError) -> None:
    """Send one error line to a connection that will not be served."""
    with trio.move_on_after(1):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(encode_message(error_response(None, err)))


# --------------------------------------------------------------------------
# The server.


async def serve(
    service: Service,
    socket_path: str,
    *,
    allow_root: bool = False,
    listen_fd: int | None = None,
    line_limit: int = DEFAULT_LINE_LIMIT,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    queue_bytes: int = DEFAULT_QUEUE_BYTES,
    total_queue_bytes: int = DEFAULT_TOTAL_QUEUE_BYTES,
    notification_bytes: int = DEFAULT_NOTIFICATION_BYTES,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    write_timeout: float = DEFAULT_WRITE_TIMEOUT,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``service`` on a Unix socket until cancelled.

    Args:
      service: answers every request; the server knows no method names.
      socket_path: where to listen. Its folder is created mode 0700 (an
        existing one must be ours and not writable by others), a stale socket
        is replaced, and the socket is made mode 0600.
      allow_root: also accept peers running as root.
      listen_fd: an already listening socket to use instead of binding
        (systemd socket activation, see :func:`systemd_listen_fd`); its file
        is then left alone.
      line_limit: longest accepted line; a longer one gets an ``invalid
        request`` error and the connection is closed.
      max_in_flight: requests running at once per connection; more get ``busy``.
      queue_bytes: bytes held per connection before it is read no further
        (raised to fit one longest line); see :class:`_Connection`.
      total_queue_bytes: the same, summed over all connections.
      notification_bytes: notification bytes queued per connection before a
        subscriber is told it fell behind.
      max_connections: connections served at once, lowered by
        :func:`connection_cap` to keep descriptors for the work; the excess
        get one ``busy`` error line and are closed.
      write_timeout: seconds a write may make no progress before the client
        is dropped.
      task_status: receives ``socket_path`` once the server is listening.

    Resource handling:
      When cancelled, the server stops listening and removes its socket file
      at once; then every connection is closed. A client that disconnects has
      its requests in flight cancelled and its ``on_close`` callbacks run.
      Ready responses are still written while stopping, so a ``shutdown``
      method that triggers the cancel as its last step gets its answer out.

    Error handling:
      Raises :class:`~snapshotd.errors.Busy` if another daemon serves the path,
      :class:`PermissionError` for an unsafe socket folder and
      :class:`FileExistsError` if a non-socket file is in the way. An exception
      from the service that is not a ``SnapshotdError`` becomes an ``internal
      error`` response and is logged; a failing connection is logged and closed.
      The daemon stays up.
    """
    limits = _Limits(
        line_limit,
        max_in_flight,
        max(queue_bytes, line_limit + _READ_CHUNK + 1),
        notification_bytes,
        write_timeout,
        _Budget(total_queue_bytes),
    )
    cap = connection_cap(max_connections)
    live = 0
    own_uid = os.geteuid()
    bound = await _bind(socket_path) if listen_fd is None else _adopt(listen_fd)

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal live
        try:
            async with stream:
                _, uid, _ = peer_credentials(stream.socket)
                if not peer_allowed(uid, own_uid, allow_root=allow_root):
                    log.warning("refused a connection from uid %d", uid)
                    refusal = f"This daemon serves only its own user; uid {uid} is refused."
                    await _refuse(stream, InvalidRequest(refusal))
                    return
                if live >= cap:
                    full = f"The daemon already serves {cap} connections; close some and try again."
                    await _refuse(stream, Busy(full, limit=cap))
                    return
                live += 1
                try:
                    await _Connection(stream, service, limits).run()
                finally:
                    live -= 1
        except Exception:
            log.exception("a connection failed")

    try:
        listener = trio.SocketListener(bound.sock)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, handle, [listener])
            log.info("listening on %s", socket_path if listen_fd is None else f"inherited fd {listen_fd}")
            task_status.started(socket_path)
            try:
                await trio.sleep_forever()
            finally:
                bound.stop_listening()  # at once, even if some request cannot finish
    finally:
        with trio.CancelScope(shield=True):
            bound.release()
