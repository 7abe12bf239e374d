"""Who is at the other end of a Unix socket (SO_PEERCRED), and whether the daemon serves them.

Both ends ask: the server refuses peers of another user, and the clients
refuse a listener of another user before sending anything. Nothing here
imports trio, so the blocking client and the command line stay light, nor
:mod:`socket` (the constants are its C module's): an agent hook's connection
(:mod:`snapshotd.client.onecall`) uses this.

Where the peer's credentials cannot be had (no ``SO_PEERCRED``: macOS, the
BSDs; a sandbox refusing it; ``SNAPSHOTD_DISABLE=peercred``, which each caller
passes as ``switched_off``), :func:`peer_credentials` says None and the peer
is not checked: the socket folder's owner and mode
(:func:`~snapshotd.socketfolder.check_socket_folder`: 0700 for a daemon
without them), checked by the daemon before it listens and by each client
before it connects, are what keep other users out (docs/security.md).
"""

from __future__ import annotations

import _socket
import errno
import struct

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    import socket

    import trio

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


_ABSENT = frozenset({errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.ENOSYS, errno.EPERM, errno.EINVAL})


def peer_credentials(
    sock: socket.socket | _socket.socket | trio.socket.SocketType, *, switched_off: bool = False
) -> tuple[int, int, int] | None:
    """The connected peer's ``(pid, uid, gid)`` from SO_PEERCRED; None where it cannot be had (see above)."""
    option = getattr(_socket, "SO_PEERCRED", None)
    if option is None or switched_off:
        return None
    try:
        raw = sock.getsockopt(_socket.SOL_SOCKET, option, _UCRED.size)
    except OSError as exc:
        if exc.errno in _ABSENT:
            return None
        raise
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def peer_allowed(peer_uid: int, own_uid: int, *, allow_root: bool = False) -> bool:
    """Whether a peer may talk to a daemon run by ``own_uid``: same user, or root if allowed."""
    return peer_uid == own_uid or (allow_root and peer_uid == 0)

