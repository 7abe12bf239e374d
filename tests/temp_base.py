"""Where the tests make their repositories, sockets and homes: a fresh folder, short, with no git above it.

A repository (or any ``.git``) in a folder above the tests' temporary folder
(``/tmp/.git``, which any user can make) turns every plain folder a test
makes into part of that worktree, for git and snapshotd alike; a long
``TMPDIR`` makes socket paths longer than a Unix socket allows (107 bytes).
So the session's base folder is made fresh in the first of ``TMPDIR``,
``/tmp``, ``/var/tmp`` and ``/dev/shm`` that is short enough and has no
repository above it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# The longest socket path a test builds is its tmp_path (base, a name of at most
# 30 characters and a number) plus about 30 more; 107 bytes is the limit.
MAX_BASE_LENGTH = 40
CANDIDATES = ("/tmp", "/var/tmp", "/dev/shm")


def repository_above(folder: Path) -> Path | None:
    """The first folder from ``folder`` up that git would take for a repository (a ``.git``, or a bare one)."""
    for current in (folder, *folder.parents):
        if os.path.lexists(current / ".git"):
            return current / ".git"
        if (current / "objects").is_dir() and (current / "refs").is_dir() and (current / "HEAD").is_file():
            return current
    return None


def why_not(candidate: str) -> str | None:
    """Why ``candidate`` cannot hold the tests' base folder, or None when it can."""
    folder = Path(os.path.realpath(candidate))
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        return f"{candidate} is not a folder this user can write"
    found = repository_above(folder)
    if found is not None:
        return f"{candidate} lies under a git repository ({found})"
    if len(str(folder)) + len("/sd-12345678") > MAX_BASE_LENGTH:
        return f"{candidate} is too long a path for the sockets made under it"
    return None


def make_base() -> Path:
    """A fresh base folder for the session (mode 0711), in the first fit place; ValueError naming why none fits."""
    reasons = []
    for candidate in dict.fromkeys((tempfile.gettempdir(), *CANDIDATES)):
        reason = why_not(candidate)
        if reason is None:
            base = Path(tempfile.mkdtemp(prefix="sd-", dir=os.path.realpath(candidate)))
            # Others may pass through (not list it): the tests that act as another
            # user reach their shared folders and homes inside it.
            base.chmod(0o711)
            return base
        reasons.append(reason)
    raise ValueError(
        "no folder can hold the tests' repositories: " + "; ".join(reasons)
        + "; set TMPDIR to a short folder with no git repository above it"
    )
