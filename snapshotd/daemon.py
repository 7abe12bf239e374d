"""The daemon: the engine served on the socket, with clean start-up and shutdown.

Everything runs in one nursery: the socket server, one task group per watched
worktree, and the subscriptions. SIGTERM, SIGINT and the ``shutdown`` method
cancel it; the server then removes its socket under a shield. A crash leaves
only a socket file, which the next start finds dead and replaces.
"""

from __future__ import annotations

import logging
import signal

import trio

from .engine import Engine
from .protocol import resolve_socket_path
from .server import serve, systemd_listen_fd

log = logging.getLogger("snapshotd")
SHUTDOWN_GRACE_S = 0.05
THREADS_FOR_WATCHERS = 10_000


async def serve_daemon(
    socket_path: str | None = None,
    *,
    allow_root: bool = False,
    size_cap: int | None = None,
    watch: bool = True,
    task_status: trio.TaskStatus[Engine] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until cancelled, a signal, or ``shutdown``; reports its Engine once listening."""
    path = resolve_socket_path(socket_path)
    # Each watcher blocks one thread in watchfiles; the default limit of 40 would cap worktrees.
    trio.to_thread.current_default_thread_limiter().total_tokens = THREADS_FOR_WATCHERS
    async with trio.open_nursery() as nursery:
        engine = Engine(size_cap=size_cap, nursery=nursery, watch=watch)

        async def stop_soon() -> None:
            await trio.sleep(SHUTDOWN_GRACE_S)  # let the shutdown answer reach the client
            nursery.cancel_scope.cancel()

        engine.on_shutdown(lambda: nursery.start_soon(stop_soon))
        nursery.start_soon(_stop_on_signals, nursery.cancel_scope)
        try:
            await nursery.start(lambda task_status: serve(
                engine, path, allow_root=allow_root, listen_fd=systemd_listen_fd(), task_status=task_status
            ))
            task_status.started(engine)
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await engine.aclose()


async def _stop_on_signals(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("stopping on %s", signal.Signals(signum).name)
            scope.cancel()
            return


def run_daemon(socket_path: str | None, *, allow_root: bool = False, size_cap: int | None = None, watch: bool = True) -> None:
    """Blocking entry point of ``snapshotd serve``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s snapshotd[%(process)d] %(levelname)s %(message)s")
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
    trio.run(lambda: serve_daemon(socket_path, allow_root=allow_root, size_cap=size_cap, watch=watch))
