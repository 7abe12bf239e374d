"""Whether a path still holds what the safety checkpoint recorded there, before a restore replaces it.

A restore checks every path twice: when its plan is checked against the
safety checkpoint (:meth:`Recorded.stale`), and just before the path is
replaced or removed, so a file written meanwhile is left alone as a
conflict. A file is compared by its bytes hashed as a blob; the second look
trusts the stat data of a file the first found as recorded when its times
are older than a racy-timestamp fence taken before the first look.
"""

from __future__ import annotations

import os
import stat

from snapshotd import fsutil
from snapshotd.capture.state import FileState
from snapshotd.errors import PathBlocked
from snapshotd.git.modes import MODE_GITLINK, MODE_LINK
from snapshotd.git.repository import Repository
from snapshotd.restore.fileops import blob_id, lstat_at, open_dir, read_at, readlink_at
from snapshotd.restore.plan import Plan
from snapshotd.restore.stage import Stage

__all__ = ["Recorded"]


class Recorded:
    """What the safety checkpoint recorded at a plan's paths (``plan.expected``), checked against the disk."""

    def __init__(self, repo: Repository, plan: Plan, stage: Stage) -> None:
        self.repo = repo
        self.plan = plan
        self.stage = stage
        self.settled: dict[str, FileState] = {}  # files :meth:`stale` found as recorded, older than its fence
        self.fence_ns: int | None = None  # while :meth:`stale` runs: the racy-timestamp fence taken before it looked

    def looked_at(self, dir_fd: int, name: str, path: str) -> tuple[bool, os.stat_result | None]:
        """Whether ``path`` still holds what the safety checkpoint recorded there, and its lstat (None: nothing
        there).

        Compared by kind and content (a file's bytes hashed as a blob, through
        git's clean filters when the raw bytes differ). A path the plan holds
        no record for (a hand-made plan) is not checked. A file :meth:`stale`
        already found as recorded, whose times are older than the fence it took
        before looking, is not read again while its lstat is the same: a write
        since would have given it a time from the fence on (git's racy-timestamp
        rule).
        """
        st = lstat_at(dir_fd, name)
        return path not in self.plan.expected or self._holds(dir_fd, name, path, st), st

    def _holds(self, dir_fd: int, name: str, path: str, st: os.stat_result | None) -> bool:
        entry = self.plan.expected[path]
        if st is None:
            return entry is None
        if entry is None:
            return stat.S_ISDIR(st.st_mode)  # a folder the plan may replace only if it is empty
        if entry.mode == MODE_GITLINK:
            return stat.S_ISDIR(st.st_mode)
        if entry.mode == MODE_LINK:
            return stat.S_ISLNK(st.st_mode) and readlink_at(dir_fd, name) == self.repo.odb.read(entry.oid)[1]
        if not stat.S_ISREG(st.st_mode):
            return False
        key = FileState.of(st)
        if self.settled.get(path) == key:
            return True
        data = read_at(dir_fd, name)
        if data is None:
            return False
        held = blob_id(data, entry.oid) == entry.oid or self.stage.clean_id(path, data) == entry.oid
        if held and self.fence_ns is not None and fsutil.older_than(st, self.fence_ns):
            self.settled[path] = key
        return held

    def stale(self, root_fd: int, fence_ns: int | None = None) -> list[str]:
        """The planned paths under the worktree ``root_fd`` that no longer hold what the safety checkpoint
        recorded (each folder opened once).

        ``fence_ns`` is the racy-timestamp fence taken before this call: the
        files found as recorded that are older than it are not read again
        before they are replaced (:meth:`looked_at`).
        """
        found = []
        folders: dict[tuple[str, ...], int | OSError | PathBlocked] = {}
        self.fence_ns = fence_ns
        try:
            for path in (*self.plan.deletes, *(p for p, _ in self.plan.writes)):
                parts = path.split("/")
                key = tuple(parts[:-1])
                if key not in folders:
                    try:
                        folders[key] = open_dir(root_fd, key, create=False)
                    except (OSError, PathBlocked) as exc:
                        folders[key] = exc
                fd = folders[key]
                if isinstance(fd, FileNotFoundError):
                    if self.plan.expected.get(path) is not None:
                        found.append(path)
                elif isinstance(fd, int) and not self.looked_at(fd, parts[-1], path)[0]:
                    found.append(path)  # (a folder blocked or refused: applying reports it)
        finally:
            self.fence_ns = None
            for fd in folders.values():
                if isinstance(fd, int):
                    os.close(fd)
        return sorted(set(found))
