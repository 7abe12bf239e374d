"""What agent hooks keep between runs: the order of a session's checkpoints, the last result, when the user was told.

Every hook is a new process, and an "after" hook may leave its checkpoint to
finish in the background. :class:`Turn` keeps a session's checkpoints in the
order of their events: each run takes a marker (a locked file named by its
start time) and its checkpoint waits until every earlier live marker of the
same session is gone, so a "before" never overtakes a pending "after". A
marker whose lock is free belongs to a process that died: it is dropped.

The folder is ``<data home>/hooks`` (see :func:`snapshotd.settings.data_home`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from snapshotd.fsutil import check_private_home
from snapshotd.settings import data_home

POLL_S = 0.01
"""How often a waiting checkpoint looks again at the markers before it."""

TELL_EVERY_S = 600
"""The user is shown at most one failure line per tool in this many seconds."""


def hooks_folder() -> Path:
    """The hooks' own folder, made private on first use."""
    home = data_home()
    check_private_home(home, create=True)  # made 0700 if missing, as the daemon would make it
    folder = home / "hooks"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


class Turn:
    """One hook run's place in its session's order of checkpoints."""

    def __init__(self, key: str) -> None:
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:24]
        self.folder = hooks_folder() / "order" / digest
        for attempt in range(3):  # the last run of the session may remove the folder meanwhile
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.stamp = time.time_ns()
            self.path = self.folder / f"{self.stamp:020d}-{os.getpid()}"
            try:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        fcntl.flock(self.fd, fcntl.LOCK_EX)  # held by whoever keeps this descriptor: the checkpoint's process

    def _earlier_pending(self) -> bool:
        """Whether a live marker older than this one remains (dead ones are removed on the way)."""
        for name in sorted(os.listdir(self.folder)):
            if name >= self.path.name:
                return False
            other = self.folder / name
            try:
                fd = os.open(other, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            finally:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                other.unlink()  # its process ended without removing it
        return False

    def wait(self, deadline: float) -> bool:
        """Wait until no earlier checkpoint of the session is pending; False when ``deadline`` (monotonic) passed first."""
        while self._earlier_pending():
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def release(self) -> None:
        """This run's checkpoint is recorded (or failed): later ones may go."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        with contextlib.suppress(OSError):  # the session's folder goes with its last marker
            self.folder.rmdir()
        self.close()

    def close(self) -> None:
        """Drop this process's copy of the lock (a child holding it keeps the turn)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _name(tool: str) -> str:
    """``tool`` as a file name part: a tool's name, or ``other`` for anything else."""
    return tool if tool.replace("-", "").isalpha() and tool.isascii() and len(tool) <= 32 else "other"


def _result_path(tool: str) -> Path:
    return hooks_folder() / f"last-{_name(tool)}.json"


def record_result(tool: str, event: str, cwd: str, note: str | None) -> None:
    """Keep the outcome of this hook run (``note`` None: recorded) for ``doctor`` and for the next run."""
    entry = {"time": time.time(), "event": event, "cwd": cwd, "ok": note is None, "note": note}
    path = _result_path(tool)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(entry), encoding="utf-8")
        os.replace(tmp, path)


def last_result(tool: str) -> dict[str, Any] | None:
    """The last recorded outcome of ``tool``'s hooks, if any."""
    try:
        entry = json.loads(_result_path(tool).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) else None


def may_tell(tool: str, now: float | None = None) -> bool:
    """Whether a failure line may be shown to the user now; if so, the moment is remembered."""
    now = time.time() if now is None else now
    mark = hooks_folder() / f"told-{_name(tool)}"
    try:
        if now - mark.stat().st_mtime < TELL_EVERY_S:
            return False
    except OSError:
        pass
    with contextlib.suppress(OSError):
        mark.touch()
        os.utime(mark, (now, now))
    return True
