"""What agent hooks keep between runs: the order of a session's checkpoints, the last result, when the user was told.

Every hook is a new process, and an "after" hook may leave its checkpoint to
finish in the background. :class:`Turn` keeps a session's checkpoints in the
order of their events: each run takes a marker (a locked file named by its
start time) and its checkpoint waits until every earlier live marker of the
same session is gone, so a "before" never overtakes a pending "after". A
marker whose lock is free belongs to a process that died: it is dropped.

The folder is ``<data home>/hooks`` (see :func:`snapshotd.settings.data_home`).
Every agent event starts a hook process that imports this module, so it
stays on the standard library's light modules (no pathlib, no typing).
"""

from __future__ import annotations

import _thread
import fcntl
import os
import stat
import time
import zlib

from snapshotd.agents.hookorder import POLL_MAX_S, POLL_S, SHELLS, Spawn, proc_stat
from snapshotd.errors import SnapshotdError, Untrusted
from snapshotd.jsonlite import dumps, loads
from snapshotd.settings import data_home_path

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from typing import Any

TELL_EVERY_S = 600
"""The user is shown at most one failure line per tool in this many seconds."""


def hooks_folder() -> str:
    """The hooks' own folder: a folder of this user's, mode 0700, made on first use.

    The home above it passes :func:`~snapshotd.fsutil.check_private_home` when
    the folder is made; later runs check the folder itself (``lstat``: ours,
    private, not a link), which no other user can make or change.
    """
    home = data_home_path()
    folder = os.path.join(home, "hooks")
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        from snapshotd.fsutil import check_private_home

        check_private_home(home, create=True)  # made 0700 if missing, as the daemon would make it
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise Untrusted(f"Refusing the hooks' folder {folder}: it must be a folder of yours that only you may use (chmod 700).")
    return folder


def key_name(key: str) -> str:
    """A file name for a session (or folder) key: two checksums (hashlib's OpenSSL would cost the hook 2 ms);
    two keys that met on one name would only share their order and their record."""
    data = key.encode("utf-8", "surrogateescape")
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}{len(data):x}"


def _placed_folder() -> str:
    """Where each hook that took its place says so, by :meth:`~snapshotd.agents.hookorder.Spawn.place`
    (an empty file, removed when its checkpoint is recorded; one a killed hook leaves names no later process)."""
    return os.path.join(hooks_folder(), "placed")


def _held(path: str) -> bool | None:
    """Whether a live process holds the marker at ``path`` (None: no marker there)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class Turn:
    """One hook run's place in its session's order of checkpoints."""

    def __init__(self, key: str, spawn: Spawn | None = None) -> None:
        """This run's place in the order of the session (or folder) ``key``: where the agent started it
        (``spawn``, see :mod:`.hookorder`), else this moment."""
        self.folder = os.path.join(hooks_folder(), "order", key_name(key))
        self.spawn = spawn
        for attempt in range(3):  # the last run of the session may remove the folder meanwhile
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            self.name = spawn.name() if spawn is not None else f"{time.time_ns():020d}-{os.getpid()}"
            self.path = os.path.join(self.folder, self.name)
            try:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        fcntl.flock(self.fd, fcntl.LOCK_EX)  # held by whoever keeps this descriptor: the checkpoint's process
        self.placed = None
        if spawn is not None:  # the agent's later hooks need not wait for this process any longer
            placed = _placed_folder()
            os.makedirs(placed, mode=0o700, exist_ok=True)
            self.placed = os.path.join(placed, spawn.place())
            os.close(os.open(self.placed, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))

    def _earlier_pending(self) -> str | None:
        """The oldest live marker older than this one, if any (dead ones are removed on the way)."""
        for name in sorted(os.listdir(self.folder)):
            if name >= self.name:
                return None
            other = os.path.join(self.folder, name)
            held = _held(other)
            if held:
                return other
            if held is False:
                try:
                    os.unlink(other)  # its process ended without removing it
                except FileNotFoundError:
                    pass
        return None

    def wait(self, deadline: float) -> bool:
        """Wait until no earlier checkpoint of the session is pending (nor an earlier hook of the agent still
        starting); False when ``deadline`` (monotonic) passed first. Between looks at the whole folder it
        looks at the one marker it waits for."""
        placed = _placed_folder()
        if self.spawn is not None and not self.spawn.wait_for_earlier(
            deadline, lambda name: os.path.exists(os.path.join(placed, name))
        ):
            return False
        pause = POLL_S
        pending = self._earlier_pending()
        while pending is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX_S)
            if not _held(pending):
                pending = self._earlier_pending()
        return True

    def release(self) -> None:
        """This run's checkpoint is recorded (or failed): later ones may go."""
        for path in (self.path, self.placed):
            try:
                if path is not None:
                    os.unlink(path)
            except FileNotFoundError:
                pass
        try:  # the session's folder goes with its last marker
            os.rmdir(self.folder)
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        """Drop this process's copy of the lock (a child holding it keeps the turn)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _name(tool: str) -> str:
    """``tool`` as a file name part: a tool's name, or ``other`` for anything else."""
    return tool if tool.replace("-", "").isalpha() and tool.isascii() and len(tool) <= 32 else "other"


def _result_path(tool: str) -> str:
    return os.path.join(hooks_folder(), f"last-{_name(tool)}.json")


def _tmp_suffix() -> str:
    """A temporary file's suffix no other writer shares: the process, and the thread (the daemon runs hooks in threads)."""
    return f"{os.getpid()}.{_thread.get_ident()}"


def record_result(tool: str, event: str, cwd: str, note: str | None) -> None:
    """Keep the outcome of this hook run (``note`` None: recorded) for ``doctor`` and for the next run."""
    entry = {"time": time.time(), "event": event, "cwd": cwd, "ok": note is None, "note": note}
    path = _result_path(tool)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{_tmp_suffix()}")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(dumps(entry))
        os.replace(tmp, path)
    except OSError:
        pass


def last_result(tool: str) -> dict[str, Any] | None:
    """The last recorded outcome of ``tool``'s hooks, if any."""
    try:
        with open(_result_path(tool), encoding="utf-8") as handle:
            entry = loads(handle.read())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) else None


def may_tell(tool: str, now: float | None = None) -> bool:
    """Whether a failure line may be shown to the user now; if so, the moment is remembered. With no
    folder to remember it in (a home other users may use: the line says so), always."""
    now = time.time() if now is None else now
    try:
        mark = os.path.join(hooks_folder(), f"told-{_name(tool)}")
    except (OSError, SnapshotdError):
        return True
    try:
        if now - os.stat(mark).st_mtime < TELL_EVERY_S:
            return False
    except OSError:
        pass
    try:
        os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        os.utime(mark, (now, now))
    except OSError:
        pass
    return True


SILENT_KEEP_S = 600
"""A daemon found silent (it accepts, answers no ping) is asked only briefly by the hooks this long after."""


def _silent_mark(socket_path: str) -> str:
    return os.path.join(hooks_folder(), f"silent-{key_name(socket_path)}")


def silent_lately(socket_path: str, now: float | None = None) -> bool:
    """Whether a hook found the daemon at ``socket_path`` silent less than :data:`SILENT_KEEP_S` ago, and
    none has heard it since."""
    now = time.time() if now is None else now
    try:
        return now - os.stat(_silent_mark(socket_path)).st_mtime < SILENT_KEEP_S
    except (OSError, SnapshotdError):
        return False


def note_silence(socket_path: str, silent: bool) -> None:
    """Remember that the daemon at ``socket_path`` answered no ping (``silent``), or forget it (it answered)."""
    try:
        mark = _silent_mark(socket_path)
        if silent:
            os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
            os.utime(mark)
        else:
            os.unlink(mark)
    except (OSError, SnapshotdError):
        pass


def agent_key(pid: int) -> str | None:
    """``<pid>-<start time>`` of the agent process at or above ``pid`` (shells skipped), None if there is none."""
    for _ in range(8):
        found = proc_stat(pid)
        if found is None or pid <= 1:
            return None
        name, _, parent, start = found
        if name not in SHELLS:
            return f"{pid}-{start}"
        pid = parent
    return None


def write_record(path: str, text: str) -> bool:
    """Replace the record at ``path`` by ``text`` at once, unless it holds it already; True when it was made anew.

    A record that cannot be written is left as it was (a hook never fails for one).
    """
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False
        new = False
    except OSError:
        new = True
    tmp = f"{path}.{_tmp_suffix()}"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError:
        return False
    return new


def _agents_folder() -> str:
    folder = os.path.join(hooks_folder(), "agents")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def note_agent_session(key: str, session: str, cwd: str) -> None:
    """Keep that the agent ``key`` (:func:`agent_key` of a hook's parent) runs ``session`` in ``cwd``, for its MCP server."""
    path = os.path.join(_agents_folder(), key + ".json")
    write_record(path, dumps({"session": session, "cwd": cwd}))
    for name in os.listdir(os.path.dirname(path)):  # agents that ended: their records go
        if not name.endswith(".json"):
            continue
        pid_text, _, rest = name.partition("-")
        stat = proc_stat(int(pid_text)) if pid_text.isdigit() else None
        if stat is None or str(stat[3]) != rest.removesuffix(".json"):
            try:
                os.unlink(os.path.join(os.path.dirname(path), name))
            except OSError:
                pass


def agent_session(pid: int) -> dict[str, Any] | None:
    """What the hooks of the agent at or above ``pid`` (an MCP server's parent) recorded: its session and folder."""
    key = agent_key(pid)
    if key is None:
        return None
    try:
        with open(os.path.join(hooks_folder(), "agents", key + ".json"), encoding="utf-8") as handle:
            entry = loads(handle.read())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("session"), str) else None
