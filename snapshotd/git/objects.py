"""The objects, references, object database and configuration of the git-command back-end.

These are the pygit2 shapes the store, diff and restore use (``repo[oid]``,
``tree[path]``, ``repo.references``, ``repo.odb``, ``repo.config``), built
from what git prints, with hex ids where pygit2 gives an ``Oid``. They reach
their repository only through :class:`ObjectSource`, so this module imports
nothing of :mod:`snapshotd.git.command`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from pygit2.enums import ObjectType

from snapshotd.git.modes import MODE_GITLINK, MODE_TREE

TYPES = {
    "commit": ObjectType.COMMIT,
    "tree": ObjectType.TREE,
    "blob": ObjectType.BLOB,
    "tag": ObjectType.TAG,
}
_TYPE_NAMES = {value: name for name, value in TYPES.items()}


class ObjectSource(Protocol):
    """What the objects here ask of their repository."""

    hex_length: int

    def __getitem__(self, oid: object) -> GitObject: ...
    def tree(self, oid: str) -> GitTree: ...
    def header(self, oid: str) -> tuple[str, int]: ...
    def resolve_ref(self, name: str) -> str | None: ...
    def ref_names(self, prefix: str = "") -> list[str]: ...
    def write_object(self, kind: str, data: bytes) -> str: ...
    def write_empty_tree(self) -> str: ...


def kind_name(kind: Any) -> str:
    """The type name for a pygit2 class (``pygit2.Tree``), an ObjectType or a name."""
    if isinstance(kind, str):
        return kind
    if isinstance(kind, int):
        return _TYPE_NAMES[ObjectType(kind)]
    return str(kind.__name__).lower()

    """The type name for a pygit2 class (``pygit2.Tree``), an ObjectType or a name."""
    if isinstance(kind, str):
        return kind
    if isinstance(kind, int):
        return _TYPE_NAMES[ObjectType(kind)]
    return str(kind.__name__).lower()


class GitObject:
    """An object read by git: its id (hex), type name and raw content."""

    type_str = ""

    def __init__(self, repo: ObjectSource, oid: str, data: bytes) -> None:
        self._repo = repo
        self.id = oid
        self.data = data

    @property
    def type(self) -> ObjectType:
        return TYPES[self.type_str]

    @property
    def size(self) -> int:
        return len(self.data)

    def peel(self, kind: Any) -> GitObject:
        """This object as ``kind`` (``pygit2.Tree``, ``"tree"``…): a commit peels to its tree."""
        name = kind_name(kind)
        if name == self.type_str:
            return self
        raise ValueError(f"the {self.type_str} {self.id} cannot be peeled to a {name}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"


class GitBlob(GitObject):
    type_str = "blob"


class GitTag(GitObject):
    type_str = "tag"


class GitCommit(GitObject):
    """A commit: ``tree_id``, ``parent_ids`` and ``message``, parsed from its headers."""

    type_str = "commit"

    def __init__(self, repo: ObjectSource, oid: str, data: bytes) -> None:
        super().__init__(repo, oid, data)
        head, _, body = data.partition(b"\n\n")
        tree = ""
        parents: list[str] = []
        encoding = "utf-8"
        for line in head.split(b"\n"):
            key, _, value = line.partition(b" ")
            if key == b"tree":
                tree = value.decode("ascii")
            elif key == b"parent":
                parents.append(value.decode("ascii"))
            elif key == b"encoding":
                encoding = value.decode("ascii", "replace")
        self.tree_id = tree
        self.parent_ids = parents
        try:
            self.message = body.decode(encoding, "replace")
        except LookupError:
            self.message = body.decode("utf-8", "replace")
        self.raw_message = body

    @property
    def tree(self) -> GitTree:
        return self._repo.tree(self.tree_id)

    def peel(self, kind: Any) -> GitObject:
        if kind_name(kind) == "tree":
            return self.tree
        return super().peel(kind)


@dataclass(frozen=True)
class GitTreeEntry:
    """One entry of a tree, as pygit2's tree items give it: name, id, mode and type name."""

    name: str
    id: str
    filemode: int
    type_str: str


class GitTree(GitObject):
    """A tree: iterable entries, ``tree[name]`` and ``tree["a/b/c"]`` as in pygit2."""

    type_str = "tree"

    def __init__(self, repo: ObjectSource, oid: str, data: bytes) -> None:
        super().__init__(repo, oid, data)
        raw_length = repo.hex_length // 2
        entries: list[GitTreeEntry] = []
        pos = 0
        while pos < len(data):
            space = data.index(b" ", pos)
            nul = data.index(b"\0", space)
            mode = int(data[pos:space], 8)
            name = os.fsdecode(data[space + 1 : nul])
            oid_hex = data[nul + 1 : nul + 1 + raw_length].hex()
            pos = nul + 1 + raw_length
            kind = "tree" if mode == MODE_TREE else "commit" if mode == MODE_GITLINK else "blob"
            entries.append(GitTreeEntry(name, oid_hex, mode, kind))
        self._entries = entries
        self._by_name = {entry.name: entry for entry in entries}

    def __iter__(self) -> Iterator[GitTreeEntry]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, path: object) -> bool:
        try:
            self[path]  # type: ignore[index]
        except (KeyError, TypeError):
            return False
        return True

    def __getitem__(self, key: int | str) -> GitTreeEntry:
        if isinstance(key, int):
            return self._entries[key]
        if not isinstance(key, str):
            raise TypeError(f"a tree is indexed by a position or a path, not {key!r}")
        name, _, rest = key.partition("/")
        entry = self._by_name.get(name)
        if entry is None:
            raise KeyError(key)
        if not rest:
            return entry
        if entry.filemode != MODE_TREE:
            raise KeyError(key)
        return self._repo.tree(entry.id)[rest]


CLASSES: dict[str, type[GitObject]] = {
    "commit": GitCommit,
    "tree": GitTree,
    "blob": GitBlob,
    "tag": GitTag,
}


# --------------------------------------------------------------------------- references, odb, config


@dataclass(frozen=True)
class GitReference:
    name: str
    target: str


class GitReferences:
    """``repo.references``: ``get(name)`` and iteration over names."""

    def __init__(self, repo: ObjectSource) -> None:
        self._repo = repo

    def get(self, name: str) -> GitReference | None:
        target = self._repo.resolve_ref(name)
        return None if target is None else GitReference(name, target)

    def __getitem__(self, name: str) -> GitReference:
        found = self.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._repo.ref_names())


class GitOdb:
    """``repo.odb``: object headers, presence and writes."""

    def __init__(self, repo: ObjectSource) -> None:
        self._repo = repo

    def read_header(self, oid: object) -> tuple[ObjectType, int]:
        kind, size = self._repo.header(str(oid))
        return TYPES[kind], size

    def read(self, oid: object) -> tuple[ObjectType, bytes]:
        """The object's type and raw content (pygit2's ``Odb.read``); KeyError when it is missing."""
        found = self._repo[oid]
        return found.type, found.data

    def __contains__(self, oid: object) -> bool:
        try:
            self._repo.header(str(oid))
        except (KeyError, ValueError):
            return False
        return True

    def write(self, kind: Any, data: bytes) -> str:
        return self._repo.write_object(kind_name(kind), data)


class GitConfig:
    """``repo.config`` as git resolves it (every level, includes), read once with ``git config -l``."""

    def __init__(self, listing: bytes) -> None:
        self._values: dict[str, str] = {}
        for item in listing.split(b"\0"):
            if not item:
                continue
            key, _, value = item.partition(b"\n")
            self._values[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")

    @staticmethod
    def _key(name: str) -> str:
        section, _, rest = name.partition(".")
        middle, _, key = rest.rpartition(".")
        return ".".join(part for part in (section.lower(), middle, key.lower()) if part)

    def __getitem__(self, name: str) -> str:
        return self._values[self._key(name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._key(name) in self._values

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(self._key(name), default)


class EmptyTreeBuilder:
    """``repo.TreeBuilder()`` for the one use the store has: writing the empty tree."""

    def __init__(self, repo: ObjectSource) -> None:
        self._repo = repo

    def write(self) -> str:
        return self._repo.write_empty_tree()
