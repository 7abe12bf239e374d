"""The limits of what clients may hold: bytes per connection and over all, connections at once.

:class:`Budget` counts bytes held for clients against a limit and wakes
readers waiting for room; :class:`Limits` carries every per-connection limit
to :class:`~snapshotd.server.connection.Connection`; :func:`connection_cap`
keeps descriptors for the work.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

import trio

from snapshotd.settings import DEFAULT_MAX_CONNECTIONS

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

CONNECTION_RETRY_MS = 100
"""What a connection past the cap is told: retry after this many milliseconds."""

REQUEST_RETRY_MS = 50
"""What a request past a connection's limits is told: send it again after this many milliseconds."""

DEFAULT_WRITE_TIMEOUT = 30.0
"""Seconds a write may make no progress before the client is dropped."""

READ_CHUNK = 64 * 1024
"""Bytes read from a client at once; a connection's budget fits one longest line plus this."""


def connection_cap(wanted: int = DEFAULT_MAX_CONNECTIONS) -> int:
    """Connections to serve at once: ``wanted``, lowered to leave descriptors for the work.

    A quarter of the soft RLIMIT_NOFILE (at least 64) is kept for what
    requests open: git processes and their pipes, repositories, watchers.
    The soft limit is first raised toward the hard one as far as ``wanted``
    needs (the daemon uses no ``select``, so descriptors past 1024 are fine).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    needed = wanted + max(64, wanted // 3 + 1)
    if soft < needed and (hard == resource.RLIM_INFINITY or soft < hard):
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError) as exc:
            log.warning("could not raise the descriptor limit to %d: %s", raised, exc)
    reserve = max(64, soft // 4)
    return max(1, min(wanted, soft - reserve))


class Budget:
    """Bytes held for clients, counted against a limit; waiters wake when some are given back."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._freed = trio.Event()

    def take(self, size: int) -> None:
        """Count ``size`` more bytes as held."""
        self.held += size

    def give(self, size: int) -> None:
        """Give ``size`` bytes back and wake whoever waits for room."""
        self.held -= size
        self._freed.set()
        self._freed = trio.Event()

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes stay within the limit."""
        return self.held + size <= self.limit

    async def freed(self) -> None:
        """Wait until some bytes are given back."""
        await self._freed.wait()


@dataclass(frozen=True)
class Limits:
    """Every limit of one connection, and the daemon-wide budget it shares."""

    line_limit: int
    max_in_flight: int
    queue_bytes: int
    notification_bytes: int
    write_timeout: float
    total: Budget

