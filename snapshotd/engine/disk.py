"""A disk's refusal during engine work (full, over quota, read-only, denied) as its one sentence."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pygit2

from snapshotd.errors import raise_disk_error


@contextlib.contextmanager
def disk_refusals(path: str, doing: str) -> Iterator[None]:
    """A full disk or a denied write in the block becomes :func:`~snapshotd.errors.filesystem_error`'s sentence."""
    try:
        yield
    except (OSError, pygit2.GitError) as exc:
        raise_disk_error(exc, path, doing)
        raise
