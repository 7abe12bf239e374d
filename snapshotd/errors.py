"""Every error snapshotd reports, one class per wire kind.

Each error carries the JSON-RPC ``code``, the application ``kind`` (for code
-32000) and a one-sentence ``message`` for a person, and converts to and from
the wire form. Library errors (pygit2, OSError, the spawn helper) are mapped to
these at the call site with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any, ClassVar

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
APPLICATION_ERROR = -32000


class SnapshotdError(Exception):
    """Base of every error that reaches a client.

    ``kind`` is None for the JSON-RPC protocol errors and one of the contract's
    application kinds otherwise.
    """

    code: ClassVar[int] = APPLICATION_ERROR
    kind: ClassVar[str | None] = None

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.data)
        if self.kind is not None:
            data["kind"] = self.kind
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if data:
            error["data"] = data
        return error

    @staticmethod
    def from_dict(error: dict[str, Any]) -> SnapshotdError:
        """Rebuild the error a server sent, as the matching class."""
        data = dict(error.get("data") or {})
        kind = data.pop("kind", None)
        code = error.get("code", INTERNAL_ERROR)
        message = str(error.get("message", "unknown error"))
        cls = ERRORS_BY_KIND.get(kind) if kind else ERRORS_BY_CODE.get(code)
        if cls is None:
            cls = InternalError
        return cls(message, **data)


class ParseError(SnapshotdError):
    code = PARSE_ERROR


class InvalidRequest(SnapshotdError):
    code = INVALID_REQUEST


class MethodNotFound(SnapshotdError):
    code = METHOD_NOT_FOUND


class InvalidParams(SnapshotdError):
    code = INVALID_PARAMS


class InternalError(SnapshotdError):
    code = INTERNAL_ERROR


class NotFound(SnapshotdError):
    kind = "not_found"


class Ambiguous(SnapshotdError):
    kind = "ambiguous"


class NotADirectory(SnapshotdError):
    kind = "not_a_directory"


class WorktreeMismatch(SnapshotdError):
    kind = "worktree_mismatch"


class PathOutsideWorktree(SnapshotdError):
    kind = "path_outside_worktree"


class GitError(SnapshotdError):
    kind = "git_error"


class Unsupported(SnapshotdError):
    kind = "unsupported"


class TooLarge(SnapshotdError):
    kind = "too_large"


class Busy(SnapshotdError):
    kind = "busy"


class ShuttingDown(SnapshotdError):
    kind = "shutting_down"


ERRORS_BY_KIND: dict[str, type[SnapshotdError]] = {
    cls.kind: cls
    for cls in (
        NotFound,
        Ambiguous,
        NotADirectory,
        WorktreeMismatch,
        PathOutsideWorktree,
        GitError,
        Unsupported,
        TooLarge,
        Busy,
        ShuttingDown,
    )
    if cls.kind is not None
}

ERRORS_BY_CODE: dict[int, type[SnapshotdError]] = {
    cls.code: cls
    for cls in (ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError)
}
