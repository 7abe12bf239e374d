"""The web page's one connection to the daemon: a trio thread holding an :class:`AsyncClient`.

The page is served by an asyncio server (uvicorn) while the daemon's client is
trio's, so the client lives on a thread of its own running ``trio.run``; a
request handler awaits :meth:`Bridge.call`, which waits on a worker thread for
the trio side to answer. Calls are pipelined on the one connection.

The bridge subscribes (with ``checkpoints``) to every worktree the page
shows and hands each notification to the listeners of the asyncio loop.
A lost connection (the daemon restarted) is dialled again on the next call,
and the subscriptions are made again on it; the listeners then hear a
``reconnected`` event so the page reloads what it shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import anyio.to_thread
import trio

from snapshotd.client.rpc import AsyncClient
from snapshotd.errors import InternalError, SnapshotdError

REDIAL_S = 1.0
"""How long the bridge waits between dialling a daemon that went away again."""

Listener = Callable[[dict[str, Any]], None]


class Bridge:
    """Calls and notifications of the daemon at ``socket_path``, for an asyncio loop."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._client: AsyncClient | None = None
        self._dial_lock: trio.Lock | None = None
        self._stop: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._subscribed: set[str] = set()
        self._listeners: list[tuple[asyncio.AbstractEventLoop, Listener]] = []
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name="snapshotd-ui-bridge", daemon=True)

    # --- life ------------------------------------------------------------------

    def start(self) -> None:
        """Start the trio thread and wait until it takes calls."""
        self._thread.start()
        self._ready.wait()

    def close(self) -> None:
        """Close the connection and end the trio thread."""
        if self._token is not None and self._thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop_now, trio_token=self._token)
        self._thread.join(timeout=10)

    def _stop_now(self) -> None:
        assert self._stop is not None
        self._stop.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._dial_lock = trio.Lock()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    # --- calls -----------------------------------------------------------------

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run ``method`` at the daemon (from the asyncio loop); its errors as :class:`SnapshotdError`."""
        clean = {key: value for key, value in (params or {}).items() if value is not None}
        return await anyio.to_thread.run_sync(self._call_blocking, method, clean)

    def _call_blocking(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self._token is not None
        try:
            return trio.from_thread.run(self._call, method, params, trio_token=self._token)
        except trio.RunFinishedError as exc:
            raise InternalError("The page's connection to snapshotd has been closed.") from exc

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        for attempt in (1, 2):
            client = await self._connected()
            try:
                return await client.call(method, params)
            except (OSError, ConnectionError) as exc:
                if self._client is client:
                    self._client = None
                if attempt == 2:
                    raise InternalError(
                        f"Cannot talk to snapshotd at {self.socket_path} ({exc}); is it running? "
                        "Start it with `snapshotd serve`."
                    ) from exc
        raise AssertionError("unreachable")

    async def _connected(self) -> AsyncClient:
        """The live client, dialled (and its subscriptions made again) when there is none."""
        assert self._dial_lock is not None and self._nursery is not None
        async with self._dial_lock:
            if self._client is None:
                ready: trio.Event = trio.Event()
                self._nursery.start_soon(self._hold, ready)
                await ready.wait()
            if self._client is None:
                raise ConnectionRefusedError(f"no daemon answers at {self.socket_path}")
            return self._client

    async def _hold(self, ready: trio.Event) -> None:
        """Keep one connection open, hand its notifications on; when it is lost, dial again soon."""
        held = False
        try:
            async with AsyncClient.connect(self.socket_path) as client:
                again = bool(self._subscribed)
                for worktree in sorted(self._subscribed):
                    with contextlib.suppress(SnapshotdError):
                        await client.call("subscribe", {"worktree": worktree, "checkpoints": True})
                self._client = client
                held = True
                ready.set()
                if again:
                    self._tell({"method": "reconnected", "params": {}})
                async for note in client.notifications():
                    self._tell(note)
        except (OSError, ConnectionError, SnapshotdError):
            pass
        finally:
            self._client = None
            ready.set()
        if held and self._subscribed:
            assert self._nursery is not None
            self._nursery.start_soon(self._redial)

    async def _redial(self) -> None:
        """Dial again every second until the daemon answers, so the page hears of checkpoints again."""
        while self._client is None:
            await trio.sleep(REDIAL_S)
            with contextlib.suppress(OSError, ConnectionError, SnapshotdError):
                await self._connected()

    # --- notifications -----------------------------------------------------------

    async def watch(self, worktree_id: str) -> None:
        """Subscribe to ``worktree_id``'s changes and checkpoints (once per connection)."""
        if worktree_id in self._subscribed:
            return
        await self.call("subscribe", {"worktree": worktree_id, "checkpoints": True})
        self._subscribed.add(worktree_id)

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Hear every notification on the calling asyncio loop; returns the function that stops it."""
        entry = (asyncio.get_running_loop(), listener)
        self._listeners.append(entry)
        return lambda: self._listeners.remove(entry) if entry in self._listeners else None

    def _tell(self, note: dict[str, Any]) -> None:
        for loop, listener in list(self._listeners):
            with contextlib.suppress(RuntimeError):  # a loop that has closed
                loop.call_soon_threadsafe(listener, note)
