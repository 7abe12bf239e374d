"""Starting one child: the compiled helper or its fallback, fresh pipes, a pidfd.

This is the machinery under both faces of :mod:`snapshotd.git.spawn`: the
child gets an exact environment, the given working directory, its standard
streams on fresh pipes (moved above 0-2 first), its own process group, and is
known by a pidfd so a recycled pid is never waited on. ``_lib`` is the compiled
``posix_spawn`` helper, or None when it is missing and ``subprocess.Popen``
starts the child instead. Every start is counted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
CHUNK = 65536


@dataclass(frozen=True)
class Completed:
    """A process that ran to its end: its argv, exit status and output.

    ``returncode`` is negative (minus the signal number) when a signal killed it.
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes


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


class Child:
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


def launch(argv: Sequence[str], cwd: str, env: Mapping[str, str], piped_input: bool) -> Child:
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
    return Child(names, pid, pidfd, in_w, out_r, err_r, popen)


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


def check_timeout(timeout: float | None) -> None:
    if timeout is not None and (math.isnan(timeout) or timeout < 0):
        raise ValueError(f"timeout must be a non-negative number of seconds, not {timeout!r}")
