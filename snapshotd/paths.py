"""Worktree-relative paths: turning a client's path into a tree path, selecting by paths, quoting.

Everything here is lexical: symlinks are never resolved, so the answer depends
only on the strings, and a path is judged the same way whatever the disk holds
at the moment. Paths are posix strings relative to the worktree root; "" is the
root itself and selects everything.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator, Sequence

from snapshotd.errors import InvalidParams, PathOutsideWorktree

__all__ = [
    "could_match_under",
    "folders_above",
    "is_git_dir_name",
    "path_matches",
    "quote_path",
    "to_worktree_relative",
]


def is_git_dir_name(name: str) -> bool:
    """Whether a path component names a repository folder (git refuses any case of ``.git``)."""
    return name.lower() == ".git"


def _relative_to(root: str, path: str) -> str | None:
    """The lexical path of ``path`` under ``root`` (both absolute, normalized), or None."""
    rel = posixpath.relpath(path, root)
    if rel == ".." or rel.startswith("../"):
        return None
    return "" if rel == "." else rel


def _normalize_absolute(path: str) -> str:
    norm = posixpath.normpath(path)
    # POSIX keeps a leading "//"; treat it as "/".
    return "/" + norm.lstrip("/")


def to_worktree_relative(root: str, user_path: str) -> str:
    """Turn a path from a client into a normalized posix path relative to ``root``.

    ``user_path`` is absolute or relative to the worktree root. The result is
    "" for the root itself. Escapes (``..`` above the root, absolute paths
    elsewhere) and paths inside a ``.git`` folder raise PathOutsideWorktree;
    empty strings and NUL bytes raise InvalidParams. Symlinks are not resolved
    in ``user_path``; an absolute path is accepted under ``root`` as given or
    under the real path of ``root`` (the same folder reached another way).
    """
    if not isinstance(user_path, str) or user_path == "":
        raise InvalidParams("A path must be a non-empty string.", path=user_path)
    if "\0" in user_path:
        raise InvalidParams("A path may not contain a NUL byte.", path=user_path)
    if not isinstance(root, str) or root == "" or "\0" in root:
        raise InvalidParams("The worktree root must be a non-empty path.", path=root)

    if posixpath.isabs(user_path):
        target = _normalize_absolute(user_path)
        root_abs = _normalize_absolute(os.path.abspath(root))
        rel = _relative_to(root_abs, target)
        if rel is None:
            real_root = _normalize_absolute(os.path.realpath(root_abs))
            if real_root != root_abs:
                rel = _relative_to(real_root, target)
    else:
        norm = posixpath.normpath(user_path)
        rel = None if norm == ".." or norm.startswith("../") else ("" if norm == "." else norm)

    if rel is None:
        raise PathOutsideWorktree(
            f"The path {user_path!r} is outside the worktree {root}.", path=user_path
        )
    if rel and any(is_git_dir_name(part) for part in rel.split("/")):
        raise PathOutsideWorktree(
            f"The path {user_path!r} is inside a .git folder of the worktree {root}.",
            path=user_path,
        )
    return rel


def path_matches(path: str, prefixes: Sequence[str]) -> bool:
    """Whether the tree path ``path`` is selected by ``prefixes``.

    A prefix selects the path equal to it and everything under it as a folder;
    "" selects every path. An empty sequence selects nothing.
    """
    for prefix in prefixes:
        prefix = prefix.rstrip("/")
        if prefix == "" or path == prefix or path.startswith(prefix + "/"):
            return True
    return False


def could_match_under(folder: str, prefixes: Sequence[str]) -> bool:
    """Whether any path inside the tree folder ``folder`` can be selected by ``prefixes``.

    Used to skip whole subtrees that no prefix reaches.
    """
    if folder == "":
        return bool(prefixes)
    for prefix in prefixes:
        prefix = prefix.rstrip("/")
        if (
            prefix == ""
            or prefix == folder
            or prefix.startswith(folder + "/")
            or folder.startswith(prefix + "/")
        ):
            return True
    return False


def folders_above(path: str) -> Iterator[str]:
    """The folders that hold ``path``, outermost first ("a", "a/b" for "a/b/c")."""
    parts = path.split("/")
    for depth in range(1, len(parts)):
        yield "/".join(parts[:depth])


_C_ESCAPES = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r", 34: '\\"', 92: "\\\\"}


def quote_path(name: str) -> str:
    """A file name as git prints it with ``core.quotePath`` (its default): in quotes when it must be.

    A name holding a control character, a double quote, a backslash or any
    byte of 0x7f or more (UTF-8, or a name that is not UTF-8) is written in
    double quotes with C escapes and octal bytes, as ``git diff --name-status``
    writes it; any other name is written as it is.
    """
    raw = os.fsencode(name)
    if not any(byte < 0x20 or byte in (0x22, 0x5C) or byte >= 0x7F for byte in raw):
        return name
    body = "".join(
        _C_ESCAPES.get(byte) or (chr(byte) if 0x20 <= byte < 0x7F else f"\\{byte:03o}") for byte in raw
    )
    return f'"{body}"'
