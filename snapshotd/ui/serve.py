"""Running the page: a loopback socket on a random port, uvicorn on it, the bridge to the daemon.

The socket is bound here, on 127.0.0.1 and port 0, before uvicorn starts,
so the address (and its token) is known and printed before the first request
and nothing ever listens beyond loopback. The token file is written once the
port is known and removed when the server stops, on SIGTERM as on Ctrl-C
(uvicorn raises the signal again once it has shut down, which would end the
process before that).
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from snapshotd.settings import data_home
from snapshotd.ui.access import new_token, remove_token_file, write_token_file
from snapshotd.ui.app import make_app
from snapshotd.ui.bridge import Bridge

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Address:
    """Where the page is: its URL with the token, and the token file that holds it."""

    url: str
    port: int
    token: str
    token_file: Path


def bind_loopback(port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 (``port`` 0: one the kernel picks)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _stop_cleanly(signum: int, _frame: object) -> None:
    """SIGTERM raised again after uvicorn's shutdown: leave through ``run``'s cleanup, as Ctrl-C does."""
    raise SystemExit(0)


def run(socket_path: str, focus: str | None, announce: Callable[[Address], None], port: int = 0) -> None:
    """Serve the page until interrupted; ``announce`` hears the address once it listens."""
    sock = bind_loopback(port)
    port = sock.getsockname()[1]
    token = new_token()
    url = f"http://{HOST}:{port}/?token={token}"
    bridge = Bridge(socket_path)
    bridge.start()
    token_file = write_token_file(data_home(), url, port, token)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_cleanly)
    try:
        app, _page = make_app(bridge, token, port, focus)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=2)
        server = uvicorn.Server(config)
        announce(Address(url, port, token, token_file))
        server.run(sockets=[sock])
    finally:
        remove_token_file(token_file)
        bridge.close()
        sock.close()
