"""A plan's writes: each file's content written ahead, made durable, then every path put in place in order.

The content of a regular file is written to its temporary name (created
``O_EXCL`` in its folder, opened once by descriptor, never through a link).
A small restore writes and syncs each just before its turn; a big one writes
them all on a few threads (:mod:`.parallel`), unsynced, then makes them
durable with one barrier (:mod:`.barrier`: a ``syncfs``, not an ``fsync``
per file), and only then starts renaming. The caller takes the paths in the
plan's order, and for each checks that it still holds what the safety
checkpoint recorded, keeps what it replaces and renames the temporary file
over it (:meth:`Applier.write`): every decision and every step a rollback
undoes stays on one thread, in order, as before.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque

from snapshotd.errors import PathBlocked
from snapshotd.git.modes import is_file_mode
from snapshotd.restore import barrier, fileops
from snapshotd.restore.apply import Applier, _fail
from snapshotd.restore.parallel import Ahead
from snapshotd.restore.trees import Entry


def write_planned(
    applier: Applier, writes: list[tuple[str, Entry]], temps: dict[str, str], links: dict[str, bytes]
) -> None:
    """Carry out ``writes`` in order through ``applier``; on a failure no temporary file is left, and it re-raises."""
    ahead = [(path, entry) for path, entry in writes if is_file_mode(entry.mode) and path not in applier.plan.chmod_only]
    runner = Ahead(len(ahead))
    try:
        if runner.serial:
            _in_turn(applier, runner, writes, ahead, temps, links)
        else:
            _write_ahead(applier, runner, ahead, temps)
            for path, entry in writes:
                applier.write(path, entry, temps.get(path), links.get(path))
    except BaseException:
        runner.drain()
        _remove_temps(applier, writes, temps)
        raise
    finally:
        runner.close()


def _in_turn(
    applier: Applier,
    runner: Ahead,
    writes: list[tuple[str, Entry]],
    ahead: list[tuple[str, Entry]],
    temps: dict[str, str],
    links: dict[str, bytes],
) -> None:
    """A small restore: each file written and synced just before its turn, on the caller's thread."""
    jobs = iter(ahead)
    job = next(jobs, None)
    for path, entry in writes:
        if job is not None and job[0] == path:
            if _start(applier, runner, *job, temps, sync=True) is not None:
                _wait(runner, path)
                applier.ready.add(path)
            job = next(jobs, None)
        applier.write(path, entry, temps.get(path), links.get(path))


def _write_ahead(applier: Applier, runner: Ahead, ahead: list[tuple[str, Entry]], temps: dict[str, str]) -> None:
    """A big restore: every temporary file written on the runner's threads, then all made durable at once.

    Nothing is renamed before :func:`~.barrier.make_durable` returns, so a
    crash meanwhile leaves every target as it was and only temporary files,
    which the journal names, behind.
    """
    started: deque[str] = deque()
    written: list[tuple[str, int]] = []  # (path, its folder's descriptor)
    for path, entry in ahead:
        while not runner.room():
            _wait(runner, started.popleft())
        fd = _start(applier, runner, path, entry, temps, sync=False)
        if fd is not None:
            started.append(path)
            written.append((path, fd))
    while started:
        _wait(runner, started.popleft())
    try:
        barrier.make_durable((fd, temps[path].rsplit("/", 1)[-1]) for path, fd in written)
    except OSError as exc:
        raise _fail(written[0][0], exc) from exc
    applier.ready.update(path for path, _ in written)


def _wait(runner: Ahead, path: str) -> None:
    """Wait for the oldest job, ``path``'s; its disk error is ``path``'s."""
    try:
        runner.wait()
    except OSError as exc:
        raise _fail(path, exc) from exc


def _start(applier: Applier, runner: Ahead, path: str, entry: Entry, temps: dict[str, str], *, sync: bool) -> int | None:
    """Start writing ``path``'s temporary file; its folder's descriptor, or None when the folder cannot be
    opened (its turn says why)."""
    parts = path.split("/")
    try:
        fd = applier.folder(tuple(parts[:-1]))
    except (OSError, PathBlocked):
        return None
    data = applier.stage.take(path, entry)
    temp = temps[path].rsplit("/", 1)[-1]
    mode, umask = entry.mode, applier.umask
    runner.submit(lambda: fileops.write_temp(fd, temp, parts[-1], data, mode, umask, sync), len(data))
    return fd


def _remove_temps(applier: Applier, writes: list[tuple[str, Entry]], temps: dict[str, str]) -> None:
    """Remove every temporary file not renamed into place, so a rollback can remove the folders it made."""
    for path, _ in writes:
        temp = temps.get(path)
        fd = applier.folders.get(tuple(path.split("/")[:-1]))
        if temp is not None and isinstance(fd, int):
            with contextlib.suppress(OSError):
                os.unlink(temp.rsplit("/", 1)[-1], dir_fd=fd)
