"""Long-lived children: one process answering many requests on its standard streams."""

from __future__ import annotations

import errno
import math
import os
import select
import time
from collections.abc import Mapping, Sequence

from snapshotd.errors import SpawnTimeout
from snapshotd.git.child import CHUNK, check_timeout, launch


class _Expired(Exception):
    """A session step passed its deadline."""


class Session:
    """A child kept running to answer requests on its standard streams (blocking face).

    For request/response programs such as ``git cat-file --batch-command``: the
    caller writes a request with :meth:`send` and reads the answer with
    :meth:`read_line` (or :meth:`read_until`) and :meth:`read_exact`. Both outputs are drained while
    writing or waiting, so the child can never block on a full pipe; its
    standard error is kept (the last 64 KiB) for error messages. Each call
    waits at most ``timeout`` seconds, then the process group is killed and
    SpawnTimeout raised. :meth:`close` ends the child (end of input, then a
    kill if it does not exit) and reaps it. Not thread-safe: callers serialise.
    """

    _ERR_KEEP = 65536

    def __init__(
        self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], timeout: float | None = None
    ) -> None:
        check_timeout(timeout)
        self.timeout = timeout
        self._child = launch(argv, cwd, env, True)
        for fd in (self._child.stdin, self._child.stdout, self._child.stderr):
            os.set_blocking(fd, False)
        self._out = bytearray()
        self._err = bytearray()
        self._out_open = True
        self._err_open = True

    @property
    def argv(self) -> tuple[str, ...]:
        return self._child.argv

    @property
    def stderr(self) -> bytes:
        """What the child wrote to its standard error so far (the last 64 KiB)."""
        return bytes(self._err)

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    @property
    def closed(self) -> bool:
        return self._child.pidfd < 0

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def _step(self, want_write: bool, deadline: float | None, *, pidfd: bool = False) -> bool:
        """Wait for one round of I/O, draining both outputs; True when stdin can take more.

        With ``pidfd``, also wake when the child exits. Raises _Expired past ``deadline``.
        """
        child = self._child
        poller = select.poll()
        if self._out_open:
            poller.register(child.stdout, select.POLLIN)
        if self._err_open:
            poller.register(child.stderr, select.POLLIN)
        if want_write and child.stdin >= 0:
            poller.register(child.stdin, select.POLLOUT)
        if pidfd:
            poller.register(child.pidfd, select.POLLIN)
        wait_ms = None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Expired
            wait_ms = math.ceil(left * 1000)
        writable = False
        for fd, _ in poller.poll(wait_ms):
            if fd == child.stdin:
                writable = True
            elif fd in (child.stdout, child.stderr):
                self._take(fd)
        return writable

    def _take(self, fd: int) -> None:
        try:
            got = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        if fd == self._child.stdout:
            if got:
                self._out += got
            else:
                self._out_open = False
        elif got:
            self._err += got
            del self._err[: max(0, len(self._err) - self._ERR_KEEP)]
        else:
            self._err_open = False

    def _timed_out(self) -> SpawnTimeout:
        stdout, stderr, pid = bytes(self._out), bytes(self._err), self._child.pid
        self.close(wait=0)
        assert self.timeout is not None
        return SpawnTimeout(self._child.argv, self.timeout, pid=pid, stdout=stdout, stderr=stderr)

    def send(self, data: bytes) -> None:
        """Write all of ``data`` to the child's stdin; BrokenPipeError if it stopped reading."""
        view = memoryview(data)
        deadline = self._deadline()
        try:
            while view:
                if self._child.stdin < 0:
                    raise BrokenPipeError(errno.EPIPE, "the child's input is closed")
                if not self._step(True, deadline):
                    continue
                try:
                    view = view[os.write(self._child.stdin, view) :]
                except BlockingIOError:
                    continue
        except _Expired:
            raise self._timed_out() from None

    def read_line(self) -> bytes:
        """The next line of output with its newline; what is left (maybe b"") at end of output."""
        return self.read_until(b"\n")

    def read_until(self, separator: bytes) -> bytes:
        """The output up to and with the next ``separator``; what is left (maybe b"") at end of output."""
        deadline = self._deadline()
        try:
            while True:
                end = self._out.find(separator)
                if end >= 0:
                    line = bytes(self._out[: end + len(separator)])
                    del self._out[: end + len(separator)]
                    return line
                if not self._out_open:
                    line = bytes(self._out)
                    self._out.clear()
                    return line
                self._step(False, deadline)
        except _Expired:
            raise self._timed_out() from None

    def read_exact(self, size: int) -> bytes:
        """Exactly ``size`` bytes of output; EOFError if the output ends first."""
        deadline = self._deadline()
        try:
            while len(self._out) < size:
                if not self._out_open:
                    raise EOFError(f"{self._child.argv[0]} ended its output early")
                self._step(False, deadline)
        except _Expired:
            raise self._timed_out() from None
        data = bytes(self._out[:size])
        del self._out[:size]
        return data

    def close(self, wait: float = 5.0) -> int:
        """End the child: close its input, give it ``wait`` seconds to exit, then kill it; reap.

        Returns its exit status (negative: killed by that signal).
        """
        child = self._child
        if child.pidfd < 0:
            return child.returncode if child.returncode is not None else 0
        child.close_stdin()
        deadline = time.monotonic() + wait
        try:
            while not child.try_reap():
                self._step(False, deadline, pidfd=True)
        except _Expired:
            pass
        finally:
            if child.returncode is None:
                child.kill_group()
                child.reap_blocking()
            child.close()
        assert child.returncode is not None
        return child.returncode
