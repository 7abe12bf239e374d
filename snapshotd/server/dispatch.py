"""Dispatch: one request line in, one response line out, by asking a :class:`Service`.

The server moves bytes and this module decides what they mean. It holds the
interface between the server and the code that does the work (:class:`Service`,
:class:`Session`), and the one mapping of an unexpected failure to an
``internal error`` that says where the daemon's log is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import trio

from snapshotd.contract.framing import (
    decode_line,
    encode_large,
    encode_message,
    error_response,
    is_blank,
    parse_request,
    result_response,
    salvage_id,
    small_enough,
)
from snapshotd.errors import InternalError, InvalidRequest, ParseError, SnapshotdError
from snapshotd.facilities import log_location
from snapshotd.threads import thread_limiter

log = logging.getLogger(__name__)


class Session(Protocol):
    """One client connection, as the service sees it."""

    async def notify(
        self,
        method: str,
        params: dict[str, Any],
        fallback: dict[str, Any] | None = None,
        fallback_method: str | None = None,
    ) -> bool:
        """Queue a notification for this client; False once it has gone or fell behind.

        A client too far behind gets the short ``fallback`` params instead
        (when given, as ``fallback_method``), and the caller should send it nothing more.
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
# Dispatch.


def internal_error(method: str, exc: BaseException) -> InternalError:
    """The one-sentence ``internal error`` for an unexpected failure of ``method``, naming the log."""
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
        response = error_response(request.id, internal_error(request.method, exc))
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
        if small_enough(response):
            return encode_message(response)
        # A patch of megabytes or 20,000 files: encoded on a worker thread, its long strings in pieces.
        return await trio.to_thread.run_sync(encode_large, response, limiter=thread_limiter)
    except (TypeError, ValueError) as exc:
        method = message.get("method", "?") if isinstance(message, dict) else "?"
        log.error("the result of %r cannot be sent as JSON: %s", method, exc)
        return encode_message(error_response(response["id"], internal_error(str(method), exc)))


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
