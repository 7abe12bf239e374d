"""Whether git may convert a file's bytes between its blob and the worktree: the one rule.

git changes content on the way in (clean: ``git add``) and out (smudge:
``git checkout``) only through line-ending settings, attributes and the
filters attributes name. So content may differ from the blob only when one
of these applies: ``core.autocrlf`` (true or input), ``core.eol``, an
attributes file outside the worktree (``core.attributesFile`` or the user's
default, the repository's ``info/attributes``, the system's unless
``GIT_ATTR_NOSYSTEM``), or a ``.gitattributes`` in the worktree. The rule is
conservative: it says "may", and whoever gets True lets git do the work.
"""

from __future__ import annotations

import os

from snapshotd.git.config import ConfigLookup, config_value
from snapshotd.settings import git_config_home

__all__ = ["ATTRIBUTES_FILE", "SYSTEM_ATTRIBUTES", "attributes_files", "may_convert"]

ATTRIBUTES_FILE = ".gitattributes"
SYSTEM_ATTRIBUTES = "/etc/gitattributes"

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("", "false", "no", "off", "0")


def _config_value(config: ConfigLookup, name: str) -> str | None:
    """The value of ``name``, stripped; None when it is not set or cannot be read."""
    value = config_value(config, name)
    return None if value is None else value.strip()


def attributes_files(common_dir: str) -> list[str]:
    """The attributes files git reads outside the worktree when ``core.attributesFile`` is not set.

    Lowest priority first: the system's (unless ``GIT_ATTR_NOSYSTEM`` is
    true), the user's default ``$XDG_CONFIG_HOME/git/attributes`` and the
    repository's ``info/attributes`` under ``common_dir``.
    """
    files = []
    if os.environ.get("GIT_ATTR_NOSYSTEM", "").strip().lower() in _FALSE:
        files.append(SYSTEM_ATTRIBUTES)
    files.append(str(git_config_home() / "attributes"))
    files.append(os.path.join(common_dir, "info", "attributes"))
    return files


def may_convert(config: ConfigLookup, common_dir: str, *, worktree_attributes: bool = False) -> bool:
    """Whether git may record or check out a file's content other than as its blob holds it.

    ``common_dir`` is the repository's (shared) git folder, whose
    ``info/attributes`` applies; ``worktree_attributes`` says that a
    ``.gitattributes`` is in play in the worktree (the caller knows where it
    looks). A ``core.attributesFile`` that is set counts even if missing, as
    both directions of conversion have always treated it.
    """
    if worktree_attributes:
        return True
    autocrlf = (_config_value(config, "core.autocrlf") or "").lower()
    if autocrlf in (*_TRUE, "input"):
        return True
    if _config_value(config, "core.eol"):
        return True
    if _config_value(config, "core.attributesFile"):
        return True
    return any(os.path.isfile(path) for path in attributes_files(common_dir))
