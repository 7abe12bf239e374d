"""Who is at the other end of a Unix socket (SO_PEERCRED), and whether the daemon serves them.

Both ends ask: the server refuses peers of another user, and the clients
refuse a listener of another user before sending anything. Nothing here
imports trio, so the blocking client and the command line stay light, nor
:mod:`socket` (the constants are its C module's): an agent hook's connection
(:mod:`snapshotd.client.onecall`) uses this.
"""

from __future__ import annotations

import _socket
import struct

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    import socket

    import trio

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_credentials(sock: socket.socket | _socket.socket | trio.socket.SocketType) -> tuple[int, int, int]:
    """The connected peer's ``(pid, uid, gid)`` from SO_PEERCRED."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def peer_allowed(peer_uid: int, own_uid: int, *, allow_root: bool = False) -> bool:
    """Whether a peer may talk to a daemon run by ``own_uid``: same user, or root if allowed."""
    return peer_uid == own_uid or (allow_root and peer_uid == 0)

