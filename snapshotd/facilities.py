"""The platform facilities the daemon uses where it has them, and what it does where it has not.

inotify (the watcher behind warm captures), ``SO_PEERCRED`` (who is at the
other end of the socket), ``syncfs`` (one flush of a store's file system) and
``/proc`` (the watcher's descriptors and watch counts, the process table
behind an MCP server's session, the umask). macOS and the BSDs have none of them, and a
container's seccomp profile or a missing ``/proc`` mount takes some away.

Each is looked for once per process, at its first use; the daemon looks for
all four at start-up and logs each one missing, once. ``$SNAPSHOTD_DISABLE``
(:func:`snapshotd.settings.disabled_facilities`) makes one missing on a machine
that has it, so the paths those platforms take run here too (CI runs part of
the suite with all four off). One that fails later with an error saying it is
not there (ENOSYS, EPERM) is :func:`lose`-t and takes the same path.

Without them: every capture is cold (a full scan, as exact); the socket's peer
is not checked, and the socket folder's owner and mode (0700) keep other users
out (docs/security.md); what libgit2 writes is fsynced as written, and git's
writes with a ``sync`` of every file system (the daemon's own object files
are fsynced file by file either way); the
umask is the one the daemon set at start, and an MCP server's session is
``$SNAPSHOTD_SESSION``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading

from snapshotd.settings import FACILITIES, disabled_facilities

log = logging.getLogger("snapshotd")

CONSEQUENCES = {
    "inotify": "worktrees are not watched, so every capture scans its worktree in full (as exact, slower)",
    "peercred": "the peer of a connection is not checked; the socket folder's owner and mode (0700) keep other "
    "users out",
    "syncfs": "objects libgit2 writes are fsynced one by one and those git writes with a sync of every file "
    "system (slower cold captures and SHA-256 checkpoints)",
    "proc": "inotify watches cannot be kept (every capture scans in full), and an MCP server knows its agent's "
    "session only from SNAPSHOTD_SESSION",
}
ABSENT_ERRNOS = frozenset({errno.ENOSYS, errno.EPERM, errno.EACCES, errno.EOPNOTSUPP, errno.ENOPROTOOPT})
"""Errors that say a facility is not there (not implemented, or denied by a sandbox), rather than a passing fault."""
SWITCHED_OFF = "switched off by SNAPSHOTD_DISABLE"

_lock = threading.RLock()  # a probe may ask for another facility (inotify needs /proc)
_reasons: dict[str, str | None] = {}  # facility -> why it is missing (None: it is there), once looked for
_logged: set[str] = set()


def missing_reason(name: str) -> str | None:
    """Why ``name`` (one of :data:`FACILITIES`) is missing in this process, or None when it is there."""
    with _lock:
        if name not in _reasons:
            _reasons[name] = SWITCHED_OFF if name in disabled_facilities() else _PROBES[name]()
        return _reasons[name]


def available(name: str) -> bool:
    """Whether this process has ``name``: not switched off, and found when first looked for."""
    return missing_reason(name) is None


def lose(name: str, reason: str) -> None:
    """``name`` failed as a missing one does (``reason``: the call and its error): missing from now on, logged once."""
    with _lock:
        if _reasons.get(name) is not None:
            return
        _reasons[name] = reason
    log_missing()


def warning(name: str, reason: str) -> str:
    """The sentence ``status`` and the log give for one missing facility."""
    return f"{name} is unavailable ({reason}): {CONSEQUENCES[name]}."


def report() -> dict[str, object]:
    """For ``status``: each facility's availability (and why not), and one warning per missing one."""
    reasons = {name: missing_reason(name) for name in FACILITIES}
    return {
        "facilities": {name: {"available": why is None, "reason": why} for name, why in reasons.items()},
        "warnings": [warning(name, why) for name, why in reasons.items() if why is not None],
    }


def log_missing() -> None:
    """Log each missing facility once in this process's life (the daemon calls this at start-up)."""
    for name in FACILITIES:
        why = missing_reason(name)
        with _lock:
            if why is None or name in _logged:
                continue
            _logged.add(name)
        log.warning("%s", warning(name, why))


def forget() -> None:
    """Look for every facility again at its next use (a test that changes ``$SNAPSHOTD_DISABLE`` in-process)."""
    with _lock:
        _reasons.clear()
        _logged.clear()


# --- looking for each one --------------------------------------------------------


def _libc_call(name: str) -> object | None:
    """The C library's function ``name``, or None when it has none (not Linux, or an old C library)."""
    import ctypes

    return getattr(ctypes.CDLL(None, use_errno=True), name, None)


def _probe_proc() -> str | None:
    try:
        with open("/proc/self/stat", "rb") as handle:
            handle.read()
        os.readlink("/proc/self/exe")
    except OSError as exc:
        return f"/proc is not mounted or not readable: {exc.strerror}"
    return None


def _probe_inotify() -> str | None:
    import ctypes

    if missing_reason("proc") is not None:
        return "it is watched through /proc/self/fd, and /proc is unavailable"
    init = _libc_call("inotify_init1")
    if init is None:
        return "the C library has no inotify_init1"
    fd = init(os.O_NONBLOCK | os.O_CLOEXEC)  # type: ignore[operator]
    if fd >= 0:
        os.close(fd)
        return None
    number = ctypes.get_errno()
    if number in (errno.EMFILE, errno.ENFILE):
        return None  # a limit, not a missing facility: each worktree names it (the sysctl to raise)
    return f"inotify_init1: {os.strerror(number)}"


def _probe_peercred() -> str | None:
    import socket

    from snapshotd.contract.peers import peer_credentials

    if not hasattr(socket, "SO_PEERCRED"):
        return "the platform has no SO_PEERCRED"
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        found = peer_credentials(left)
    finally:
        left.close()
        right.close()
    return None if found is not None else "getsockopt(SO_PEERCRED) is refused"


def _probe_syncfs() -> str | None:
    return None if _libc_call("syncfs") is not None else "the C library has no syncfs"


_PROBES = {"inotify": _probe_inotify, "peercred": _probe_peercred, "syncfs": _probe_syncfs, "proc": _probe_proc}


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
    if stat.S_ISREG(info.st_mode) and "proc" not in disabled_facilities():
        with contextlib.suppress(OSError):
            return os.readlink("/proc/self/fd/2")
    if os.isatty(2):
        return "the terminal running 'snapshotd serve'"
    return "the daemon's standard error"
