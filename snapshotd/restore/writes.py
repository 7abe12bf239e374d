"""A plan's writes: every file's content written ahead, made durable, then every path put in place in order.

The content of a regular file is written to its temporary name (created
``O_EXCL`` in its folder, opened once by descriptor, never through a link).
All of them are written first, unsynced, then made durable at once
(:mod:`.barrier`), and only then does renaming start. The caller takes the
paths in the plan's order, and for each checks that it still holds what the
safety checkpoint recorded, keeps what it replaces and renames the temporary
file over it (:meth:`Applier.write`): every decision and every step a
rollback undoes stays on one thread, in order.

The copies are written on the caller's thread, one after another: with no
sync to wait for, creating a file is the kernel's work, and threads creating
files in the same folders only queued on the folder's lock and the
interpreter's (measured with ``python -m bench.restore_cost``).
"""

from __future__ import annotations

import contextlib
import os

from snapshotd.errors import PathBlocked
from snapshotd.git.modes import is_file_mode
from snapshotd.restore import barrier, fileops
from snapshotd.restore.apply import Applier, _fail
from snapshotd.restore.trees import Entry


def write_planned(
    applier: Applier, writes: list[tuple[str, Entry]], temps: dict[str, str], links: dict[str, bytes]
) -> None:
    """Carry out ``writes`` in order through ``applier``; on a failure no temporary file is left, and it re-raises."""
    ahead = [(path, entry) for path, entry in writes if is_file_mode(entry.mode) and path not in applier.plan.chmod_only]
    try:
        _write_ahead(applier, ahead, temps)
        for path, entry in writes:
            applier.write(path, entry, temps.get(path), links.get(path))
    except BaseException:
        _remove_temps(applier, writes, temps)
        raise


def _write_ahead(applier: Applier, ahead: list[tuple[str, Entry]], temps: dict[str, str]) -> None:
    """Every temporary file written, then all made durable at once.

    Nothing is renamed before :func:`~.barrier.make_durable` returns, so a
    crash meanwhile leaves every target as it was and only temporary files,
    which the journal names, behind.
    """
    written: list[tuple[str, int]] = []  # (path, its folder's descriptor)
    for path, entry in ahead:
        fd = _write_copy(applier, path, entry, temps)
        if fd is not None:
            written.append((path, fd))
    try:
        barrier.make_durable((fd, temps[path].rsplit("/", 1)[-1]) for path, fd in written)
    except OSError as exc:
        raise _fail(written[0][0], exc) from exc
    applier.ready.update(path for path, _ in written)


def _write_copy(applier: Applier, path: str, entry: Entry, temps: dict[str, str]) -> int | None:
    """Write ``path``'s temporary file, unsynced; its folder's descriptor, or None when the folder cannot be
    opened (its turn says why)."""
    parts = path.split("/")
    try:
        fd = applier.folder(tuple(parts[:-1]))
    except (OSError, PathBlocked):
        return None
    data = applier.stage.take(path, entry)
    try:
        fileops.write_temp(fd, temps[path].rsplit("/", 1)[-1], parts[-1], data, entry.mode, applier.umask, sync=False)
    except OSError as exc:
        raise _fail(path, exc) from exc
    return fd


def _remove_temps(applier: Applier, writes: list[tuple[str, Entry]], temps: dict[str, str]) -> None:
    """Remove every temporary file not renamed into place, so a rollback can remove the folders it made."""
    for path, _ in writes:
        temp = temps.get(path)
        fd = applier.folders.get(tuple(path.split("/")[:-1]))
        if temp is not None and isinstance(fd, int):
            with contextlib.suppress(OSError):
                os.unlink(temp.rsplit("/", 1)[-1], dir_fd=fd)
