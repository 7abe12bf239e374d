"""Starting processes: the only way snapshotd runs another program.

Every child is started with an exact environment (nothing inherited), a given
working directory, its standard streams on fresh pipes and no other descriptor,
an empty signal mask, default signal actions, and its own process group, so a
timeout or a cancellation can kill it together with everything it started.

The start uses the compiled helper ``snapshotd._spawn_native`` (one
``posix_spawn`` call; glibc runs it with ``clone(CLONE_VM | CLONE_VFORK)``, so
its cost does not grow with the daemon's memory). When the helper is missing,
``subprocess.Popen`` starts the child instead (it too uses vfork), which differs
in one way: the child inherits the calling thread's signal mask and ignored
signals (all but SIGPIPE and SIGXFSZ, which subprocess resets). Either way the
waiting is the same: a pidfd tells when the child has exited and
``waitid(P_PIDFD)`` reaps it, so a recycled pid can never be waited on by
mistake, and no thread is spent per child.

Two faces share that machinery: :func:`run` for trio code (pipes read and
written as trio streams, the exit awaited on the pidfd) and :func:`run_sync`
for worker threads and plain code (one ``poll`` loop in the calling thread).
:class:`Session` keeps one child running for many requests (blocking face).
"""

from __future__ import annotations

import math
import os
import select
import time
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from snapshotd.errors import SpawnTimeout
from snapshotd.git.child import (
    CHUNK,
    NATIVE,
    NATIVE_ERROR,
    Child,
    Completed,
    check_timeout,
    launch,
    spawned_total,
)
from snapshotd.git.session import Session

__all__ = [
    "NATIVE",
    "NATIVE_ERROR",
    "Completed",
    "Session",
    "SpawnTimeout",
    "run",
    "run_sync",
    "spawned_total",
]


# --------------------------------------------------------------------------- trio face


async def _feed(stream: trio.lowlevel.FdStream, data: bytes) -> None:
    try:
        if data:
            await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the child stopped reading; like subprocess, that is not an error
    finally:
        stream.close()


async def _drain(stream: trio.lowlevel.FdStream, chunks: list[bytes]) -> None:
    while True:
        data = await stream.receive_some(CHUNK)
        if not data:
            return
        chunks.append(data)


async def run(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    input: bytes | None = None,
    timeout: float | None = None,
) -> Completed:
    """Run ``argv`` in ``cwd`` with exactly ``env`` and return its output.

    ``input`` is written to its stdin (None: stdin is /dev/null). The loop is
    never blocked: pipes are trio streams and the exit is awaited on a pidfd.
    After ``timeout`` seconds the process group is killed and SpawnTimeout
    raised; on cancellation it is killed too and Cancelled propagates. In every
    case the child is reaped and every descriptor closed before returning.
    """
    check_timeout(timeout)
    child = launch(argv, cwd, env, input is not None)
    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []
    streams: list[trio.lowlevel.FdStream] = []
    try:
        stdin_stream = None
        if child.stdin >= 0:
            stdin_stream = trio.lowlevel.FdStream(child.stdin)
            child.stdin = -1
            streams.append(stdin_stream)
        out_stream = trio.lowlevel.FdStream(child.stdout)
        child.stdout = -1
        streams.append(out_stream)
        err_stream = trio.lowlevel.FdStream(child.stderr)
        child.stderr = -1
        streams.append(err_stream)

        with trio.move_on_after(math.inf if timeout is None else timeout) as deadline:
            async with trio.open_nursery() as nursery:
                pending = 3

                async def finish(step: Any, *args: Any) -> None:
                    nonlocal pending
                    await step(*args)
                    pending -= 1
                    if pending == 0:
                        # Exited and both outputs closed: stop feeding an
                        # input nobody will read.
                        nursery.cancel_scope.cancel()

                if stdin_stream is not None:
                    assert input is not None
                    nursery.start_soon(_feed, stdin_stream, input)
                nursery.start_soon(finish, _drain, out_stream, out_chunks)
                nursery.start_soon(finish, _drain, err_stream, err_chunks)
                nursery.start_soon(finish, trio.lowlevel.wait_readable, child.pidfd)
            child.try_reap()
    finally:
        if child.returncode is None:
            child.kill_group()
            with trio.CancelScope(shield=True):
                while not child.try_reap():
                    await trio.lowlevel.wait_readable(child.pidfd)
        for stream in streams:
            stream.close()
        child.close()

    stdout, stderr = b"".join(out_chunks), b"".join(err_chunks)
    if deadline.cancelled_caught:
        assert timeout is not None
        raise SpawnTimeout(child.argv, timeout, pid=child.pid, stdout=stdout, stderr=stderr)
    assert child.returncode is not None
    return Completed(child.argv, child.returncode, stdout, stderr)


# --------------------------------------------------------------------------- blocking face


def _pump(child: Child, data: bytes | None, deadline: float | None) -> tuple[bytes, bytes, bool]:
    """Feed stdin, read both outputs and wait for exit; True when the deadline passed."""
    poller = select.poll()
    chunks: dict[int, list[bytes]] = {child.stdout: [], child.stderr: []}
    for fd in chunks:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    view = memoryview(data or b"")
    sent = 0
    if child.stdin >= 0:
        if view:
            os.set_blocking(child.stdin, False)
            poller.register(child.stdin, select.POLLOUT)
        else:
            child.close_stdin()
    poller.register(child.pidfd, select.POLLIN)

    open_outputs = 2
    exited = False
    timed_out = False
    while open_outputs or not exited:
        wait_ms = None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            wait_ms = math.ceil(left * 1000)
        for fd, _ in poller.poll(wait_ms):
            if fd == child.pidfd:
                exited = True
                poller.unregister(fd)
            elif fd == child.stdin:
                try:
                    sent += os.write(fd, view[sent:])
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    sent = len(view)  # the child stopped reading
                if sent >= len(view):
                    poller.unregister(fd)
                    child.close_stdin()
            else:
                try:
                    got = os.read(fd, CHUNK)
                except BlockingIOError:
                    continue
                if got:
                    chunks[fd].append(got)
                else:
                    poller.unregister(fd)
                    open_outputs -= 1
    return b"".join(chunks[child.stdout]), b"".join(chunks[child.stderr]), timed_out


def run_sync(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    input: bytes | None = None,
    timeout: float | None = None,
) -> Completed:
    """The blocking twin of :func:`run`, for worker threads and plain code.

    Same rules and results; the I/O and the wait for exit happen in one
    ``poll`` loop in the calling thread.
    """
    check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    child = launch(argv, cwd, env, input is not None)
    try:
        stdout, stderr, timed_out = _pump(child, input, deadline)
        if not timed_out:
            child.reap_blocking()  # the pidfd was readable: this does not block
    finally:
        if child.returncode is None:
            child.kill_group()
            child.reap_blocking()
        child.close()
    if timed_out:
        assert timeout is not None
        raise SpawnTimeout(child.argv, timeout, pid=child.pid, stdout=stdout, stderr=stderr)
    assert child.returncode is not None
    return Completed(child.argv, child.returncode, stdout, stderr)
