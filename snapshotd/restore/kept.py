"""What a restore leaves in place that the user may not expect: the ``kept`` list.

A restore never touches what no checkpoint holds: files ignored when it
began, and untracked files the capture left out (over the size cap, or not a
regular file). Those left out are always reported, within the restore's
paths. Ignored files are reported only when the restore changed the rules
that ignored them: after restoring an older ``.gitignore`` they show up as
untracked files nobody can explain, so they are listed with the reason.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Sequence

from snapshotd.git.process import GitTarget, run_git_sync
from snapshotd.paths import path_matches

__all__ = ["REASON_IGNORED", "REASON_LEFT_OUT", "IgnoredFiles", "empty_index_path", "left_out"]

REASON_IGNORED = "ignored when the restore began, so in no checkpoint; left in place"
REASON_LEFT_OUT = "left out of every checkpoint (over the size cap, or not a regular file); left in place"
_IGNORE_FILE = ".gitignore"


def _folders_ruled(paths: Iterable[str]) -> list[str]:
    """The folders whose ignore rules change when these paths are written or deleted."""
    return sorted({path.rpartition("/")[0] for path in paths if path.rpartition("/")[2] == _IGNORE_FILE})


class IgnoredFiles:
    """The ignored files under folders whose ``.gitignore`` a plan changes, seen before it is applied.

    ``index_file`` is the index git compares with (None: the worktree's own,
    only read); for a plain folder it names a file that does not exist, an
    empty index.
    """

    def __init__(self, target: GitTarget, index_file: str | None, changed: Iterable[str]) -> None:
        self.target = target
        self.index_file = index_file
        self.before: list[str] = []
        folders = _folders_ruled(changed)
        if folders:
            listing = run_git_sync(
                target,
                ["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory", "--",
                 *(f":(top){folder}" if folder else ":(top)" for folder in folders)],
                index_file=index_file,
            )
            self.before = sorted(os.fsdecode(raw) for raw in listing.split(b"\0") if raw)

    def no_longer_ignored(self) -> list[dict[str, str]]:
        """Those of the files seen before that the rules on disk now no longer ignore."""
        if not self.before:
            return []
        listing = run_git_sync(
            self.target,
            ["check-ignore", "-z", "--stdin"],
            index_file=self.index_file,
            input=b"".join(os.fsencode(path) + b"\0" for path in self.before),
            ok_codes=(0, 1),
        )
        still = {os.fsdecode(raw) for raw in listing.split(b"\0") if raw}
        return [{"path": path, "reason": REASON_IGNORED} for path in self.before if path not in still]


def empty_index_path(tmp_dir: str) -> str:
    """A name for an index that does not exist (git reads it as empty), in the worktree's temp folder."""
    return os.path.join(tmp_dir, f"index-kept-{secrets.token_hex(6)}")


def left_out(skipped: Iterable[str], paths: Sequence[str] | None) -> list[dict[str, str]]:
    """The capture's left-out paths (``CaptureStats.skipped``) within ``paths`` (None: all), as ``kept`` entries."""
    return [
        {"path": path, "reason": REASON_LEFT_OUT}
        for path in skipped
        if paths is None or path_matches(path.rstrip("/"), paths)
    ]
