"""Settings resolved in one place: the argument, then the environment, then the default."""

from __future__ import annotations

import os
from contextvars import ContextVar  # the C module _contextvars only

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_SIZE_CAP = 64 * 1024 * 1024
DEFAULT_WATCH_CEILING = 50_000
VERSION = "0.1.0"
RESERVED_SESSION_PREFIX = "snapshotd:"  # sessions of the daemon's own: clients cannot record in them
SAFETY_SESSION = "snapshotd:safety"  # the session of the checkpoints taken before each restore or revert

HOOK_ENVIRONMENT = (
    "CLAUDE_PROJECT_DIR", "HOME", "XDG_DATA_HOME", "SNAPSHOTD_HOME", "SNAPSHOTD_HOOK_BEFORE_BUDGET", "SNAPSHOTD_HOOK_BUDGET",
)
"""The variables an agent hook's logic reads (its payload's folder, the hooks' folder, its budgets): what the
native hook entry passes to the daemon's ``hook`` method, which reads them through :func:`getenv`. (With
``SNAPSHOTD_DISABLE`` set, or any other rule the native entry does not know, it runs the Python entry.)"""

HOOK_ENVIRON: ContextVar[dict[str, str] | None] = ContextVar("snapshotd_hook_environ", default=None)
"""The environment of the hook the daemon runs for a native hook entry (in that hook's threads), else None."""


def getenv(name: str) -> str | None:
    """``name`` in the environment: the hook's the daemon runs (:data:`HOOK_ENVIRON`), else this process's."""
    environ = HOOK_ENVIRON.get()
    return environ.get(name) if environ is not None else os.environ.get(name)


def data_home_path(explicit: str | os.PathLike[str] | None = None) -> str:
    """The daemon's own data folder: records of worktrees and repositories of plain folders."""
    if explicit is not None:
        return os.fspath(explicit)
    named = getenv("SNAPSHOTD_HOME")
    if named:
        return named
    base = getenv("XDG_DATA_HOME") or os.path.join(getenv("HOME") or os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "snapshotd")


def data_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """:func:`data_home_path` as a Path."""
    from pathlib import Path

    return Path(data_home_path(explicit))


def size_cap(explicit: int | None = None) -> int:
    """Untracked files larger than this many bytes are left out of captures (0: no cap)."""
    if explicit is not None:
        return explicit
    value = os.environ.get("SNAPSHOTD_SIZE_CAP")
    return int(value) if value else DEFAULT_SIZE_CAP


def host_name() -> str:
    """The machine name each checkpoint records (``$SNAPSHOTD_HOST``, default the host name): a fetched one says it.

    Containers and CI runners often get a random host name; the setting gives
    them a stable one.
    """
    import socket

    return os.environ.get("SNAPSHOTD_HOST") or socket.gethostname()


def watch_ceiling(explicit: int | None = None) -> int:
    """The most folders the daemon watches in one worktree (``$SNAPSHOTD_WATCH_CEILING``, default 50,000).

    A worktree with more is not watched: its captures are full scans, and
    ``worktrees`` says why. Each watch costs one of the user's inotify watches
    (``fs.inotify.max_user_watches``, shared by all of the user's processes).
    """
    if explicit is not None:
        return explicit
    value = os.environ.get("SNAPSHOTD_WATCH_CEILING")
    try:
        return max(1, int(value)) if value else DEFAULT_WATCH_CEILING
    except ValueError:
        return DEFAULT_WATCH_CEILING


DEFAULT_HOOK_BUDGET_S = 0.0
HOOK_TIMEOUT_S = 60
"""The time limit ``integrate`` writes into the agent's settings for one run of the hook (seconds)."""
DEFAULT_HOOK_BEFORE_BUDGET_S = HOOK_TIMEOUT_S - 5.0
"""A "before" hook waits this long for its checkpoint: inside the agent's limit, with time to exit."""


def _seconds(variable: str, default: float) -> float:
    value = getenv(variable)
    try:
        return float(value) if value else default
    except ValueError:
        return default  # a hook never fails the agent over its own setting


def hook_budget(explicit: float | None = None, *, before: bool = False) -> float:
    """Seconds an agent hook waits for its checkpoint before it lets the agent go on.

    A hook before the agent acts (``before``) waits for its checkpoint:
    ``$SNAPSHOTD_HOOK_BEFORE_BUDGET`` (default 55, inside :data:`HOOK_TIMEOUT_S`).
    Other hooks hand theirs to a background process and wait
    ``$SNAPSHOTD_HOOK_BUDGET`` (default 0: the agent waits for nothing; the
    checkpoint still comes before the session's next one).
    """
    if explicit is not None:
        return explicit
    if before:
        return _seconds("SNAPSHOTD_HOOK_BEFORE_BUDGET", DEFAULT_HOOK_BEFORE_BUDGET_S)
    return _seconds("SNAPSHOTD_HOOK_BUDGET", DEFAULT_HOOK_BUDGET_S)


DEFAULT_CONNECT_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 4096


def connect_timeout(explicit: float | None = None) -> float:
    """Seconds a client waits for room at a busy daemon before it says so: ``$SNAPSHOTD_CONNECT_TIMEOUT`` (30)."""
    if explicit is not None:
        return explicit
    return _seconds("SNAPSHOTD_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT_S)


def max_connections(explicit: int | None = None) -> int:
    """Connections the daemon serves at once: ``$SNAPSHOTD_MAX_CONNECTIONS``, else 4096 (a fleet's sessions and hooks).

    The daemon lowers it to fit its descriptor limit (see
    :func:`snapshotd.server.budget.connection_cap`); a connection past it gets
    a ``busy`` answer that says when to retry.
    """
    if explicit is not None:
        return explicit
    value = os.environ.get("SNAPSHOTD_MAX_CONNECTIONS")
    if not value:
        return DEFAULT_MAX_CONNECTIONS
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"SNAPSHOTD_MAX_CONNECTIONS must be a whole number of at least 1, not {value!r}.")
    return number


FACILITIES = ("inotify", "peercred", "syncfs", "proc")
"""What ``$SNAPSHOTD_DISABLE`` may switch off: what macOS, BSD or a strict container lacks (:mod:`snapshotd.facilities`)."""


def disabled_facilities(value: str | None = None) -> frozenset[str]:
    """The facilities ``$SNAPSHOTD_DISABLE`` switches off (comma-separated names of :data:`FACILITIES`, or ``all``).

    Each is then treated as missing, the way the platform without it would
    be; a name not known is left out here (an agent hook never fails over its
    own setting) and refused by :func:`check_disabled` when the daemon starts.
    """
    text = (getenv("SNAPSHOTD_DISABLE") or "") if value is None else value
    names = {name.strip().lower() for name in text.split(",") if name.strip()}
    return frozenset(FACILITIES) if "all" in names else frozenset(names & set(FACILITIES))


def check_disabled(value: str | None = None) -> None:
    """Refuse a ``$SNAPSHOTD_DISABLE`` naming what it cannot switch off (ValueError, one sentence)."""
    text = os.environ.get("SNAPSHOTD_DISABLE", "") if value is None else value
    unknown = sorted({name.strip().lower() for name in text.split(",") if name.strip()} - {*FACILITIES, "all"})
    if unknown:
        raise ValueError(
            f"SNAPSHOTD_DISABLE names {', '.join(repr(name) for name in unknown)}, which it cannot switch off; "
            f"use a comma-separated list of {', '.join(FACILITIES)} (or all)."
        )


def git_config_home() -> Path:
    """Where git looks for the user's config, ignore and attributes files: $XDG_CONFIG_HOME/git."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    from pathlib import Path

    return Path(base, "git")


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
