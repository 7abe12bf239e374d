"""Every error snapshotd reports, one class per wire kind.

Each error carries the JSON-RPC ``code``, the application ``kind`` (for code
-32000) and a one-sentence ``message`` for a person, and converts to and from
the wire form. Library errors (pygit2, OSError, the spawn helper) are mapped to
these at the call site with ``raise ... from exc``.
"""

from __future__ import annotations

import errno
import os

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from collections.abc import Sequence
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


class Untrusted(SnapshotdError):
    """Another user's repository (git's ``safe.directory`` rule), or a state folder that is not ours."""

    kind = "untrusted"


class Busy(SnapshotdError):
    kind = "busy"


class ShuttingDown(SnapshotdError):
    kind = "shutting_down"


class StateUnreadable(SnapshotdError):
    """A file of snapshotd's own state exists but cannot be read; nothing is recreated over it."""

    kind = "state_unreadable"


class NeedsForce(SnapshotdError):
    """A request that is allowed only when asked for explicitly (``force``)."""

    kind = "needs_force"


class FilesystemError(SnapshotdError):
    """The disk refused a write: full, over quota, read-only, or not permitted."""

    kind = "filesystem"


# What a person can do about each refusal of the disk, by errno.
_REMEDIES: dict[int, str] = {
    errno.ENOSPC: "the disk is full; free some space and try again",
    errno.EDQUOT: "the disk quota is used up; free some space and try again",
    errno.EROFS: "the file system is mounted read-only",
    errno.EACCES: "permission denied; check the owner and mode of that path",
    errno.EPERM: "the operation is not permitted there; check the owner and mode of that path",
}


def errno_of(exc: BaseException) -> int | None:
    """The errno behind an OSError, or behind a library error whose message quotes one.

    libgit2 reports a failed write as a GitError whose text ends with the
    system's message ("No space left on device"), without the number.
    """
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno
    text = str(exc)
    for number in _REMEDIES:
        if os.strerror(number) in text:
            return number
    return None


LOW_SPACE_BYTES = 16 * 1024 * 1024
"""Free space under which a failed write is put down to a full disk."""


def _disk_refusal(path: str) -> int | None:
    """The errno a write at ``path`` would meet now (read-only, full, not writable), if any.

    libgit2 does not always pass the system's reason on: a blob written to a
    full disk fails as "failed to find pack entry". The file system is then
    asked directly.
    """
    try:
        fs = os.statvfs(path)
    except OSError:
        return None
    if fs.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if fs.f_bavail * fs.f_frsize < LOW_SPACE_BYTES:
        return errno.ENOSPC
    if not os.access(path, os.W_OK):
        return errno.EACCES
    return None


def filesystem_error(exc: BaseException, path: str, doing: str, where: str = "") -> SnapshotdError:
    """One clear sentence for a failure of the disk at ``path`` (``where`` it is) while ``doing``.

    The one place where ENOSPC, EDQUOT, EROFS, EACCES and EPERM get their
    wording; any other failure is an internal error that still names the path.
    """
    number = errno_of(exc)
    if number is None and not isinstance(exc, OSError):
        number = _disk_refusal(path)
    name = errno.errorcode.get(number or 0)
    place = f"{path}{where}"
    if number in _REMEDIES:
        return FilesystemError(f"Could not {doing} {place}: {_REMEDIES[number]}.", path=path, errno=name)
    reason = os.strerror(number) if number else (str(exc) or type(exc).__name__)
    return InternalError(f"Could not {doing} {place}: {reason}.", path=path, errno=name)


def raise_disk_error(exc: BaseException, path: str, doing: str) -> None:
    """Raise :func:`filesystem_error`'s sentence when the disk refused (full, read-only...); else return."""
    error = filesystem_error(exc, path, doing)
    if isinstance(error, FilesystemError):
        raise error from exc


def missing_object_error(exc: BaseException, store: str, worktree: str) -> GitError | None:
    """A failed object lookup (pygit2's KeyError: the id, or "... no match for id (ID)") as a sentence naming
    the repository; also behind a checkpoint that could not be read back once recorded (Store.load's NotFound)."""
    found = exc if isinstance(exc, KeyError) else exc.__cause__
    key = str(found.args[0]) if isinstance(found, KeyError) and found.args else ""
    key = key.rpartition("no match for id (")[2].removesuffix(")")
    if len(key) not in (40, 64) or any(ch not in "0123456789abcdef" for ch in key):
        return None
    return GitError(f"The repository {store} of the worktree {worktree} lacks the object {key}, so it cannot be "
                    "captured; 'git fsck' there says what else is missing.")


# --- push and fetch: git's words about a remote, as one sentence ------------------

_AUTH_SIGNS = ("authentication failed", "permission denied", "could not read username", "could not read password",
               "terminal prompts disabled", "host key verification failed", "returned error: 401", "returned error: 403")
_MISSING_BASE_SIGNS = ("shallow update not allowed", "bad object", "missing object", "did not receive expected object")
_UNREACHABLE_SIGNS = ("unable to connect", "could not resolve", "connection refused", "timed out", "no route to host",
                      "network is unreachable", "does not appear to be a git repository", "repository not found",
                      "could not read from remote repository", "unable to access")
# Reasons git gives a rejected ref that only say another ref of the same atomic push failed.
_COLLATERAL = ("atomic push failed", "atomic transaction failed")


def transfer_error(doing: str, remote: str, detail: str, rejected: Sequence[tuple[str, str]] = ()) -> GitError:
    """The one sentence for a failed ``push`` or ``fetch`` of checkpoints, from git's own words.

    ``detail`` is git's standard error; ``rejected`` the (ref, reason) pairs a
    push's porcelain output named. ``data.reason`` says which case it is:
    ``rejected``, ``missing_base``, ``auth``, ``unreachable`` or ``failed``.
    """
    text = " ".join(detail.lower().split())
    real = [(ref, why) for ref, why in rejected if why not in _COLLATERAL] or list(rejected)
    reasons = " ".join(why for _, why in real)
    if any(sign in reasons or sign in text for sign in _MISSING_BASE_SIGNS):
        return GitError(
            f"The remote {remote} lacks commits these checkpoints are based on and this repository cannot send "
            "them (it is shallow or partial): push their branch there first, or run 'git fetch --unshallow'.",
            reason="missing_base", remote=remote,
        )
    if real:
        names = ", ".join(f"{ref} ({why})" for ref, why in real[:3]) + (f" and {len(real) - 3} more" if len(real) > 3 else "")
        return GitError(
            f"The remote {remote} refused {names}: it changed since this machine last pushed, so nothing was "
            "pushed; run 'snapshotd fetch' first to keep its checkpoints here, then 'snapshotd push --force' "
            "to replace it with this machine's.",
            reason="rejected", remote=remote, refs=[ref for ref, _ in real],
        )
    if any(sign in text for sign in _AUTH_SIGNS):
        return GitError(
            f"The remote {remote} refused the credentials git offered, so nothing was {doing}; check them with "
            "'git ls-remote' (snapshotd uses git's own credential helpers and ssh agent, never a prompt).",
            reason="auth", remote=remote,
        )
    if any(sign in text for sign in _UNREACHABLE_SIGNS):
        return GitError(
            f"The remote {remote} cannot be reached (git says: {_last_line(detail)}), so nothing was {doing}; "
            "check its URL with 'git remote -v' and the network, then try again.",
            reason="unreachable", remote=remote,
        )
    return GitError(
        f"git could not {'push to' if doing == 'pushed' else 'fetch from'} the remote {remote}: "
        f"{_last_line(detail) or 'no reason given'}.",
        reason="failed", remote=remote,
    )


def _last_line(detail: str) -> str:
    lines = [line.strip() for line in detail.splitlines() if line.strip() and not line.startswith("hint:")]
    fatal = [line for line in lines if line.startswith(("fatal:", "error:"))]
    return (fatal[0] if fatal else lines[-1] if lines else "").removeprefix("fatal: ").removeprefix("error: ")


# --- internal: restore -------------------------------------------------------
# Raised and caught inside the restore stage; never sent to a client.


class PathBlocked(Exception):
    """A component of a worktree path is not a real folder (a symlink or a file), so nothing goes through it."""

    def __init__(self, path: str, is_link: bool) -> None:
        super().__init__(path)
        self.path = path
        self.is_link = is_link

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
        Untrusted,
        Busy,
        ShuttingDown,
        FilesystemError,
        StateUnreadable,
        NeedsForce,
    )
    if cls.kind is not None
}

ERRORS_BY_CODE: dict[int, type[SnapshotdError]] = {
    cls.code: cls
    for cls in (ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError)
}


# --------------------------------------------------------------------------
# internal: faces (the server, the clients and the command line). These are
# not wire errors: a daemon the command line cannot reach is an InternalError
# (one class per wire code), and these are raised to the callers of the
# clients and of the framing.


class UntrustedDaemon(PermissionError):
    """What listens on the socket runs as another user; nothing was sent to it."""


class JsonConstantRefused(ValueError):
    """A message holds ``NaN`` or ``Infinity``, which Python's JSON reader takes and JSON does not."""


# --------------------------------------------------------------------------- internal: git and store
# Raised and caught inside the daemon, never sent to a client as they are: the
# store retries on them, or maps them to one of the errors above.


class RefRaced(Exception):
    """The ref moved between reading and writing it; the caller retries."""


class RefMoved(Exception):
    """The reference did not hold the expected value, so it was not changed."""


class RefLocked(Exception):
    """Another writer holds the reference's lock; the update may be retried."""


class SpawnTimeout(Exception):
    """The process did not finish in time; its whole process group was killed.

    ``stdout`` and ``stderr`` hold what it had written before that.
    """

    def __init__(
        self,
        argv: tuple[str, ...],
        timeout: float,
        *,
        pid: int,
        stdout: bytes = b"",
        stderr: bytes = b"",
    ) -> None:
        import shlex  # here, not at the top: every agent hook imports this module
        super().__init__(
            f"{shlex.join(argv)} did not finish within {timeout:g} s; its process group was killed"
        )
        self.argv = argv
        self.timeout = timeout
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr


class WatchGivenUp(Exception):
    """A worktree's watch ends for a limit (internal): the kernel's, or snapshotd's own ceiling per worktree.

    ``reason`` names which (``watch_limit``, ``watch_ceiling``, ``descriptors``); the message is the
    sentence ``watch_error`` shows; ``walked`` is False if known before any walk. Captures are then full scans.
    """

    def __init__(self, reason: str, message: str, *, walked: bool = True) -> None:
        super().__init__(message)
        self.reason, self.walked = reason, walked
