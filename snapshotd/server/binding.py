"""The listening socket: the socket file bound under its lock, or the one systemd passed.

A socket file is created only in a folder that passes the daemon's rule, next
to a lock file that keeps two daemons from racing for it; a stale socket
nobody answers on is replaced, anything else in the way is refused. Under
socket activation the inherited socket is adopted and its file left alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass

import trio

from snapshotd import facilities
from snapshotd.errors import Busy
from snapshotd.settings import disabled_facilities
from snapshotd.socketfolder import check_socket_folder

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3
_SOMAXCONN = "/proc/sys/net/core/somaxconn"


def listen_backlog() -> int:
    """The longest listen queue the system allows (``net.core.somaxconn``), so a burst of clients waits in it.

    Past it a client's connect fails at once with EAGAIN (and the clients
    retry, see :mod:`snapshotd.client.dialing`); the kernel would cut a larger value down anyway.
    """
    try:
        if "proc" in disabled_facilities():
            raise OSError("no /proc")
        with open(_SOMAXCONN) as handle:
            value = int(handle.read().strip())
    except (OSError, ValueError):
        value = socket.SOMAXCONN
    return value


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
class Bound:
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


async def bind(socket_path: str) -> Bound:
    path = os.path.abspath(socket_path)
    if len(os.fsencode(path)) >= 108:
        raise OSError(errno.ENAMETOOLONG, f"The socket path {path} is too long for a Unix socket.")
    # without SO_PEERCRED no peer is checked: the folder must then be 0700, the guard (docs/security.md)
    check_socket_folder(os.path.dirname(path), create=True, private=not facilities.available("peercred"))
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
        sock.listen(listen_backlog())
    except BaseException:
        sock.close()
        os.close(lock_fd)
        raise
    return Bound(sock, path, (info.st_dev, info.st_ino), lock_fd)


def adopt(listen_fd: int) -> Bound:
    stdlib_sock = socket.socket(fileno=listen_fd)
    if stdlib_sock.family != socket.AF_UNIX or stdlib_sock.type != socket.SOCK_STREAM:
        stdlib_sock.detach()
        raise ValueError(f"The inherited fd {listen_fd} is not a Unix stream socket.")
    if not stdlib_sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        stdlib_sock.listen(listen_backlog())  # keep the backlog systemd chose if it listens already
    return Bound(trio.socket.from_stdlib_socket(stdlib_sock))


