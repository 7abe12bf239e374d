"""The page's HTTP face: the Starlette routes, the event stream, and the headers every answer carries.

Routes (all behind :class:`~snapshotd.ui.access.Guard`):

- ``GET /``: the page; ``/assets/...``: its script, styles and Pygments' colours.
- ``GET /api/worktrees``: worktrees with their sessions.
- ``GET /api/timeline?worktree=&session=&offset=&limit=``: a page of entries.
- ``GET /api/files?worktree=&from=&to=&offset=&limit=``: a page of an entry's files.
- ``GET /api/patch?worktree=&from=&to=&path=``: one file's patch, laid out.
- ``POST /api/action``: a restore, revert or undo, previewed or confirmed.
- ``GET /api/events``: server-sent events, ``checkpoint``, ``changed`` and ``reconnected``.

A daemon's error comes back as ``{"error": {"kind", "message"}}`` with a
4xx status (502 when the daemon cannot be reached), and the page shows its
message as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from snapshotd.errors import InternalError, InvalidParams, NotFound, SnapshotdError
from snapshotd.ui import patches
from snapshotd.ui.access import App, Guard, Receive, Scope, Send
from snapshotd.ui.actions import Action, perform
from snapshotd.ui.bridge import Bridge
from snapshotd.ui.timeline import FILES_PAGE, PAGE, Timeline

ASSETS = Path(__file__).resolve().parent / "assets"
_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
_EVENTS_KEPT = 256


def _status(error: SnapshotdError) -> int:
    if isinstance(error, InternalError):
        return 502
    return 404 if isinstance(error, NotFound) else 400


def _error(error: SnapshotdError) -> JSONResponse:
    return JSONResponse({"error": {"kind": error.kind or "invalid_params", "message": error.message}}, _status(error))


def _text(request: Request, name: str, *, required: bool = True) -> str | None:
    value = request.query_params.get(name)
    if required and not value:
        raise InvalidParams(f"The parameter '{name}' is required.")
    return value or None


def _count(request: Request, name: str, default: int, most: int) -> int:
    value = request.query_params.get(name)
    if value is None:
        return default
    if not value.isdigit():
        raise InvalidParams(f"'{name}' must be a whole number.")
    return min(int(value), most)


class Page:
    """The routes over one :class:`Bridge` and its :class:`Timeline`."""

    def __init__(self, bridge: Bridge, focus: str | None = None) -> None:
        self.bridge = bridge
        self.timeline = Timeline(bridge)
        self.focus = focus  # the worktree id `snapshotd ui PATH` named

    def heard(self, note: dict[str, Any]) -> None:
        """A notification from the daemon: a checkpoint to add, or what is kept for its worktree is stale."""
        params = note.get("params") or {}
        if note["method"] == "reconnected":
            self.timeline.forget()
        elif note["method"] == "checkpoint" and isinstance(params.get("checkpoint"), dict):
            self.timeline.recorded(params.get("worktree", ""), params["checkpoint"])
        elif params.get("overflow"):
            self.timeline.forget(params.get("worktree"))

    async def index(self, request: Request) -> Response:
        return FileResponse(ASSETS / "index.html", media_type="text/html; charset=utf-8")

    async def style(self, request: Request) -> Response:
        return Response(patches.style_sheet(), media_type="text/css; charset=utf-8")

    async def worktrees(self, request: Request) -> Response:
        return JSONResponse({"worktrees": await self.timeline.worktrees(), "focus": self.focus})

    async def timeline_page(self, request: Request) -> Response:
        worktree = _text(request, "worktree")
        assert worktree is not None
        page = await self.timeline.page(
            worktree, _text(request, "session", required=False),
            _count(request, "offset", 0, 1 << 40), max(1, _count(request, "limit", PAGE, 500)),
        )
        return JSONResponse(page)

    def _sides(self, request: Request) -> tuple[str, str, str]:
        worktree, source, target = (_text(request, name) for name in ("worktree", "from", "to"))
        assert worktree is not None and source is not None and target is not None
        return worktree, source, target

    async def files(self, request: Request) -> Response:
        worktree, source, target = self._sides(request)
        offset = _count(request, "offset", 0, 1 << 40)
        limit = max(1, _count(request, "limit", FILES_PAGE, 1000))
        return JSONResponse(await self.timeline.files(worktree, source, target, offset, limit))

    async def patch(self, request: Request) -> Response:
        worktree, source, target = self._sides(request)
        path = _text(request, "path")
        listing = await self.timeline.listing(worktree, source, target)
        change = next((c for c in listing if c["path"] == path), None)
        if change is None:
            raise NotFound(f"{path} did not change between those two checkpoints.")
        return JSONResponse(await patches.file_patch(self.bridge, worktree, source, target, change))

    async def action(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            raise InvalidParams("The request is not valid JSON.") from exc
        result = await perform(self.bridge, Action.from_json(body))
        return JSONResponse(result)

    async def events(self, request: Request) -> Response:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(_EVENTS_KEPT)

        def heard(note: dict[str, Any]) -> None:
            if queue.full():
                queue.get_nowait()
                note = {"method": "reconnected", "params": {}}  # fell behind: the page reloads all
            queue.put_nowait(note)

        async def stream() -> AsyncIterator[dict[str, str]]:
            stop = self.bridge.listen(heard)
            try:
                yield {"event": "hello", "data": "{}"}
                while True:
                    note = await queue.get()
                    params = note.get("params") or {}
                    if note["method"] == "changed":
                        params = {"worktree": params.get("worktree"), "overflow": params.get("overflow"),
                                  "paths": len(params.get("paths") or [])}
                    yield {"event": note["method"], "data": json.dumps(params)}
            finally:
                stop()

        return EventSourceResponse(stream(), ping=15)


def _answer_errors(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except SnapshotdError as error:
            return _error(error)

    return run


def _with_headers(app: App) -> App:
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await app(scope, receive, send_with)

    return wrapped


def make_app(bridge: Bridge, token: str, port: int, focus: str | None = None) -> tuple[App, Page]:
    """The whole ASGI app for the server on ``port``, guarded by ``token``; and its :class:`Page`."""
    page = Page(bridge, focus)
    routes = [
        Route("/", page.index),
        Route("/assets/pygments.css", page.style),
        Mount("/assets", StaticFiles(directory=ASSETS), name="assets"),
        Route("/api/worktrees", _answer_errors(page.worktrees)),
        Route("/api/timeline", _answer_errors(page.timeline_page)),
        Route("/api/files", _answer_errors(page.files)),
        Route("/api/patch", _answer_errors(page.patch)),
        Route("/api/action", _answer_errors(page.action), methods=["POST"]),
        Route("/api/events", page.events),
    ]


    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        stop = bridge.listen(page.heard)
        try:
            yield
        finally:
            stop()

    app = Starlette(routes=routes, lifespan=lifespan)
    return _with_headers(Guard(app, token, port)), page
