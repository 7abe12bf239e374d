"""The daemon's Unix-socket server: it moves bytes, :mod:`.dispatch` decides.

:func:`serve` listens (:mod:`.binding`), refuses peers of another user and
connections past the cap, and runs one :class:`~.connection.Connection` per
client. The server does not know the method list: every line goes to
:func:`.dispatch.dispatch`, which asks the :class:`.dispatch.Service`.
"""

from __future__ import annotations

import logging
import os

import trio

from snapshotd.contract.framing import DEFAULT_LINE_LIMIT
from snapshotd.contract.peers import peer_allowed, peer_credentials
from snapshotd.errors import Busy, InvalidRequest
from snapshotd.server.binding import adopt, bind
from snapshotd.server.budget import (
    CONNECTION_RETRY_MS,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_NOTIFICATION_BYTES,
    DEFAULT_QUEUE_BYTES,
    DEFAULT_TOTAL_QUEUE_BYTES,
    DEFAULT_WRITE_TIMEOUT,
    READ_CHUNK,
    Budget,
    Limits,
    connection_cap,
)
from snapshotd.server.connection import Connection, refuse
from snapshotd.server.dispatch import Service
from snapshotd.settings import DEFAULT_MAX_CONNECTIONS, disabled_facilities

__all__ = ["serve"]

log = logging.getLogger(__name__)


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
        (systemd socket activation, see :func:`~.binding.systemd_listen_fd`); its file
        is then left alone.
      line_limit: longest accepted line; a longer one gets an ``invalid
        request`` error and the connection is closed.
      max_in_flight: requests running at once per connection; more get ``busy``.
      queue_bytes: bytes held per connection before it is read no further
        (raised to fit one longest line); see :class:`Connection`.
      total_queue_bytes: the same, summed over all connections.
      notification_bytes: notification bytes queued per connection before a
        subscriber is told it fell behind.
      max_connections: connections served at once, lowered by
        :func:`connection_cap` to keep descriptors for the work; the excess
        get one ``busy`` error line (``"accepted": false`` and
        ``retry_after_ms``: nothing they sent was read) and are closed. The
        listen queue is as long as the system allows (see
        :func:`~.binding.listen_backlog`), so a burst waits in the kernel.
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
    limits = Limits(
        line_limit,
        max_in_flight,
        max(queue_bytes, line_limit + READ_CHUNK + 1),
        notification_bytes,
        write_timeout,
        Budget(total_queue_bytes),
    )
    cap = connection_cap(max_connections)
    live = 0
    own_uid = os.geteuid()
    bound = await bind(socket_path) if listen_fd is None else adopt(listen_fd)

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal live
        try:
            async with stream:
                peer = peer_credentials(stream.socket, switched_off="peercred" in disabled_facilities())  # None without SO_PEERCRED: the folder's 0700 is the guard
                if peer is not None and not peer_allowed(uid := peer[1], own_uid, allow_root=allow_root):
                    log.warning("refused a connection from uid %d", uid)
                    refusal = f"This daemon serves only its own user; uid {uid} is refused."
                    await refuse(stream, InvalidRequest(refusal))
                    return
                if live >= cap:
                    full = (
                        f"snapshotd is busy: it serves its limit of {cap} connections; retry in "
                        f"{CONNECTION_RETRY_MS} ms, or share one connection between sessions."
                    )
                    await refuse(stream, Busy(full, limit=cap, retry_after_ms=CONNECTION_RETRY_MS, accepted=False))
                    return
                live += 1
                try:
                    await Connection(stream, service, limits).run()
                finally:
                    live -= 1
        except Exception:
            log.exception("a connection failed")

    try:
        listener = trio.SocketListener(bound.sock)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, handle, [listener])
            where = socket_path if listen_fd is None else f"inherited fd {listen_fd}"
            log.info("listening on %s (up to %d connections at once)", where, cap)
            task_status.started(socket_path)
            try:
                await trio.sleep_forever()
            finally:
                bound.stop_listening()  # at once, even if some request cannot finish
    finally:
        with trio.CancelScope(shield=True):
            bound.release()
