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

import pygit2

from snapshotd.git.config import ConfigLookup, config_value
from snapshotd.settings import git_config_home

__all__ = ["ATTRIBUTES_FILE", "SYSTEM_ATTRIBUTES", "attributes_files", "autocrlf", "may_convert"]

ATTRIBUTES_FILE = ".gitattributes"
SYSTEM_ATTRIBUTES = "/etc/gitattributes"

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("", "false", "no", "off", "0")


def _config_value(config: ConfigLookup, name: str) -> str | None:
    """The value of ``name``, stripped; None when it is not set or cannot be read."""
    value = config_value(config, name)
    return None if value is None else value.strip()


def autocrlf(config: ConfigLookup) -> str | None:
    """``core.autocrlf`` as git reads it: "false" (also when unset), "true" or "input"; None for a value git
    refuses (it stops there) or that cannot be read."""
    try:
        value = config["core.autocrlf"]
    except KeyError:
        return "false"
    except (ValueError, pygit2.GitError):
        return None
    if value is not None and str(value).strip().lower() == "input":  # strcasecmp, before the boolean
        return "input"
    meaning = git_bool(None if value is None else str(value))
    return None if meaning is None else ("true" if meaning else "false")


def git_bool(value: str | None) -> bool | None:
    """A boolean setting's meaning as config.c's ``git_config_bool`` gives it; None where git refuses it.

    A name with no value is true, an empty value false, a number true unless
    0 (with a k, m or g unit); a number git would read but Python would not
    (``010``) counts as refused, which leaves the decision to git.
    """
    if value is None:
        return True
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    digits = text[:-1] if text[-1:] in ("k", "m", "g") else text
    if "_" in digits:
        return None
    try:
        return int(digits, 0) != 0
    except ValueError:
        return None


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
    if autocrlf(config) != "false":
        return True
    if _config_value(config, "core.eol"):
        return True
    if _config_value(config, "core.attributesFile"):
        return True
    return any(os.path.isfile(path) for path in attributes_files(common_dir))
