"""The wire format: NDJSON framing and the JSON-RPC 2.0 messages, for both ends.

Nothing here touches a socket or knows a method. :class:`LineBuffer` cuts a
byte stream into lines without holding more than the line limit,
:func:`decode_line` and :func:`encode_message` turn lines into messages and
back, and the builders and parsers make and check requests, responses and
notifications as the server and the clients exchange them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from snapshotd.contract.params import json_type
from snapshotd.errors import (
    InternalError,
    InvalidRequest,
    JsonConstantRefused,
    ParseError,
    SnapshotdError,
)

DEFAULT_LINE_LIMIT = 16 * 1024 * 1024
"""Longest line (without its newline) the daemon accepts, in bytes."""

JSONRPC_VERSION = "2.0"

RequestId = str | int | None

_JSON_WHITESPACE = b" \t\r\n"


# --------------------------------------------------------------------------
# Framing.

class LineBuffer:
    """Cut byte chunks into complete lines, refusing lines over ``limit`` bytes.

    At most ``limit`` bytes of an unfinished line are kept, plus the chunk
    being fed, so a peer that never sends a newline cannot make the reader
    hold more than that.

    When a line is too long, the lines before it are still returned, the rest
    is dropped and :attr:`overflow` holds the :class:`InvalidRequest` to report.
    The stream cannot be resynchronised after that, so the connection should
    end; feeding more raises that error.
    """

    def __init__(self, limit: int = DEFAULT_LINE_LIMIT) -> None:
        if limit < 1:
            raise ValueError("the line limit must be at least one byte")
        self.limit = limit
        self.overflow: InvalidRequest | None = None
        self._buffer = bytearray()

    def __len__(self) -> int:
        """Bytes held of the unfinished line."""
        return len(self._buffer)

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add ``chunk`` and return the lines it completes, without their newlines."""
        if self.overflow is not None:
            raise self.overflow
        buffer = self._buffer
        search_from = len(buffer)  # what is already held has no newline
        buffer += chunk
        lines: list[bytes] = []
        start = 0
        while True:
            end = buffer.find(b"\n", search_from)
            if end < 0:
                break
            if end - start > self.limit:
                return self._refuse(lines)
            lines.append(bytes(buffer[start:end]))
            start = search_from = end + 1
        if start:
            del buffer[:start]
        if len(buffer) > self.limit:
            return self._refuse(lines)
        return lines

    def finish(self) -> bytes | None:
        """Return the unterminated last line at end of stream, if any."""
        if self.overflow is not None or not self._buffer:
            return None
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    def _refuse(self, lines: list[bytes]) -> list[bytes]:
        self._buffer = bytearray()
        self.overflow = InvalidRequest(
            f"The message is longer than the limit of {self.limit} bytes.", limit=self.limit
        )
        return lines


def is_blank(line: bytes) -> bool:
    """True for a line holding only JSON whitespace; such lines are skipped."""
    return not line.strip(_JSON_WHITESPACE)


def encode_message(message: Mapping[str, Any]) -> bytes:
    """Serialise one message as a compact, ASCII-only JSON line.

    ASCII-only keeps the output valid UTF-8 even for strings that hold lone
    surrogates (undecodable file names).
    """
    text = json.dumps(message, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.encode("ascii") + b"\n"


_LOOP_NODES = 2048  # a reply of more values or characters than these is encoded off the loop
_LOOP_CHARS = 64 * 1024
_PIECE = 64 * 1024  # characters of a long string encoded by one call (the C encoder holds the GIL throughout)


def small_enough(message: Any) -> bool:
    """Whether ``message`` is cheap to encode on the loop: few values, few characters (a bounded look)."""
    stack, nodes, chars = [message], 0, 0
    while stack:
        value = stack.pop()
        nodes += 1
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, dict | list):
            if len(value) > _LOOP_NODES:
                return False
            stack.extend(value.values() if isinstance(value, dict) else value)
            chars += sum(len(key) for key in value if isinstance(key, str)) if isinstance(value, dict) else 0
        if nodes > _LOOP_NODES or chars > _LOOP_CHARS:
            return False
    return True


def encode_large(message: Mapping[str, Any]) -> bytes:
    """:func:`encode_message` for a big message, its long strings a piece at a time (for a worker thread).

    One ``json.dumps`` of a 32 MiB patch holds the GIL, and so the loop,
    for a quarter of a second; pieces of 64 Ki characters let it go between
    them. With ASCII-only output each character's escape stands alone, so the
    pieces join to exactly what one call gives.
    """
    marker = f"\0snapshotd-long-{os.urandom(8).hex()}-"
    lifted: list[str] = []

    def lift(value: Any) -> Any:
        if isinstance(value, str) and len(value) > _PIECE:
            lifted.append(value)
            return f"{marker}{len(lifted) - 1}"
        if isinstance(value, dict):
            return {key: lift(item) for key, item in value.items()}
        if isinstance(value, list):
            return [lift(item) for item in value]
        return value

    skeleton = encode_message(lift(message))
    if not lifted:
        return skeleton
    parts = re.split(rb'"\\u0000' + re.escape(marker[1:].encode()) + rb'(\d+)"', skeleton)
    for index in range(1, len(parts), 2):
        text = lifted[int(parts[index])]
        pieces = (json.dumps(text[at : at + _PIECE], ensure_ascii=True)[1:-1] for at in range(0, len(text), _PIECE))
        parts[index] = b'"' + "".join(pieces).encode("ascii") + b'"'
    return b"".join(parts)


def _refuse_constant(name: str) -> Any:
    raise JsonConstantRefused(name)


def decode_line(line: bytes) -> Any:
    """Parse one line as strict UTF-8 JSON; raise :class:`ParseError` if it is not."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(
            f"The message is not valid UTF-8 (bad byte at offset {exc.start})."
        ) from exc
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ParseError(
            f"The message is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})."
        ) from exc
    except JsonConstantRefused as exc:
        raise ParseError(f"The message is not valid JSON ({exc} is not a JSON value).") from exc
    except RecursionError as exc:
        raise ParseError("The message is nested too deeply to parse.") from exc
    except ValueError as exc:  # e.g. an integer with too many digits
        raise ParseError("The message is not valid JSON (a value cannot be read).") from exc


# --------------------------------------------------------------------------
# Messages.


@dataclass(frozen=True, slots=True)
class Request:
    """A well-formed request or, when ``notification`` is true, a notification."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    id: RequestId = None
    notification: bool = False


@dataclass(frozen=True, slots=True)
class Response:
    """A response as a client reads it: ``error`` is set or ``result`` is."""

    id: RequestId
    result: dict[str, Any] | None = None
    error: SnapshotdError | None = None


@dataclass(frozen=True, slots=True)
class Notification:
    """A server-to-client notification (a message with a method and no id)."""

    method: str
    params: dict[str, Any]


def _valid_id(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, str)
        or (isinstance(value, int) and not isinstance(value, bool))
    )


def salvage_id(message: Any) -> RequestId:
    """The message's id if it has a valid one, else None (for error responses)."""
    if isinstance(message, dict):
        value = message.get("id")
        if _valid_id(value):
            return value
    return None


def parse_request(message: Any) -> Request:
    """Check a decoded message is a JSON-RPC 2.0 request; raise :class:`InvalidRequest` if not."""
    if not isinstance(message, dict):
        raise InvalidRequest(
            f"A message must be a JSON object, not {json_type(message)} (batches are not supported)."
        )
    if message.get("jsonrpc") != JSONRPC_VERSION:
        raise InvalidRequest('A message must have "jsonrpc" set to "2.0".')
    notification = "id" not in message
    request_id = message.get("id")
    if not _valid_id(request_id):
        raise InvalidRequest(
            f'The "id" must be a string, an integer or null, not {json_type(request_id)}.'
        )
    method = message.get("method")
    if not isinstance(method, str):
        if "method" not in message:
            raise InvalidRequest('A request must have a "method".')
        raise InvalidRequest(f'The "method" must be a string, not {json_type(method)}.')
    params = message.get("params")
    if params is None:
        params = {}
    elif not isinstance(params, dict):
        raise InvalidRequest(
            f'The "params" must be an object when given, not {json_type(params)}.'
        )
    return Request(method=method, params=params, id=request_id, notification=notification)


def request_message(
    method: str, params: Mapping[str, Any], request_id: RequestId
) -> dict[str, Any]:
    """Build a request (what clients send)."""
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "method": method, "params": dict(params)}


def result_response(request_id: RequestId, result: dict[str, Any]) -> dict[str, Any]:
    """Build a success response."""
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "result": result}


def error_response(request_id: RequestId, error: SnapshotdError) -> dict[str, Any]:
    """Build an error response from one of the project's errors."""
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "error": error.to_dict()}


def notification_message(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Build a notification (no id; the server sends these after ``subscribe``)."""
    return {"jsonrpc": JSONRPC_VERSION, "method": method, "params": dict(params)}


def parse_incoming(line: bytes) -> Response | Notification:
    """Read one line a client received from the daemon.

    Raises :class:`ParseError` for a line that is not JSON and
    :class:`InternalError` for one that is neither a response nor a notification.
    """
    message = decode_line(line)
    if not isinstance(message, dict) or message.get("jsonrpc") != JSONRPC_VERSION:
        raise InternalError("The daemon sent a message that is not JSON-RPC 2.0.")
    if "id" not in message:
        method = message.get("method")
        params = message.get("params")
        if not isinstance(method, str) or not isinstance(params, dict | None):
            raise InternalError("The daemon sent a malformed notification.")
        return Notification(method=method, params=params or {})
    request_id = message["id"]
    if not _valid_id(request_id):
        raise InternalError("The daemon sent a response with an invalid id.")
    if "error" in message:
        error = message["error"]
        if not isinstance(error, dict):
            raise InternalError("The daemon sent a malformed error response.")
        return Response(id=request_id, error=SnapshotdError.from_dict(error))
    result = message.get("result")
    if not isinstance(result, dict):
        raise InternalError("The daemon sent a response whose result is not an object.")
    return Response(id=request_id, result=result)
