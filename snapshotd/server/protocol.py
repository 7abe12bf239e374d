"""The wire protocol: NDJSON framing, JSON-RPC 2.0 messages and dispatch.

Nothing here touches a socket. The server moves bytes and this module decides
what they mean: :class:`LineBuffer` cuts a byte stream into lines without
holding more than the line limit, :func:`dispatch` turns one line into one
response line (or none, for a notification) by asking a :class:`Service`, and
the param validators give handlers one-sentence :class:`InvalidParams` errors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from snapshotd.errors import (
    InternalError,
    InvalidParams,
    InvalidRequest,
    ParseError,
    SnapshotdError,
)

log = logging.getLogger(__name__)

DEFAULT_LINE_LIMIT = 16 * 1024 * 1024
"""Longest line (without its newline) the daemon accepts, in bytes."""

PATH_MAX = os.pathconf("/", "PC_PATH_MAX")
"""Longest path the system takes, in bytes with its NUL; longer path params are refused."""

INT_PARAM_MAX = 2**31 - 1
"""Largest integer any param takes unless its validator allows less."""

JSONRPC_VERSION = "2.0"

RequestId = str | int | None

_JSON_WHITESPACE = b" \t\r\n"


# --------------------------------------------------------------------------
# The interface between the server and the code that does the work.


class Session(Protocol):
    """One client connection, as the service sees it."""

    async def notify(
        self, method: str, params: dict[str, Any], fallback: dict[str, Any] | None = None
    ) -> bool:
        """Queue a notification for this client; False once it has gone or fell behind.

        A client too far behind gets the short ``fallback`` params instead
        (when given), and the caller should send it nothing more.
        """
        ...

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the connection ends (at once if it has ended)."""
        ...


class Service(Protocol):
    """What the server calls: method name and params in, result object out."""

    async def call(
        self, method: str, params: dict[str, Any], session: Session | None
    ) -> dict[str, Any]:
        """Run one method; raise a :class:`SnapshotdError` to fail it."""
        ...


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


class _BadConstant(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _BadConstant(name)


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
    except _BadConstant as exc:
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


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


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
            f"A message must be a JSON object, not {_json_type(message)} (batches are not supported)."
        )
    if message.get("jsonrpc") != JSONRPC_VERSION:
        raise InvalidRequest('A message must have "jsonrpc" set to "2.0".')
    notification = "id" not in message
    request_id = message.get("id")
    if not _valid_id(request_id):
        raise InvalidRequest(
            f'The "id" must be a string, an integer or null, not {_json_type(request_id)}.'
        )
    method = message.get("method")
    if not isinstance(method, str):
        if "method" not in message:
            raise InvalidRequest('A request must have a "method".')
        raise InvalidRequest(f'The "method" must be a string, not {_json_type(method)}.')
    params = message.get("params")
    if params is None:
        params = {}
    elif not isinstance(params, dict):
        raise InvalidRequest(
            f'The "params" must be an object when given, not {_json_type(params)}.'
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


# --------------------------------------------------------------------------
# Dispatch.


def log_location() -> str:
    """Where this process's log goes, said for a person: a file, the journal or a terminal.

    The daemon logs to its standard error: a file when the command line
    started it (``snapshotd.log`` beside the socket), the journal under
    systemd (which names the stream in ``JOURNAL_STREAM``), or the terminal of
    ``snapshotd serve``.
    """
    try:
        info = os.fstat(2)
    except OSError:
        return "the daemon's standard error, which is closed"
    if os.environ.get("JOURNAL_STREAM") == f"{info.st_dev}:{info.st_ino}":
        return "the systemd journal (journalctl --user -u snapshotd)"
    if stat.S_ISREG(info.st_mode):
        with contextlib.suppress(OSError):
            return os.readlink("/proc/self/fd/2")
    if os.isatty(2):
        return "the terminal running 'snapshotd serve'"
    return "the daemon's standard error"


def _internal_error(method: str, exc: BaseException) -> InternalError:
    where = log_location()
    return InternalError(
        f"The daemon failed unexpectedly while running {method!r} "
        f"({type(exc).__name__}); its log has the details: {where}.",
        log=where,
    )


async def dispatch_message(
    service: Service, message: Any, session: Session | None
) -> dict[str, Any] | None:
    """Answer one decoded message: the response object, or None for a notification.

    Every exception from the service that is not a :class:`SnapshotdError`
    becomes an :class:`InternalError` and is logged; cancellation passes through.
    """
    try:
        request = parse_request(message)
    except InvalidRequest as err:
        return error_response(salvage_id(message), err)
    try:
        result = await service.call(request.method, request.params, session)
        if not isinstance(result, dict):
            raise TypeError(f"{request.method!r} returned {type(result).__name__}, not a dict")
    except SnapshotdError as err:
        response = error_response(request.id, err)
    except Exception as exc:
        log.exception("method %r failed", request.method)
        response = error_response(request.id, _internal_error(request.method, exc))
    else:
        response = result_response(request.id, result)
    if request.notification:
        if "error" in response:
            log.debug("notification %r failed: %s", request.method, response["error"]["message"])
        return None
    return response


async def dispatch(service: Service, line: bytes, session: Session | None) -> bytes | None:
    """Answer one line: the response line, or None (notification or blank line)."""
    if is_blank(line):
        return None
    try:
        message = decode_line(line)
    except ParseError as err:
        return encode_message(error_response(None, err))
    response = await dispatch_message(service, message, session)
    if response is None:
        return None
    try:
        return encode_message(response)
    except (TypeError, ValueError) as exc:
        method = message.get("method", "?") if isinstance(message, dict) else "?"
        log.error("the result of %r cannot be sent as JSON: %s", method, exc)
        return encode_message(error_response(response["id"], _internal_error(str(method), exc)))


def reject(line: bytes, error: SnapshotdError) -> bytes | None:
    """The response line for a line that will not be run, failing with ``error``.

    A line that is not a valid request gets its own parse or request error;
    a notification or a blank line gets nothing.
    """
    if is_blank(line):
        return None
    try:
        message = decode_line(line)
    except ParseError as err:
        return encode_message(error_response(None, err))
    try:
        request = parse_request(message)
    except InvalidRequest as err:
        return encode_message(error_response(salvage_id(message), err))
    if request.notification:
        return None
    return encode_message(error_response(request.id, error))


# --------------------------------------------------------------------------
# Settings.


def resolve_socket_path(explicit: str | None = None) -> str:
    """The socket path: ``explicit``, then ``$SNAPSHOTD_SOCKET``, then the defaults.

    The defaults are ``$XDG_RUNTIME_DIR/snapshotd/snapshotd.sock`` when that
    variable holds an absolute path, else ``/tmp/snapshotd-<uid>/snapshotd.sock``.
    """
    if explicit:
        return explicit
    from_env = os.environ.get("SNAPSHOTD_SOCKET")
    if from_env:
        return from_env
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "snapshotd", "snapshotd.sock")
    return f"/tmp/snapshotd-{os.getuid()}/snapshotd.sock"


# --------------------------------------------------------------------------
# Param validators for handlers. ``None`` counts as absent for optional params.


def _wrong_type(name: str, expected: str, value: Any) -> InvalidParams:
    return InvalidParams(
        f"The parameter {name!r} must be {expected}, not {_json_type(value)}.", param=name
    )


def check_text(name: str, value: str) -> str:
    """``value`` if it can name a file and be stored: no NUL, no lone surrogate outside file-name escapes.

    Strings the daemon sends back for undecodable file names (``\\udc80`` to
    ``\\udcff``, as ``os.fsdecode`` makes them) are accepted.
    """
    if "\0" in value:
        raise InvalidParams(f"The parameter {name!r} must not contain a NUL character.", param=name)
    try:
        os.fsencode(value)
    except UnicodeEncodeError as exc:
        raise InvalidParams(
            f"The parameter {name!r} holds a lone surrogate (U+{ord(value[exc.start]):04X}) "
            "that is not text; send it as valid UTF-8.",
            param=name,
        ) from None
    return value


def _path_text(name: str, value: str) -> str:
    size = len(check_text(name, value).encode("utf-8", "surrogateescape"))
    if size >= PATH_MAX:
        raise InvalidParams(
            f"The parameter {name!r} is a path of {size} bytes, over the system's limit of "
            f"{PATH_MAX - 1}.",
            param=name,
        )
    return value


def require_str(params: Mapping[str, Any], name: str) -> str:
    """The string param ``name``; raise :class:`InvalidParams` if missing or not a string."""
    value = params.get(name)
    if value is None:
        raise InvalidParams(f"The parameter {name!r} is required and must be a string.", param=name)
    if not isinstance(value, str):
        raise _wrong_type(name, "a string", value)
    return check_text(name, value)


def optional_str(params: Mapping[str, Any], name: str, default: str | None = None) -> str | None:
    """The string param ``name``, or ``default`` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _wrong_type(name, "a string", value)
    return check_text(name, value)


def optional_path(params: Mapping[str, Any], name: str) -> str | None:
    """The path param ``name`` (a string shorter than PATH_MAX), or None when absent."""
    value = optional_str(params, name)
    return None if value is None else _path_text(name, value)


def optional_int(
    params: Mapping[str, Any],
    name: str,
    default: int | None = None,
    *,
    min: int | None = None,
    max: int = INT_PARAM_MAX,
) -> int | None:
    """The integer param ``name`` within ``min``..``max``, or ``default`` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _wrong_type(name, "an integer", value)
    if min is not None and value < min:
        raise InvalidParams(
            f"The parameter {name!r} must be at least {min}, not {value}.", param=name
        )
    if value > max:
        raise InvalidParams(
            f"The parameter {name!r} must be at most {max}, not {value}.", param=name
        )
    return value


def optional_bool(params: Mapping[str, Any], name: str, default: bool = False) -> bool:
    """The boolean param ``name``, or ``default`` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _wrong_type(name, "a boolean", value)
    return value


def optional_str_list(
    params: Mapping[str, Any], name: str, default: list[str] | None = None
) -> list[str] | None:
    """The list-of-strings param ``name``, or ``default`` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        if isinstance(value, list):
            raise InvalidParams(
                f"The parameter {name!r} must be an array of strings, and one item is not a string.",
                param=name,
            )
        raise _wrong_type(name, "an array of strings", value)
    return [check_text(name, item) for item in value]


def optional_path_list(params: Mapping[str, Any], name: str) -> list[str] | None:
    """The list-of-paths param ``name`` (each shorter than PATH_MAX), or None when absent."""
    value = optional_str_list(params, name)
    return None if value is None else [_path_text(name, item) for item in value]

