"""Edit a git tree by paths, rewriting only the trees on the changed paths.

libgit2's ``Index.write_tree`` walks every entry once the index changed (1.1 s
for one changed file in a 200,000-file index here); a warm capture knows
exactly which paths changed, so it rebuilds only their ancestors: work in
proportion to the number of changes and the depth of the tree.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pygit2

from snapshotd.git import bodies, loose
from snapshotd.git.modes import MODE_TREE

if TYPE_CHECKING:
    from snapshotd.capture.userindex import UserIndex

MAX_EDIT_DEPTH = 400  # folder levels edit_tree takes (it recurses once a level)

# path -> (object id, mode) to put there, or None to remove whatever is there
Changes = Mapping[str, tuple[pygit2.Oid, int] | None]


def edit_tree(repo: pygit2.Repository, base: str | pygit2.Oid | None, changes: Changes) -> tuple[str, list[pygit2.Oid]]:
    """The tree ``base`` with ``changes`` applied, and the ids of the trees it wrote.

    Trees are read as bytes (no object per entry) and written by :mod:`snapshotd.git.loose`, which lets go
    of the interpreter's lock while the disk works (libgit2's tree builder keeps it).
    """
    base_id = None if base is None else pygit2.Oid(hex=base) if isinstance(base, str) else base
    written: list[pygit2.Oid] = []
    new = _edit(repo, base_id, changes, written)
    if new is None:
        new = loose.write_object(repo.path, "tree", b"", repo.odb)
        written.append(new)
    return str(new), written


def _edit(
    repo: pygit2.Repository, tree: pygit2.Oid | None, changes: Changes, written: list[pygit2.Oid]
) -> pygit2.Oid | None:
    """Apply ``changes`` (paths relative to ``tree``); None when the result is empty."""
    entries = bodies.tree_entries(_tree_body(repo, tree)) if tree is not None else {}
    inserts: dict[bytes, tuple[pygit2.Oid, int]] = {}
    below: dict[bytes, dict[str, tuple[pygit2.Oid, int] | None]] = defaultdict(dict)
    for path, value in changes.items():
        name, slash, rest = path.partition("/")
        key = name.encode("utf-8")
        if slash:
            below[key][rest] = value
        elif value is None:
            entries.pop(key, None)
        else:
            inserts[key] = value
    # Removals first, then folders, then files: so a file that became a folder
    # (or the other way round) ends up as what the changes say last.
    for key, sub_changes in below.items():
        existing = entries.get(key)
        is_tree = existing is not None and existing[0] == MODE_TREE
        subtree = pygit2.Oid(raw=existing[1]) if is_tree and existing is not None else None
        new = _edit(repo, subtree, sub_changes, written)
        if new is None:
            if is_tree:
                del entries[key]
        else:
            entries[key] = (MODE_TREE, new.raw)
    for key, (oid, mode) in inserts.items():
        entries[key] = (mode, oid.raw)
    if not entries:
        return None
    body = bodies.tree_body((name, mode, raw_id) for name, (mode, raw_id) in entries.items())
    # Not asked of the packs: on a miss libgit2 reads objects/pack again (seven calls, the interpreter's lock
    # held), and a tree packed already is a few hundred bytes written again, which the next packing drops.
    oid = loose.write_object(repo.path, "tree", body)
    _recent.put(oid.raw, body)
    written.append(oid)
    return oid


def _tree_body(repo: pygit2.Repository, tree: pygit2.Oid) -> bytes:
    """The body of the tree ``tree`` (a missing one raises pygit2's KeyError naming it).

    The next capture edits the trees the last one wrote (the folders an agent
    works in): their bodies are kept (:class:`RecentBodies`), where libgit2
    would open and inflate each one's file again, holding the interpreter's lock.
    The store is asked first, so a tree no longer there is not edited as if it were.
    """
    body = _recent.get(tree.raw)
    if body is not None and tree in repo.odb:
        return body
    kind, body = repo.odb.read(tree)
    if kind != pygit2.enums.ObjectType.TREE:
        raise pygit2.GitError(f"the object {tree} is a {kind.name.lower()}, where a tree was expected")
    _recent.put(tree.raw, body)
    return body


class RecentBodies:
    """Tree bodies by id, the most recently used kept up to :data:`RECENT_BODY_BYTES` in all (any thread)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.bodies: OrderedDict[bytes, bytes] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, raw_id: bytes) -> bytes | None:
        with self.lock:
            body = self.bodies.get(raw_id)
            if body is not None:
                self.bodies.move_to_end(raw_id)
            return body

    def put(self, raw_id: bytes, body: bytes) -> None:
        if len(body) > self.limit // 8:
            return
        with self.lock:
            if raw_id in self.bodies:
                self.bodies.move_to_end(raw_id)
                return
            self.bodies[raw_id] = body
            self.size += len(body)
            while self.size > self.limit:
                self.size -= len(self.bodies.popitem(last=False)[1])


RECENT_BODY_BYTES = 4 * 1024 * 1024  # every worktree's recent trees: a 100,000-file tree's root is about 40 KB
_recent = RecentBodies(RECENT_BODY_BYTES)


class RecordingIndex:
    """An index that notes every change, so its tree is edited along those paths only.

    ``write_tree`` edits the base tree (the last capture's, or the index's own
    before the capture changed it) instead of letting libgit2 walk every entry.
    ``user``, when given, keeps the user's entry of each path before it changes.
    """

    def __init__(self, index: pygit2.Index, base_tree: str, user: UserIndex | None = None) -> None:
        self.inner = index
        self._index = index._index  # for the binary searches in entries_under
        self.base_tree = base_tree
        self.user = user
        self.changes: dict[str, tuple[pygit2.Oid, int] | None] = {}
        self.trees_written: list[pygit2.Oid] = []

    def add(self, entry: pygit2.IndexEntry) -> None:
        path = str(entry.path)
        if self.user is not None:
            self.user.save_replaced(path)
        self.inner.add(entry)
        self.changes[path] = (entry.id, int(entry.mode))

    def remove(self, path: str) -> None:
        if self.user is not None:
            self.user.save(path)
        self.inner.remove(path)
        self.changes[path] = None

    def __getitem__(self, path: str) -> pygit2.IndexEntry:
        return self.inner[path]

    def __contains__(self, path: str) -> bool:
        return path in self.inner

    def __len__(self) -> int:
        return len(self.inner)

    def write_tree(self, repo: pygit2.Repository) -> str:
        if not self.changes:
            return self.base_tree
        if not all(_utf8(path) and path.count("/") < MAX_EDIT_DEPTH for path in self.changes):
            # The edit takes names as UTF-8 text only; the index takes any bytes. The edit
            # recurses once a folder level, so a chain of folders deeper than that goes to libgit2.
            with loose.written_elsewhere(repo.path):  # libgit2 writes these trees
                return str(self.inner.write_tree(repo))
        tree, self.trees_written = edit_tree(repo, self.base_tree, self.changes)
        return tree


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
