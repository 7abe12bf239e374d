"""A plan's writes: each file's content written and synced ahead, then every path put in place in order.

The content of a regular file is written to its temporary name (created
``O_EXCL`` in its folder, opened once by descriptor, never through a link)
and synced on a few threads (:mod:`.parallel`), ahead of the caller; the
caller then takes the paths in the plan's order, and for each checks that it
still holds what the safety checkpoint recorded, keeps what it replaces and
renames the temporary file over it (:meth:`Applier.write`). So the disk's
waits overlap, and every decision and every step a rollback undoes stays on
one thread, in order, as before.
"""

from __future__ import annotations

import contextlib
import os

from snapshotd.errors import PathBlocked
from snapshotd.git.modes import is_file_mode
from snapshotd.restore import fileops
from snapshotd.restore.apply import Applier, _fail
from snapshotd.restore.parallel import Ahead
from snapshotd.restore.trees import Entry


def write_planned(
    applier: Applier, writes: list[tuple[str, Entry]], temps: dict[str, str], links: dict[str, bytes]
) -> None:
    """Carry out ``writes`` in order through ``applier``; on a failure no temporary file is left, and it re-raises."""
    ahead = [(path, entry) for path, entry in writes if is_file_mode(entry.mode) and path not in applier.plan.chmod_only]
    runner = Ahead(len(ahead))
    submitted: list[str] = []
    waiting: set[str] = set()
    next_job = 0
    try:
        for path, entry in writes:
            while next_job < len(ahead) and (ahead[next_job][0] == path or (not runner.serial and runner.room())):
                if _start(applier, runner, *ahead[next_job], temps):
                    submitted.append(ahead[next_job][0])
                    waiting.add(ahead[next_job][0])
                next_job += 1
            if path in waiting:
                waiting.discard(path)
                try:
                    runner.wait()
                except OSError as exc:
                    raise _fail(path, exc) from exc
                applier.ready.add(path)
            applier.write(path, entry, temps.get(path), links.get(path))
    except BaseException:
        runner.drain()
        _remove_temps(applier, writes, temps)
        raise
    finally:
        runner.close()


def _start(applier: Applier, runner: Ahead, path: str, entry: Entry, temps: dict[str, str]) -> bool:
    """Start writing ``path``'s temporary file; False when its folder cannot be opened (its turn says why)."""
    parts = path.split("/")
    try:
        fd = applier.folder(tuple(parts[:-1]))
    except (OSError, PathBlocked):
        return False
    data = applier.stage.take(path, entry)
    temp = temps[path].rsplit("/", 1)[-1]
    mode, umask = entry.mode, applier.umask
    runner.submit(lambda: fileops.write_temp(fd, temp, parts[-1], data, mode, umask), len(data))
    return True


def _remove_temps(applier: Applier, writes: list[tuple[str, Entry]], temps: dict[str, str]) -> None:
    """Remove every temporary file not renamed into place, so a rollback can remove the folders it made."""
    for path, _ in writes:
        temp = temps.get(path)
        fd = applier.folders.get(tuple(path.split("/")[:-1]))
        if temp is not None and isinstance(fd, int):
            with contextlib.suppress(OSError):
                os.unlink(temp.rsplit("/", 1)[-1], dir_fd=fd)
