"""The MCP server's stdio streams, told apart from the SDK's so a closed stdin ends the server only once it has answered.

A scripted client (or a pipe) writes its requests and closes stdin at once.
The SDK's loop takes the end of stdin for the end of the connection and
cancels the handlers still running, so those calls got no answer at all.
Here the end of stdin is held back from the loop until every request read
before it is answered (or cancelled by the client), then passed on, and the
server exits as before.
"""

from __future__ import annotations

import contextvars
from collections import Counter
from types import TracebackType
from typing import TYPE_CHECKING, Self

import anyio
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

if TYPE_CHECKING:
    from mcp.shared._stream_protocols import ReadStream, WriteStream

Item = SessionMessage | Exception


class Unanswered:
    """The ids of the requests read and not answered yet, and an event set whenever none is left."""

    def __init__(self) -> None:
        self._ids: Counter[str | int] = Counter()
        self._none_left = anyio.Event()
        self._none_left.set()

    def read(self, request_id: str | int) -> None:
        self._ids[request_id] += 1
        if self._none_left.is_set():
            self._none_left = anyio.Event()

    def answered(self, request_id: str | int | None) -> None:
        if request_id is None or request_id not in self._ids:
            return
        self._ids[request_id] -= 1
        if not self._ids[request_id]:
            del self._ids[request_id]
        if not self._ids:
            self._none_left.set()

    async def none_left(self) -> None:
        await self._none_left.wait()


class DrainingReader:
    """The SDK's read stream, whose end waits until every request read is answered."""

    def __init__(self, inner: ReadStream[Item], unanswered: Unanswered) -> None:
        self._inner = inner
        self._unanswered = unanswered

    @property
    def last_context(self) -> contextvars.Context | None:
        """The sender's context of the last item (the SDK reads it by name)."""
        context: contextvars.Context | None = getattr(self._inner, "last_context", None)
        return context

    async def receive(self) -> Item:
        try:
            item = await self._inner.receive()
        except anyio.EndOfStream:
            await self._unanswered.none_left()
            raise
        if isinstance(item, SessionMessage):
            message = item.message
            if isinstance(message, JSONRPCRequest):
                self._unanswered.read(message.id)
            elif isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
                self._unanswered.answered((message.params or {}).get("requestId"))  # a cancelled call is never answered
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Item:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> None:
        await self.aclose()


class AnsweringWriter:
    """The SDK's write stream, noting each request answered once its answer is handed to stdout's writer."""

    def __init__(self, inner: WriteStream[SessionMessage], unanswered: Unanswered) -> None:
        self._inner = inner
        self._unanswered = unanswered

    async def send(self, item: SessionMessage, /) -> None:
        await self._inner.send(item)
        if isinstance(item.message, JSONRPCResponse | JSONRPCError):
            self._unanswered.answered(item.message.id)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> None:
        await self.aclose()
