"""A repository's object format ("sha1" or "sha256") and the length of its ids."""

from __future__ import annotations

import os

import pygit2

HEX_LENGTH = {"sha1": 40, "sha256": 64}


def object_format(common_dir: str) -> str:
    """The repository's object format ("sha1" or "sha256"), read from its config.

    libgit2 (pygit2) opens only SHA-1 repositories; for the others snapshotd
    works through git (see :mod:`snapshotd.git.repository`).
    """
    try:
        config = pygit2.Config(os.path.join(common_dir, "config"))
        value = config["extensions.objectformat"]
    except (KeyError, OSError, pygit2.GitError):
        return "sha1"
    return str(value).lower()
