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

import contextlib
import errno
import fcntl
import math
import os
import select
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

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

try:
    from snapshotd._spawn_native import ffi as _ffi, lib as _lib
except (ImportError, OSError) as _exc:  # not built, or built for another libc
    _ffi = None
    _lib = None
    NATIVE_ERROR: str | None = f"{type(_exc).__name__}: {_exc}"
else:
    NATIVE_ERROR = None

#: True when the compiled helper starts the processes.
NATIVE: bool = _lib is not None

# Pipes hold 64 KiB by default; reading more at once only costs a larger
# temporary buffer.
_CHUNK = 65536


@dataclass(frozen=True)
class Completed:
    """A process that ran to its end: its argv, exit status and output.

    ``returncode`` is negative (minus the signal number) when a signal killed it.
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes


class SpawnTimeout(Exception):
    """The process did not finish in time; its whole process group was killed.

    ``stdout`` and ``stderr`` hold what it had written before that.
    """

    def __init__(
        self,
        argv: tuple[str, ...],
        timeout: float,
        *,
        pid: int,
        stdout: bytes = b"",
        stderr: bytes = b"",
    ) -> None:
        super().__init__(
            f"{shlex.join(argv)} did not finish within {timeout:g} s; its process group was killed"
        )
        self.argv = argv
        self.timeout = timeout
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr


# --------------------------------------------------------------------------- counting

_count_lock = threading.Lock()
_spawned = 0


def _count_one() -> None:
    global _spawned
    with _count_lock:
        _spawned += 1


def spawned_total() -> int:
    """How many processes this process has started so far, through either face."""
    with _count_lock:
        return _spawned


# --------------------------------------------------------------------------- argv, env, PATH

# (name, PATH) -> absolute path of the program; filled on first use, and an
# entry is dropped when the program it names has gone.
_resolved: dict[tuple[str, str], str] = {}


def _search_path(env: Mapping[str, str]) -> str:
    found = env.get("PATH")
    if found is None:
        found = os.environ.get("PATH", os.defpath)
    return found


def _resolve(name: str, search: str) -> str:
    """Find ``name`` on ``search`` the way ``shutil.which`` does (cached)."""
    if "/" in name:
        return name
    key = (name, search)
    hit = _resolved.get(key)
    if hit is not None:
        return hit
    for folder in search.split(os.pathsep):
        if not folder:
            continue  # an empty entry would mean the child's cwd; never search it
        candidate = os.path.abspath(os.path.join(folder, name))
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            _resolved[key] = candidate
            return candidate
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


def _encode(value: str | os.PathLike[str], what: str) -> bytes:
    raw = os.fsencode(value)
    if b"\0" in raw:
        raise ValueError(f"embedded null byte in {what}: {value!r}")
    return raw


def _env_block(env: Mapping[str, str]) -> list[bytes]:
    block = []
    for name, value in env.items():
        raw_name = _encode(name, "environment variable name")
        if not raw_name or b"=" in raw_name:
            raise ValueError(f"illegal environment variable name: {name!r}")
        block.append(raw_name + b"=" + _encode(value, f"environment variable {name}"))
    return block


# --------------------------------------------------------------------------- starting


def _start_error(err: int, path: str, cwd: str) -> OSError:
    """The OSError for an errno from the helper, naming cwd when it was the cause."""
    culprit = path
    if err in (errno.ENOENT, errno.ENOTDIR, errno.EACCES) and not os.path.isdir(cwd):
        culprit = cwd
    return OSError(err, os.strerror(err), culprit)


def _start_native(
    path: str, argv: list[bytes], env: list[bytes], cwd: str, fds: tuple[int, int, int]
) -> int:
    ffi, lib = _ffi, _lib
    assert ffi is not None and lib is not None
    # ffi.new owns each string; the lists keep them alive through the call.
    c_args = [ffi.new("char[]", arg) for arg in argv]
    c_env = [ffi.new("char[]", item) for item in env]
    pid = ffi.new("int *")
    err = lib.snapshotd_spawn(
        os.fsencode(path),
        ffi.new("char *[]", [*c_args, ffi.NULL]),
        ffi.new("char *[]", [*c_env, ffi.NULL]),
        os.fsencode(cwd),
        fds[0],
        fds[1],
        fds[2],
        pid,
    )
    if err:
        raise _start_error(err, path, cwd)
    return int(pid[0])


def _start_fallback(
    path: str, argv: list[bytes], env: list[bytes], cwd: str, fds: tuple[int, int, int]
) -> tuple[int, subprocess.Popen[bytes]]:
    environ = dict(item.split(b"=", 1) for item in env)
    popen = subprocess.Popen(
        argv,
        executable=path,
        cwd=cwd,
        env=environ,
        stdin=fds[0],
        stdout=fds[1],
        stderr=fds[2],
        close_fds=True,
        process_group=0,
    )
    return popen.pid, popen


def _start(
    name: str, argv: list[bytes], env: Mapping[str, str], cwd: str, fds: tuple[int, int, int]
) -> tuple[int, subprocess.Popen[bytes] | None]:
    """Start the program; returns its pid and, on the fallback, its Popen."""
    env_block = _env_block(env)
    search = _search_path(env)
    for attempt in (1, 2):
        path = _resolve(name, search)
        try:
            if _lib is not None:
                return _start_native(path, argv, env_block, cwd, fds), None
            return _start_fallback(path, argv, env_block, cwd, fds)
        except FileNotFoundError as exc:
            # A cached program that has gone (an upgrade moved it): look again once.
            if attempt == 2 or path == name or exc.filename != path:
                raise
            _resolved.pop((name, search), None)
    raise AssertionError("unreachable")


def _above_stdio(fd: int) -> int:
    """``fd`` moved to 3 or above, so the child's dup2 onto 0-2 cannot clobber it."""
    if fd >= 3:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def _close(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


class _Child:
    """A started child: its pid, pidfd and the parent's ends of its pipes."""

    def __init__(
        self,
        argv: tuple[str, ...],
        pid: int,
        pidfd: int,
        stdin: int,
        stdout: int,
        stderr: int,
        popen: subprocess.Popen[bytes] | None,
    ) -> None:
        self.argv = argv
        self.pid = pid
        self.pidfd = pidfd
        self.stdin = stdin  # -1 when stdin is /dev/null
        self.stdout = stdout
        self.stderr = stderr
        self.popen = popen
        self.returncode: int | None = None

    def _reaped(self, info: os.waitid_result) -> None:
        if info.si_code == os.CLD_EXITED:
            self.returncode = info.si_status
        else:  # CLD_KILLED or CLD_DUMPED
            self.returncode = -info.si_status
        if self.popen is not None:
            # Popen must never wait on this pid itself: it has been reaped and
            # the number may already belong to another child.
            self.popen.returncode = self.returncode

    def try_reap(self) -> bool:
        """Reap the child if it has exited; True once its status is known."""
        if self.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            # Reaped by someone else (SIGCHLD set to SIG_IGN); like subprocess, say 0.
            self._set_unknown()
            return True
        if info is None:
            return False
        self._reaped(info)
        return True

    def reap_blocking(self) -> None:
        """Wait for the child to exit and reap it (blocks the calling thread)."""
        if self.returncode is not None:
            return
        try:
            info = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED)
        except ChildProcessError:
            self._set_unknown()
            return
        assert info is not None
        self._reaped(info)

    def _set_unknown(self) -> None:
        self.returncode = 0
        if self.popen is not None:
            self.popen.returncode = 0

    def kill_group(self) -> None:
        """SIGKILL the child's process group; safe because the child is not reaped yet.

        The child itself is also signalled through its pidfd, so it dies even if
        it has left its process group.
        """
        if self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close_stdin(self) -> None:
        fd, self.stdin = self.stdin, -1
        _close(fd)

    def close(self) -> None:
        """Close every descriptor the parent still holds for this child."""
        fds = (self.stdin, self.stdout, self.stderr, self.pidfd)
        self.stdin = self.stdout = self.stderr = self.pidfd = -1
        for fd in fds:
            _close(fd)


def _launch(argv: Sequence[str], cwd: str, env: Mapping[str, str], piped_input: bool) -> _Child:
    """Start one child on fresh pipes and open its pidfd."""
    names = tuple(os.fsdecode(arg) for arg in argv)
    if not names:
        raise ValueError("argv must not be empty")
    raw_argv = [_encode(arg, "argv") for arg in argv]
    cwd = os.fsdecode(cwd)
    _encode(cwd, "cwd")

    in_r = in_w = out_r = out_w = err_r = err_w = pidfd = -1
    try:
        try:
            if piped_input:
                in_r, in_w = os.pipe2(os.O_CLOEXEC)
            else:
                in_r = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            in_r = _above_stdio(in_r)
            out_w = _above_stdio(out_w)
            err_w = _above_stdio(err_w)
            pid, popen = _start(names[0], raw_argv, env, cwd, (in_r, out_w, err_w))
            _count_one()
            try:
                pidfd = os.pidfd_open(pid)
            except BaseException:
                _abandon(pid, popen)
                raise
        finally:
            for fd in (in_r, out_w, err_w):
                _close(fd)
    except BaseException:
        for fd in (in_w, out_r, err_r, pidfd):
            _close(fd)
        raise
    return _Child(names, pid, pidfd, in_w, out_r, err_r, popen)


def _abandon(pid: int, popen: subprocess.Popen[bytes] | None) -> None:
    """Kill and reap a child whose pidfd could not be opened."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    try:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
    except ChildProcessError:
        code = 0
    if popen is not None:
        popen.returncode = code


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and (math.isnan(timeout) or timeout < 0):
        raise ValueError(f"timeout must be a non-negative number of seconds, not {timeout!r}")


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
        data = await stream.receive_some(_CHUNK)
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
    _check_timeout(timeout)
    child = _launch(argv, cwd, env, input is not None)
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


def _pump(child: _Child, data: bytes | None, deadline: float | None) -> tuple[bytes, bytes, bool]:
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
                    got = os.read(fd, _CHUNK)
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
    _check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    child = _launch(argv, cwd, env, input is not None)
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


# --------------------------------------------------------------------------- long-lived children


class _Expired(Exception):
    """A session step passed its deadline."""


class Session:
    """A child kept running to answer requests on its standard streams (blocking face).

    For request/response programs such as ``git cat-file --batch-command``: the
    caller writes a request with :meth:`send` and reads the answer with
    :meth:`read_line` and :meth:`read_exact`. Both outputs are drained while
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
        _check_timeout(timeout)
        self.timeout = timeout
        self._child = _launch(argv, cwd, env, True)
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
            got = os.read(fd, _CHUNK)
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
        deadline = self._deadline()
        try:
            while True:
                end = self._out.find(b"\n")
                if end >= 0:
                    line = bytes(self._out[: end + 1])
                    del self._out[: end + 1]
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
