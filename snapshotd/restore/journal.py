"""The restore journal: the temporary names an apply is about to create, and recovery after a crash.

Before a plan touches the worktree, every temporary name it will use, its
backup folder and its stage folder are written to a journal, atomically, and
made durable before the first of them is made. The journal stays locked (``flock``) while its writer lives, so
:func:`recover` never touches a restore in progress, and the kernel drops the
lock when the writer dies, so it never goes stale. Targets never need
repair: they are only ever replaced whole by a rename.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Iterator
from typing import Any

from snapshotd.errors import Untrusted
from snapshotd.fsutil import checked_private_folder, fsync_dir, open_private_folder, write_all
from snapshotd.git.flush import start_writeback
from snapshotd.restore.backups import remove_left_behind
from snapshotd.restore.fileops import remove_empty_folder, remove_temp, safe_name

_JOURNAL_SUFFIX = ".journal"
_JOURNAL_TEMP_PREFIX = ".journal-tmp-"
STAGE_PREFIX = "stage-"

def write_journal(
    journal_dir: str,
    token: str,
    workdir: str,
    temps: dict[str, str],
    stage: str | None,
    backups: str,
    prune: list[str],
) -> tuple[str, int]:
    """Record the temporary names about to be created, atomically; :func:`make_journal_durable` before the first is.

    Returns the journal's path and an open descriptor holding an exclusive
    ``flock`` on it: while the writer lives, :func:`recover` leaves the journal
    alone, and the kernel drops the lock when the writer dies, so it never goes
    stale. The lock is taken before the journal gets its final name. Its
    writeback is started here and waited for later: the safety checkpoint's
    flush in between, on a journaled file system, carries it along.
    """
    checked_private_folder(journal_dir)
    body = json.dumps(
        {
            "version": 1,
            "workdir": workdir,
            "pid": os.getpid(),
            "stage": stage,
            "backups": backups,
            "entries": [{"target": target, "temp": temp} for target, temp in temps.items()],
            "prune": prune,  # the folders its deletes may empty, deepest first (apply.folders_to_prune)
        }
    ).encode("ascii")
    final = os.path.join(journal_dir, f"apply-{token}{_JOURNAL_SUFFIX}")
    temp = os.path.join(journal_dir, f"{_JOURNAL_TEMP_PREFIX}{token}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        write_all(fd, body)
        start_writeback(fd)
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        os.close(fd)
        raise
    return final, fd


def make_journal_durable(journal_dir: str, fd: int) -> None:
    """Make the journal open as ``fd`` durable, under its final name: before the apply makes the first name it lists.

    Until then a crash leaves no temporary file of the apply's, so a journal
    lost with it names nothing left behind.
    """
    os.fsync(fd)
    fsync_dir(journal_dir)


def _journals(journal_dir: str) -> list[str]:
    """The names in the journal folder; none when it is missing or not snapshotd's own."""
    try:
        fd = open_private_folder(journal_dir, create=False)
    except (FileNotFoundError, NotADirectoryError, Untrusted):
        return []
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def _ours(recorded: str, workdir: str) -> bool:
    """Whether a journal that names ``recorded`` is ``workdir``'s: the same folder, or a folder that is gone
    (the worktree moved since: the journal folder is the worktree's own, wherever it went)."""
    if not recorded:
        return False
    try:
        return os.path.samefile(recorded, workdir)
    except FileNotFoundError:
        return not os.path.lexists(recorded) or os.path.abspath(recorded) == os.path.abspath(workdir)
    except OSError:
        return os.path.abspath(recorded) == os.path.abspath(workdir)


@contextlib.contextmanager
def _unless_locked(path: str) -> Iterator[int | None]:
    """Open ``path`` and take its lock; yield None when it is gone, not a regular file, or a live writer holds it.

    Opened without blocking: a FIFO planted in the journal folder must not hold the thread.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            yield None
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield None
            return
        yield fd
    finally:
        os.close(fd)


def _remove_stage(journal_dir: str, name: str | None) -> None:
    """Remove a stage folder named by a journal (only a plain folder carrying the stage prefix)."""
    if isinstance(name, str) and name.startswith(STAGE_PREFIX) and "/" not in name:
        full = os.path.join(journal_dir, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)


def recover(journal_dir: str, workdir: str) -> list[str]:
    """After a crash, remove the temporary files an interrupted apply left in ``workdir``.

    Reads every journal in ``journal_dir`` that names ``workdir``, removes the
    temporary files it lists (never a folder, never through a symlink, only
    names carrying the temporary prefix), then the folders its deletes may
    have emptied, where they are empty (as the apply would have), the folder of backups it kept of
    what it replaced in the journal folder (the safety checkpoint holds
    those), its staged content,
    and then the journal. A journal whose writer is still alive (it holds the journal's
    lock) is left alone, so opening a worktree while another process restores
    into it never disturbs that restore. Returns the worktree-relative paths
    removed. Targets never need repair: they are only ever replaced whole by a
    rename.
    """
    cleaned: list[str] = []
    names = _journals(journal_dir)
    for name in names:
        if name.startswith(_JOURNAL_TEMP_PREFIX):
            full = os.path.join(journal_dir, name)
            with _unless_locked(full) as fd, contextlib.suppress(OSError):
                if fd is not None:
                    os.unlink(full)
    journals = {n for n in names if n.endswith(_JOURNAL_SUFFIX)}
    for name in names:
        # Staged content is created after its (locked) journal and removed before it.
        if name.startswith(STAGE_PREFIX):
            token = name[len(STAGE_PREFIX) :]
            if f"apply-{token}{_JOURNAL_SUFFIX}" not in journals and not os.path.exists(
                os.path.join(journal_dir, f"apply-{token}{_JOURNAL_SUFFIX}")
            ):
                _remove_stage(journal_dir, name)
    if not journals:
        return cleaned
    try:
        root_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return cleaned
    try:
        for name in sorted(journals):
            full = os.path.join(journal_dir, name)
            with _unless_locked(full) as fd:
                if fd is None:
                    continue
                try:
                    with os.fdopen(os.dup(fd), "rb") as handle:
                        record: Any = json.loads(handle.read().decode("ascii"))
                except (OSError, ValueError):
                    continue
                if not isinstance(record, dict) or not _ours(str(record.get("workdir", "")), workdir):
                    continue
                for item in record.get("entries", []):
                    temp = item.get("temp") if isinstance(item, dict) else None
                    if isinstance(temp, str) and remove_temp(root_fd, temp):
                        cleaned.append(temp)
                for folder in record.get("prune", []):  # as the apply would have, had it got there
                    if isinstance(folder, str) and all(map(safe_name, folder.split("/"))):
                        remove_empty_folder(root_fd, folder)
                _remove_stage(journal_dir, record.get("stage"))
                remove_left_behind(journal_dir, record.get("backups"))
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(full)
    finally:
        os.close(root_fd)
    return sorted(cleaned)
