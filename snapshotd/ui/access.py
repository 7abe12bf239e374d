"""Who may use the page: the token, the loopback-only Host and Origin, and the token file.

The server listens on 127.0.0.1 only, but any local process, and any web
page the user visits, can reach a loopback port. So every request must carry
the random token (``?token=`` on the first visit, which sets a cookie and
redirects to the bare URL; the cookie, ``HttpOnly`` and ``SameSite=Strict``,
after that), name this server in ``Host`` (a DNS-rebound name does not), and,
when it has an ``Origin``, come from this server's own origin. A change (any
method but GET and HEAD) must also send JSON, which a foreign page cannot do
without a preflight that this server never answers.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from snapshotd.fsutil import check_private_home, open_private_folder, write_all

COOKIE = "snapshotd_ui"
TOKEN_FOLDER = "ui"
"""Under snapshotd's home: one file per running page, ``<pid>.json`` (mode 0600)."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def new_token() -> str:
    """A random token of 32 bytes, URL-safe."""
    return secrets.token_urlsafe(32)


class Guard:
    """ASGI middleware that refuses any request without the token or from a foreign Host or Origin."""

    def __init__(self, app: App, token: str, port: int) -> None:
        self.app = app
        self.token = token
        self.hosts = {f"127.0.0.1:{port}", f"localhost:{port}"}
        self.origins = {f"http://{host}" for host in self.hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _plain(send, 403, refusal)
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if "token" in query and scope.get("method") == "GET":
            # The first visit: keep the token in a cookie and drop it from the address bar.
            rest = urlencode({k: v for k, v in query.items() if k != "token"})
            location = scope["path"] + (f"?{rest}" if rest else "")
            cookie = f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
            await send({
                "type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode()),
                            (b"cache-control", b"no-store")],
            })
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> str | None:
        """Why the request is refused (one sentence), or None to let it through."""
        if headers.get("host") not in self.hosts:
            return "Refused: this page answers only to 127.0.0.1 or localhost with its own port."
        origin = headers.get("origin")
        if origin is not None and origin not in self.origins:
            return f"Refused: requests from {origin} may not use this page."
        if not self._has_token(scope, headers):
            return "Refused: open the address `snapshotd ui` printed, with its token."
        if scope.get("method", "GET") not in ("GET", "HEAD"):
            if not headers.get("content-type", "").startswith("application/json"):
                return "Refused: a change must be sent as JSON by the page itself."
            if origin is None and "sec-fetch-site" in headers and headers["sec-fetch-site"] != "same-origin":
                return "Refused: a change must come from the page itself."
        return None

    def _has_token(self, scope: Scope, headers: dict[str, str]) -> bool:
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        cookie = SimpleCookie()
        with contextlib.suppress(Exception):
            cookie.load(headers.get("cookie", ""))
        given = [query.get("token"), cookie[COOKIE].value if COOKIE in cookie else None]
        return any(value is not None and hmac.compare_digest(value, self.token) for value in given)


async def _plain(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})


def write_token_file(home: Path, url: str, port: int, token: str) -> Path:
    """Write ``{"url", "port", "pid", "token"}`` to ``<home>/ui/<pid>.json``, mode 0600, only this user's.

    The home passes :func:`check_private_home`, the folder is made 0700 and
    opened without following links, and the file is created anew (a stale one
    of a dead process with this pid is replaced), never through a link.
    """
    check_private_home(home, create=True)
    folder = home / TOKEN_FOLDER
    fd = open_private_folder(folder, own_levels=1)
    name = f"{os.getpid()}.json"
    data = json.dumps({"url": url, "port": port, "pid": os.getpid(), "token": token}).encode()
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            write_all(out, data)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return folder / name


def remove_token_file(path: Path) -> None:
    """Remove the token file at exit (nothing if it is gone already)."""
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
