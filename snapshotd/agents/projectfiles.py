"""A project's agent settings (``.claude/settings.json``, ``.codex/hooks.json``), reached only inside the project.

The project may be someone else's tree, or one another user can write to. Its
settings folder is opened from a descriptor of the project's root with
``O_NOFOLLOW``, and the file read and replaced relative to that folder's
descriptor, so a link planted as either (to ``~/.ssh``, to a credentials
file), even one swapped in between a check and a write, is never followed:
nothing of the user's is copied into the project, and nothing is written
outside it. A file that is not a regular one, or is larger than the limit, is
refused before it is read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from snapshotd.errors import InvalidParams, Untrusted
from snapshotd.fsutil import atomic_write_at

__all__ = ["read_file", "read_limited", "remove_file", "write_file"]

_OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _refused_link(path: Path) -> Untrusted:
    return Untrusted(
        f"{path} is a symlink; snapshotd edits a project's settings only inside the project, "
        "so replace the link with the file itself, or use --user.",
        path=str(path),
    )


def _open_folder(project: Path, folder: str, *, create: bool) -> int | None:
    """A descriptor on ``project/folder`` (each part made 0755 with ``create``); None when it does not exist.

    ``folder`` may have several parts (``.opencode/plugins``): each is opened from the one
    above it without following a link.
    """
    current = os.open(project, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    reached = project
    try:
        for part in folder.split("/"):
            reached = reached / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=current)
            try:
                below = os.open(part, _OPEN_FOLDER, dir_fd=current)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno == errno.ELOOP or (
                    exc.errno == errno.ENOTDIR and stat.S_ISLNK(os.stat(part, dir_fd=current, follow_symlinks=False).st_mode)
                ):
                    raise _refused_link(reached) from exc
                if exc.errno == errno.ENOTDIR:
                    raise InvalidParams(f"{reached} is not a folder; move it away, then try again.") from exc
                raise
            os.close(current)
            current = below
        found, current = current, -1
        return found
    finally:
        if current >= 0:
            os.close(current)


def read_limited(fd: int, path: Path, limit: int) -> str:
    """The UTF-8 text of the open regular file ``fd``, refused when larger than ``limit`` bytes."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise InvalidParams(f"{path} is not a regular file; move it away, then try again.")
    data = os.read(fd, limit + 1) if info.st_size <= limit else b""
    if info.st_size > limit or len(data) > limit:
        raise InvalidParams(
            f"{path} is larger than {limit >> 20} MiB, too large for a settings file; fix or move it, then try again."
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidParams(f"Cannot read {path} ({exc}).") from exc


def read_file(project: Path, folder: str, name: str, limit: int) -> str | None:
    """The text of ``project/folder/name``, or None when there is none; links refused, never followed."""
    path = project / folder / name
    folder_fd = _open_folder(project, folder, create=False)
    if folder_fd is None:
        return None
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refused_link(path) from exc
            raise InvalidParams(f"Cannot read {path} ({exc.strerror}).") from exc
        try:
            return read_limited(fd, path, limit)
        finally:
            os.close(fd)
    finally:
        os.close(folder_fd)


def write_file(project: Path, folder: str, name: str, data: bytes) -> None:
    """Replace ``project/folder/name`` with ``data`` atomically, keeping its mode (0644 for a new file)."""
    folder_fd = _open_folder(project, folder, create=True)
    assert folder_fd is not None
    try:
        try:
            info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        except FileNotFoundError:
            mode = 0o644
        else:
            if stat.S_ISLNK(info.st_mode):
                raise _refused_link(project / folder / name)
            mode = stat.S_IMODE(info.st_mode)
        atomic_write_at(folder_fd, name, data, mode)
    finally:
        os.close(folder_fd)


def remove_file(project: Path, folder: str, name: str) -> None:
    """Remove ``project/folder/name`` (never through a link), then each part of ``folder`` it leaves empty."""
    folder_fd = _open_folder(project, folder, create=False)
    if folder_fd is None:
        return
    try:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISLNK(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode):
                raise _refused_link(project / folder / name)
            os.unlink(name, dir_fd=folder_fd)
    finally:
        os.close(folder_fd)
    parts = folder.split("/")
    while parts:
        above = _open_folder(project, "/".join(parts[:-1]), create=False) if len(parts) > 1 else os.open(project, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if above is None:
            return
        try:
            os.rmdir(parts[-1], dir_fd=above)
        except OSError:  # not empty: it holds other things of the tool's
            return
        finally:
            os.close(above)
        parts.pop()
