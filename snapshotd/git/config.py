"""Reading git configuration: a repository's values, and the user's own (protected) ones."""

from __future__ import annotations

import os
from typing import Protocol

import pygit2

from snapshotd.git.process import run_git_without_repository

PROTECTED_SCOPES = ("system", "global", "command")


class ConfigLookup(Protocol):
    """A repository's configuration by name: ``repo.config`` of either back-end."""

    def __getitem__(self, name: str) -> object: ...


def config_value(config: ConfigLookup, name: str) -> str | None:
    """The value of ``name`` as a repository's configuration resolves it (every level), or None.

    None also when the configuration cannot be read: a setting that cannot be
    read is treated as unset, as git itself does for a missing file.
    """
    try:
        return str(config[name])
    except (KeyError, ValueError, pygit2.GitError):
        return None


def protected_config_values(name: str) -> list[str]:
    """Every value of the multi-valued setting ``name`` in the user's own configuration, in git's order.

    Only what git calls protected configuration counts (system, global,
    command line), never a repository's file, so a repository cannot vouch for
    itself. Paths come expanded (``~/x``), as git reads them; git runs from
    ``/`` with no repository.
    """
    args = ["config", "--show-scope", "-z", "--type=path", "--includes", "--get-all", name]
    fields = run_git_without_repository(args, ok_codes=(0, 1)).split(b"\0")
    return [
        os.fsdecode(value)
        for scope, value in zip(fields[0::2], fields[1::2], strict=False)
        if scope.decode("ascii", "replace") in PROTECTED_SCOPES
    ]
