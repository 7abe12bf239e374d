"""What a path the watcher hears of means: a worktree path to re-examine, a reason to scan in full, or nothing.

Events are hints: :func:`classify` turns the absolute path of one into the
worktree-relative path a capture re-examines, or into a reason for the next
capture to scan everything (the user's index, ignore or attribute rules, the
worktree folder itself). :func:`descend` says which folders a walk watches.
"""

from __future__ import annotations

import os

IGNORE_FILES = (".gitignore",)
ATTRIBUTES_FILE = ".gitattributes"  # line endings and filters: a change may give unchanged files new blobs
IGNORE_RULES, ATTRIBUTE_RULES = "ignore", "attributes"  # what rules an event names (:func:`classify`)


def is_ignore_rules(path: str) -> bool:
    """Whether ``path`` (worktree-relative) is a file of ignore rules that git reads in the worktree."""
    return path.rpartition("/")[2] in IGNORE_FILES


def classify(path: str, root: str, git_dir: str | None, reasons: set[str], changed: set[str]) -> str | None:
    """File one absolute ``path`` of the worktree ``root`` (or its git dir) into ``changed`` or ``reasons``;
    :data:`IGNORE_RULES` when it names ignore rules (or the configuration, which may name more),
    :data:`ATTRIBUTE_RULES` when it names attribute rules, else None."""
    if git_dir is not None and (path == git_dir or path.startswith(git_dir + os.sep)):
        rel_git = _relative(path, git_dir)
        if rel_git == "index":
            reasons.add("user index changed")
        elif rel_git in ("info/exclude", "config", "config.worktree", "info/sparse-checkout"):
            reasons.add("ignore rules or config changed")
            return IGNORE_RULES
        return None
    if path != root and not path.startswith(root + os.sep):
        return None
    rel = _relative(path, root)
    if rel == ".":
        reasons.add("worktree root changed")
        return None
    parts = rel.split(os.sep)
    rules: str | None = None
    if ".git" in parts:
        # Inside a nested repository's git dir: its checked-out commit (the gitlink) may have moved.
        at = parts.index(".git")
        if at == 0:
            return None
        rel = "/".join(parts[:at])
    else:
        rel = "/".join(parts)
        if parts[-1] in IGNORE_FILES:
            reasons.add("ignore rules changed")
            rules = IGNORE_RULES
        elif parts[-1] == ATTRIBUTES_FILE:
            reasons.add("attribute rules changed")
            rules = ATTRIBUTE_RULES
    changed.add(rel)
    return rules


def _relative(path: str, base: str) -> str:
    """``os.path.relpath(path, base)`` for a path at or under ``base``, cut off by slicing when that gives the same.

    relpath makes both absolute and normal first: a tenth of the daemon's time
    in a burst of events (a restore's 4,500 files), for paths the watcher
    builds plain. One with an empty, ``.`` or ``..`` part still goes to relpath.
    """
    if path == base:
        return "."
    rel = path[len(base if base.endswith(os.sep) else base + os.sep) :]
    if not os.path.isabs(path) or any(part in ("", ".", "..") for part in rel.split(os.sep)):
        return os.path.relpath(path, base)
    return rel


def descend(rel_parent: str, name: str) -> bool:
    """Whether a walk watches folder ``name`` under ``rel_parent`` (worktree-relative).

    The worktree's own git dir is watched apart (only what changes the
    rules); in a nested repository's git dir only ``refs`` matters, as it
    moves the gitlink.
    """
    if not rel_parent:
        return name != ".git"
    parts = rel_parent.split("/")
    if ".git" not in parts:
        return True
    return len(parts) > parts.index(".git") + 1 or name == "refs"
