"""Reading checkpoint trees for a restore: their leaves, and the leaves that differ between two.

Trees are compared by id, so equal subtrees are never read. Names that could
not be created safely on disk are never yielded as changes: they are collected
for the plan to refuse.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import pygit2

from snapshotd.errors import NotFound
from snapshotd.git.modes import MODE_TREE
from snapshotd.git.repository import Repository
from snapshotd.paths import could_match_under, path_matches
from snapshotd.restore.fileops import safe_name
from snapshotd.store.diff import load_tree


@dataclass(frozen=True)
class Entry:
    """A blob, symlink or gitlink as a tree records it: object id (hex) and git mode."""

    oid: str
    mode: int


def _children(tree: pygit2.Tree | None) -> dict[str, tuple[int, str]]:
    """A tree's entries by name: (mode, id); none for no tree."""
    if tree is None:
        return {}
    return {str(entry.name): (entry.filemode, str(entry.id)) for entry in tree}


def _subtree(repo: Repository, oid: str) -> pygit2.Tree:
    """The tree ``oid``; NotFound when it is missing or not a tree."""
    try:
        tree = repo[oid]
    except (KeyError, ValueError) as exc:
        raise NotFound(f"The tree {oid} is missing from the repository.", oid=oid) from exc
    if getattr(tree, "type_str", None) != "tree":
        raise NotFound(f"The object {oid} is not a tree.", oid=oid)
    return cast(pygit2.Tree, tree)


def walk_changes(
    repo: Repository,
    old: pygit2.Tree | None,
    new: pygit2.Tree | None,
    paths: Sequence[str] | None,
    unsafe: list[str],
    prefix: str = "",
) -> Iterator[tuple[str, Entry | None, Entry | None]]:
    """Yield ``(path, old_entry, new_entry)`` for every leaf that differs.

    Subtrees with equal ids are skipped without reading them; a folder on one
    side and a leaf on the other yield every leaf of the folder. Names that are
    unsafe to create on disk are collected in ``unsafe`` instead.
    """
    a = _children(old)
    b = _children(new)
    for name in sorted(a.keys() | b.keys()):
        left = a.get(name)
        right = b.get(name)
        if left == right:
            continue
        path = f"{prefix}{name}"
        if not safe_name(name):
            if paths is None or path_matches(path, paths) or could_match_under(path, paths):
                unsafe.append(path)
            continue
        left_tree = left is not None and left[0] == MODE_TREE
        right_tree = right is not None and right[0] == MODE_TREE
        if (left_tree or right_tree) and (paths is None or could_match_under(path, paths)):
            yield from walk_changes(
                repo,
                _subtree(repo, left[1]) if left_tree and left else None,
                _subtree(repo, right[1]) if right_tree and right else None,
                paths,
                unsafe,
                path + "/",
            )
        old_leaf = Entry(left[1], left[0]) if left is not None and not left_tree else None
        new_leaf = Entry(right[1], right[0]) if right is not None and not right_tree else None
        if (old_leaf or new_leaf) and (paths is None or path_matches(path, paths)):
            yield path, old_leaf, new_leaf


def flatten_tree(repo: Repository, tree_hex: str | None) -> dict[str, Entry]:
    """Every blob, symlink and gitlink of a tree by path (None: the empty tree).

    Names that could not be created safely on disk (``.git`` in any case,
    ``..``) are left out, as a restore would refuse them.
    """
    tree = load_tree(repo, tree_hex)
    unsafe: list[str] = []
    return {
        path: entry
        for path, _, entry in walk_changes(repo, None, tree, None, unsafe)
        if entry is not None
    }


def _lookup(repo: Repository, tree: pygit2.Tree | None, path: str) -> Entry | None:
    """The leaf entry at ``path`` in ``tree``, or None (absent, or a folder)."""
    if tree is None:
        return None
    try:
        obj = tree[path]
    except (KeyError, ValueError, pygit2.GitError):
        return None
    if obj.filemode == MODE_TREE:
        return None
    return Entry(str(obj.id), obj.filemode)


class TreeIndex:
    """Cached path lookups in one tree: leaves and folders."""

    def __init__(self, repo: Repository, tree: pygit2.Tree | None) -> None:
        self._repo = repo
        self._tree = tree
        self._leaves: dict[str, Entry | None] = {}

    def leaf(self, path: str) -> Entry | None:
        """The leaf at ``path``, or None (absent, or a folder)."""
        if path not in self._leaves:
            self._leaves[path] = _lookup(self._repo, self._tree, path)
        return self._leaves[path]


def unmatched_paths(repo: Repository, trees: Sequence[str | None], paths: Sequence[str], workdir: str) -> list[str]:
    """The paths that name nothing in any of ``trees`` nor on disk (as ``git checkout -- nope`` refuses)."""
    loaded = [load_tree(repo, tree) for tree in trees]
    missing = []
    for path in paths:
        path = path.rstrip("/")
        if not path or os.path.lexists(os.path.join(workdir, path)):
            continue
        if not any(tree is not None and _in_tree(tree, path) for tree in loaded):
            missing.append(path)
    return missing


def _in_tree(tree: pygit2.Tree, path: str) -> bool:
    """Whether ``tree`` holds anything (leaf or folder) at ``path``."""
    try:
        tree[path]
    except (KeyError, ValueError, pygit2.GitError):
        return False
    return True

