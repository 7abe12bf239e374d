"""The daemon: the engine served on the socket, with clean start-up and shutdown.

Everything runs in one nursery: the socket server, one task group per watched
worktree, and the subscriptions. SIGTERM, SIGINT, SIGHUP and the ``shutdown``
method cancel it; the server then removes its socket under a shield. A crash
leaves only a socket file, which the next start finds dead and replaces.

The signal handlers are installed before the socket listens, so a signal that
arrives as soon as a client could see the daemon always ends it cleanly.

Stopping always finishes: the socket file goes at once, and a daemon whose
work cannot end (a worker thread stuck in a system call that never returns)
exits anyway once the stop deadline passes.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable

import trio

from snapshotd import facilities
from snapshotd.agents.hookserve import serve_hook
from snapshotd.engine.core import Engine
from snapshotd.git.libgit import bound_object_cache
from snapshotd.server.binding import systemd_listen_fd
from snapshotd.server.listener import serve
from snapshotd.settings import (
    check_disabled,
    max_connections as connection_setting,
    resolve_socket_path,
)
from snapshotd.threads import one_malloc_arena

__all__ = ["run_daemon", "serve_daemon"]

log = logging.getLogger("snapshotd")
SHUTDOWN_GRACE_S = 0.05
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_DEADLINE_S = 10.0
GIL_SWITCH_INTERVAL_S = 0.0005
"""How long a thread keeps the interpreter while another waits for it (Python's default: 5 ms).

A worker back from the disk, or the loop woken by a socket, waits for a
thread running Python to hand over the interpreter's lock; at the default a
checkpoint waited up to 5 ms at each of its hand-offs behind any other
session's work."""
EXIT_STUCK = 70  # EX_SOFTWARE: stopped with work still running


def _exit_unless_stopped_within(seconds: float) -> None:
    """Arm a timer that ends the process if stopping takes longer than ``seconds``.

    A thread and ``os._exit`` because the event loop itself waits for the
    stuck work; the socket file is already gone by then and the next start
    clears any temporary files.
    """

    def give_up() -> None:
        log.error("work still running %.0f s after the stop began; exiting without it", seconds)
        logging.shutdown()
        os._exit(EXIT_STUCK)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()


def _single_error(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception a group holds (looking through nested groups), else None."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    return leaves[0] if len(leaves) == 1 else None


async def serve_daemon(
    socket_path: str | None = None,
    *,
    allow_root: bool = False,
    size_cap: int | None = None,
    watch: bool = True,
    max_connections: int | None = None,
    stop_deadline_s: float | None = None,
    task_status: trio.TaskStatus[Engine] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until cancelled, a signal, or ``shutdown``; reports its Engine once listening.

    With ``stop_deadline_s``, a stop by signal or ``shutdown`` that has not
    finished after that many seconds ends the process (see
    :func:`_exit_unless_stopped_within`); only the process's own entry point sets it.

    Errors from start-up (another daemon on the path, an unsafe socket
    folder, a file in the way) are raised as themselves, not wrapped in an
    exception group: :class:`~snapshotd.errors.Busy`, :class:`PermissionError`,
    :class:`FileExistsError` or another :class:`OSError`.
    """
    path = resolve_socket_path(socket_path)
    check_disabled()  # a SNAPSHOTD_DISABLE naming something unknown: one sentence, nothing started
    try:
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            async with trio.open_nursery() as nursery:
                engine = Engine(size_cap=size_cap, nursery=nursery, watch=watch)
                engine.add_method("hook", lambda params, _session: serve_hook(engine.call, params))

                def stop() -> None:
                    if stop_deadline_s is not None:
                        _exit_unless_stopped_within(stop_deadline_s)
                    nursery.cancel_scope.cancel()

                async def stop_soon() -> None:
                    await trio.sleep(SHUTDOWN_GRACE_S)  # let the shutdown answer reach the client
                    log.info("stopping on request")
                    stop()

                engine.on_shutdown(lambda: nursery.start_soon(stop_soon))
                nursery.start_soon(_stop_on_signals, signals, stop)
                try:
                    await nursery.start(
                        lambda task_status: serve(
                            engine,
                            path,
                            allow_root=allow_root,
                            listen_fd=systemd_listen_fd(),
                            max_connections=connection_setting(max_connections),
                            task_status=task_status,
                        )
                    )
                    facilities.log_missing()  # once listening: a start that fails says only why
                    task_status.started(engine)
                    await trio.sleep_forever()
                finally:
                    with trio.CancelScope(shield=True):
                        await engine.aclose()
    except BaseExceptionGroup as group:
        single = _single_error(group)
        if single is None or isinstance(single, trio.Cancelled):
            raise
        raise single from None


async def _stop_on_signals(signals: AsyncIterator[int], stop: Callable[[], None]) -> None:
    async for signum in signals:
        log.info("stopping on %s", signal.Signals(signum).name)
        stop()
        return


def run_daemon(
    socket_path: str | None,
    *,
    allow_root: bool = False,
    size_cap: int | None = None,
    watch: bool = True,
    max_connections: int | None = None,
) -> None:
    """Blocking entry point of ``snapshotd serve``; returns once the daemon has stopped cleanly."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s snapshotd[%(process)d] %(levelname)s %(message)s"
    )
    one_malloc_arena()
    bound_object_cache()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    trio.run(
        lambda: serve_daemon(
            socket_path,
            allow_root=allow_root,
            size_cap=size_cap,
            watch=watch,
            max_connections=max_connections,
            stop_deadline_s=STOP_DEADLINE_S,
        )
    )
