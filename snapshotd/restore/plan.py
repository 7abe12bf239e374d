"""Planning a restore or revert from trees, with a look at the disk for what no tree records.

``current_tree`` is a safety checkpoint taken just before, so it holds exactly
the non-ignored content of the worktree. Paths equal in the current tree and
the wanted tree are never touched (identical files keep their inode and
mtime); anything on disk that the current tree does not hold (ignored files,
untracked files over the size cap, ignored folders, symlinks nobody recorded)
is never written, deleted or followed, and a write that needs its spot is
skipped and reported as a conflict.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from snapshotd.git.modes import MODE_GITLINK, is_file_mode
from snapshotd.git.repository import Repository
from snapshotd.restore.trees import Entry, TreeIndex, walk_changes
from snapshotd.store.diff import load_tree

REASON_CHANGED = "changed since the checkpoint"
REASON_IN_THE_WAY = "a file no checkpoint holds (ignored, or left out of captures) is in the way"
REASON_OUTSIDE_SELECTION = "a file not part of this change is in the way"
REASON_SYMLINK = "a symlink stands where a folder is needed"
REASON_FILE = "a file stands where a folder is needed"
REASON_NESTED = "inside a nested repository"
REASON_NESTED_KEPT = "nested repository left in place"
REASON_NESTED_COMMIT = "nested repository not moved to another commit"
REASON_UNSAFE = "unsafe path refused"
REASON_CHANGED_ON_DISK = "changed on disk while restoring"


@dataclass
class Plan:
    """What a restore or revert will do.

    ``writes`` puts each entry at its path, ``deletes`` removes files, links and
    empty nested-repository folders (and then the folders they leave empty),
    ``conflicts`` lists what was left alone and why. ``chmod_only`` names the
    writes whose content is already on disk, so only the mode changes.
    ``expected`` holds, for each path written or deleted, what the safety
    checkpoint recorded there (None: nothing): a path that no longer holds it
    when its turn comes was changed by someone else, and is left alone.
    Applying never changes the plan: it returns a
    :class:`~snapshotd.restore.outcome.RestoreOutcome` of what it did.
    """

    writes: list[tuple[str, Entry]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    conflicts: list[dict[str, str]] = field(default_factory=list)
    chmod_only: set[str] = field(default_factory=set)
    expected: dict[str, Entry | None] = field(default_factory=dict)


def _kind(st_mode: int) -> str:
    """The kind of a file from its mode, as the disk view names it."""
    if stat.S_ISDIR(st_mode):
        return "dir"
    if stat.S_ISLNK(st_mode):
        return "link"
    if stat.S_ISREG(st_mode):
        return "file"
    return "other"


class _DiskView:
    """Lexical, non-following lstat of worktree paths, cached, for planning."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self._kinds: dict[str, str | None] = {}

    def kind(self, path: str) -> str | None:
        """Kind of the path ("dir", "file", "link", "other") or None when absent.

        Only called once every ancestor is known to be a real folder.
        """
        if path not in self._kinds:
            try:
                st = os.lstat(os.path.join(self.workdir, path))
            except (FileNotFoundError, NotADirectoryError):
                self._kinds[path] = None
            else:
                self._kinds[path] = _kind(st.st_mode)
        return self._kinds[path]

    def blocking_ancestor(self, path: str) -> tuple[str, str] | None:
        """The first ancestor of ``path`` that exists and is not a real folder."""
        parts = path.split("/")
        for depth in range(1, len(parts)):
            ancestor = "/".join(parts[:depth])
            kind = self.kind(ancestor)
            if kind is None:
                return None
            if kind != "dir":
                return ancestor, kind
        return None

    def leaves_under(self, folder: str) -> Iterator[tuple[str, str]]:
        """Every non-folder under a real folder (empty folders yield nothing)."""
        full = os.path.join(self.workdir, folder)
        try:
            names = sorted(os.listdir(full))
        except OSError:
            return
        for name in names:
            child = f"{folder}/{name}"
            kind = self.kind(child)
            if kind == "dir":
                yield from self.leaves_under(child)
            elif kind is not None:
                yield child, kind


def _build_plan(
    changes: Iterable[tuple[str, Entry | None, Entry | None]],
    current: TreeIndex,
    workdir: str,
    conflicts: list[dict[str, str]],
) -> Plan:
    """Turn wanted changes ``(path, current_entry, wanted_entry)`` into a safe plan."""
    disk = _DiskView(workdir)
    deletes: set[str] = set()
    writes: dict[str, Entry] = {}
    chmod_only: set[str] = set()
    refused: dict[str, str] = {}

    changes = list(changes)
    # First the removals (and the gitlinks that cannot be removed).
    for path, cur, want in changes:
        if cur is None:
            continue
        if cur.mode == MODE_GITLINK:
            if want is not None and want.mode == MODE_GITLINK:
                refused[path] = REASON_NESTED_COMMIT
                continue
            if _nonempty_folder(disk, path):
                refused[path] = REASON_NESTED_KEPT
                continue
            deletes.add(path)
        elif want is None or want.mode == MODE_GITLINK:
            deletes.add(path)

    for path, cur, want in changes:
        if want is None or path in refused:
            continue
        if (
            cur is not None
            and is_file_mode(cur.mode)
            and is_file_mode(want.mode)
            and cur.oid == want.oid
        ):
            chmod_only.add(path)
        reason = _write_blocker(path, want, cur, disk, current, deletes)
        if reason is not None:
            refused[path] = reason
            chmod_only.discard(path)
            continue
        writes[path] = want

    for path, reason in refused.items():
        conflicts.append({"path": path, "reason": reason})
    conflicts.sort(key=lambda c: c["path"])
    recorded = {path: cur for path, cur, _ in changes}
    return Plan(
        writes=sorted(writes.items()),
        deletes=sorted(deletes, key=lambda p: (-p.count("/"), p)),
        conflicts=conflicts,
        chmod_only=chmod_only,
        expected={path: recorded[path] for path in (*writes, *deletes)},
    )


def _nonempty_folder(disk: _DiskView, path: str) -> bool:
    """Whether ``path`` is a real folder (reached without symlinks) holding anything."""
    if disk.blocking_ancestor(path) is not None or disk.kind(path) != "dir":
        return False
    try:
        return bool(os.listdir(os.path.join(disk.workdir, path)))
    except OSError:
        return True


def _blocked_reason(path: str, current: TreeIndex) -> str:
    """Why a leaf under a folder in the way blocks a write: recorded but outside the change, or unrecorded."""
    return REASON_OUTSIDE_SELECTION if current.leaf(path) is not None else REASON_IN_THE_WAY


def _write_blocker(
    path: str,
    want: Entry,
    cur: Entry | None,
    disk: _DiskView,
    current: TreeIndex,
    deletes: set[str],
) -> str | None:
    """Why a write at ``path`` must be skipped, or None when its spot is free or ours."""
    parts = path.split("/")
    for depth in range(1, len(parts)):
        ancestor = "/".join(parts[:depth])
        kind = disk.kind(ancestor)
        if kind is None:
            return None  # the rest is created by the write
        recorded = current.leaf(ancestor)
        if kind == "dir":
            if recorded is not None and recorded.mode == MODE_GITLINK and ancestor not in deletes:
                return REASON_NESTED
            continue
        if ancestor in deletes and recorded is not None and recorded.mode != MODE_GITLINK:
            return None  # a recorded file or link that the plan removes first
        if recorded is not None:
            return REASON_OUTSIDE_SELECTION
        return REASON_SYMLINK if kind == "link" else REASON_IN_THE_WAY

    kind = disk.kind(path)
    if kind is None:
        return None
    if kind != "dir":
        if cur is not None and cur.mode != MODE_GITLINK:
            return None  # replaced atomically, or removed first for a gitlink
        if path in deletes:
            return None
        return REASON_IN_THE_WAY
    if want.mode == MODE_GITLINK:
        return None  # an existing folder is kept as it is
    # A folder stands where a file or link goes: it must hold nothing but what
    # the plan removes (and empty folders).
    for leaf, _ in disk.leaves_under(path):
        if leaf not in deletes:
            return _blocked_reason(leaf, current)
    return None


def _unsafe_conflicts(unsafe: list[str]) -> list[dict[str, str]]:
    """The conflicts of the names refused as unsafe to create."""
    return [{"path": path, "reason": REASON_UNSAFE} for path in unsafe]


def plan_restore(
    repo: Repository,
    current_tree: str,
    target_tree: str,
    paths: Sequence[str] | None,
    workdir: str,
) -> Plan:
    """Plan making the worktree under ``paths`` (None: all of it) equal ``target_tree``.

    ``current_tree`` is the safety checkpoint's tree, taken just before.
    """
    current = load_tree(repo, current_tree)
    target = load_tree(repo, target_tree)
    unsafe: list[str] = []
    changes = list(walk_changes(repo, current, target, paths, unsafe))
    return _build_plan(changes, TreeIndex(repo, current), workdir, _unsafe_conflicts(unsafe))


def plan_revert(
    repo: Repository,
    current_tree: str,
    from_tree: str,
    to_tree: str,
    paths: Sequence[str] | None,
    force: bool,
    workdir: str,
) -> Plan:
    """Plan undoing the changes from ``from_tree`` to ``to_tree`` under ``paths``.

    A path that still holds its ``to_tree`` content goes back to its
    ``from_tree`` content; one that already holds the ``from_tree`` content is
    left as is; any other is a conflict ("changed since the checkpoint") unless
    ``force``. No other path is touched.
    """
    current = load_tree(repo, current_tree)
    start = load_tree(repo, from_tree)
    end = load_tree(repo, to_tree)
    index = TreeIndex(repo, current)
    unsafe: list[str] = []
    conflicts: list[dict[str, str]] = []
    changes: list[tuple[str, Entry | None, Entry | None]] = []
    for path, before, after in walk_changes(repo, start, end, paths, unsafe):
        cur = index.leaf(path)
        if cur == before:
            continue
        if cur != after and not force:
            conflicts.append({"path": path, "reason": REASON_CHANGED})
            continue
        changes.append((path, cur, before))
    conflicts.extend(_unsafe_conflicts(unsafe))
    return _build_plan(changes, index, workdir, conflicts)

