"""When a file git's conversion may touch is still recorded as its bytes are: the check-in without git.

A repository with a ``.gitattributes`` (or ``core.autocrlf``, ``core.eol``)
has every changed file hashed by git (capture/checkin.py): one process per
capture, tens of milliseconds. But git's clean direction (convert.c,
``convert_to_git``) changes a file's bytes in four ways only: a ``filter``
driver, ``working-tree-encoding``, the end-of-line conversion, and ``ident``.
The end-of-line conversion only ever removes CR bytes, so a file without one
is recorded as it is unless some attributes file names one of the other three.

:func:`names_content_filters` looks for those three names, as bytes, in every
attributes file git reads for the worktree: a word in a comment or a pattern
counts too, and a file that cannot be read counts as naming them, so the
answer errs only towards asking git. It is read at each full scan, and a warm
capture keeps it: a change of a ``.gitattributes`` (capture/watchpaths.py), of
the configuration or attributes files outside the worktree, or of the user's
index (``warm.rule_sources``) makes the next capture a full scan.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

import pygit2

from snapshotd.capture.walker import Walker
from snapshotd.git.config import ConfigLookup, config_value

CONTENT_ATTRIBUTES = (b"filter", b"working-tree-encoding", b"ident")
"""Attribute names under which git's check-in may change a file's bytes other than its CR bytes."""


def names_content_filters(
    repo: pygit2.Repository,
    config: ConfigLookup,
    outside: Iterable[str],
    index: pygit2.Index,
    tracked: Iterable[str],
    on_disk: Iterable[str],
    walker: Walker,
) -> bool:
    """Whether an attributes file may give some file a filter, an encoding or ``ident``.

    ``repo``: the store, whose objects hold the user's index blobs; ``config``: the configuration git reads
    (capture/state.py's ``git_config``). ``outside``: the
    attributes files outside the worktree (a missing one counts for nothing);
    ``core.attributesFile`` is added when set. ``tracked``: the
    ``.gitattributes`` of the user's ``index``, whose blobs are read (what an
    unchanged file on disk holds, and what git reads where the file is gone);
    ``on_disk``: the worktree's ``.gitattributes`` the scan listed as changed
    or untracked, or the index flags, read through ``walker`` (never a link).
    """
    places = list(outside)
    configured = config_value(config, "core.attributesFile")
    if configured is not None:
        places.append(os.path.expanduser(configured.strip()))
    for place in places:
        try:
            with open(place, "rb") as handle:
                if _names_them(handle.read()):
                    return True
        except FileNotFoundError:
            continue
        except OSError:
            return True
    for path in tracked:
        try:
            oid = index[path].id
        except (KeyError, ValueError):  # in conflict: no entry of its own
            return True
        if _names_them(_blob(repo, oid)):
            return True
    for path in on_disk:
        data = _read(walker, path)
        if data is None or _names_them(data):
            return True
    return False


def _names_them(data: bytes) -> bool:
    return any(name in data for name in CONTENT_ATTRIBUTES)


def _blob(repo: pygit2.Repository, oid: pygit2.Oid) -> bytes:
    """A blob's bytes; one the store lacks counts as naming them all."""
    try:
        return repo.odb.read(oid)[1]
    except (KeyError, ValueError, pygit2.GitError):
        return CONTENT_ATTRIBUTES[0]


def _read(walker: Walker, path: str) -> bytes | None:
    """The bytes of the worktree file ``path``: b"" when nothing is there, None when it is not a regular file
    (a link: git's since 2.32 do not follow one, older ones did) or cannot be read."""
    st = walker.lstat(path)
    if st is None:
        return b""
    if not stat.S_ISREG(st.st_mode):
        return None
    fd = walker.open_file(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    except OSError:
        return None
    finally:
        os.close(fd)


class NotAsIs(Exception):
    """A file whose bytes git's conversion may change (a CR byte, or too large to look at once): git hashes it."""
