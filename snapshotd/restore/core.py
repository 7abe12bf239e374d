"""Planning and safely applying restore and revert.

A plan is computed from trees alone, plus a look at the disk for what no tree
records: ``current_tree`` is a safety checkpoint taken just before, so it holds
exactly the non-ignored content of the worktree. Paths equal in the current
tree and the wanted tree are never touched (identical files keep their inode
and mtime); anything on disk that the current tree does not hold (ignored
files, untracked files over the size cap, ignored folders, symlinks nobody
recorded) is never written, deleted or followed, and a write that needs its
spot is skipped and reported as a conflict.

Applying walks the worktree from a directory descriptor, one component at a
time with ``O_NOFOLLOW``, so no symlink is ever followed and nothing outside the
worktree is written or removed (a file with other hard links is replaced, never
changed in place). Each file is written to a temporary name in its folder,
synced and renamed over the target, and every temporary name is listed
beforehand in a journal so that :func:`recover` can remove leftovers after a
crash: no half-written file ever sits under a real name. The journal stays
locked while its writer lives, so recovery never touches a restore in progress.

Files are written as ``git checkout`` writes them: where line-ending settings,
attributes or filters may apply, git prepares their content (before anything is
touched) from the blobs and the ``.gitattributes`` the worktree will hold.

``repo`` is a ``pygit2.Repository`` or, for a repository libgit2 cannot open
(SHA-256), a :class:`~snapshotd.git.repository.GitRepository` offering the same calls.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pygit2

from snapshotd.errors import (
    InternalError,
    InvalidParams,
    NotADirectory,
    NotFound,
    SnapshotdError,
    Untrusted,
    filesystem_error,
)
from snapshotd.fsutil import checked_private_folder, open_private_folder
from snapshotd.git.modes import (
    MODE_FILE,
    MODE_GITLINK,
    MODE_LINK,
    MODE_TREE,
    is_file_mode,
)
from snapshotd.git.process import GitTarget, run_git_sync
from snapshotd.git.repository import GitRepository, Repository
from snapshotd.paths import could_match_under, is_git_dir_name, path_matches
from snapshotd.settings import git_config_home
from snapshotd.store.diff import load_tree

__all__ = [
    "TEMP_PREFIX",
    "Entry",
    "GitCheckout",
    "Plan",
    "PreparedPlan",
    "apply_plan",
    "flatten_tree",
    "plan_restore",
    "plan_revert",
    "prepared_plan",
    "recover",
    "unmatched_paths",
]

TEMP_PREFIX = ".snapshotd-tmp-"
_JOURNAL_SUFFIX = ".journal"
_JOURNAL_TEMP_PREFIX = ".journal-tmp-"
_STAGE_PREFIX = "stage-"
_ATTRIBUTES = ".gitattributes"


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

REASON_CHANGED = "changed since the checkpoint"
REASON_IN_THE_WAY = "ignored or untracked file in the way"
REASON_OUTSIDE_SELECTION = "a file not part of this change is in the way"
REASON_SYMLINK = "a symlink stands where a folder is needed"
REASON_FILE = "a file stands where a folder is needed"
REASON_NESTED = "inside a nested repository"
REASON_NESTED_KEPT = "nested repository left in place"
REASON_NESTED_COMMIT = "nested repository not moved to another commit"
REASON_UNSAFE = "unsafe path refused"
REASON_CHANGED_ON_DISK = "changed on disk while restoring"


@dataclass(frozen=True)
class Entry:
    """A blob, symlink or gitlink as a tree records it: object id (hex) and git mode."""

    oid: str
    mode: int


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
    :func:`apply_plan` updates the plan to what it actually did.
    """

    writes: list[tuple[str, Entry]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    conflicts: list[dict[str, str]] = field(default_factory=list)
    chmod_only: set[str] = field(default_factory=set)
    expected: dict[str, Entry | None] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# trees


def _safe_name(name: str) -> bool:
    return (
        name not in ("", ".", "..")
        and "/" not in name
        and "\0" not in name
        and not is_git_dir_name(name)
    )


def _children(tree: pygit2.Tree | None) -> dict[str, tuple[int, str]]:
    if tree is None:
        return {}
    return {entry.name: (entry.filemode, str(entry.id)) for entry in tree}


def _subtree(repo: Repository, oid: str) -> pygit2.Tree:
    try:
        tree = repo[oid]
    except (KeyError, ValueError) as exc:
        raise NotFound(f"The tree {oid} is missing from the repository.", oid=oid) from exc
    if getattr(tree, "type_str", None) != "tree":
        raise NotFound(f"The object {oid} is not a tree.", oid=oid)
    return tree


def _walk_changes(
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
        if not _safe_name(name):
            if paths is None or path_matches(path, paths) or could_match_under(path, paths):
                unsafe.append(path)
            continue
        left_tree = left is not None and left[0] == MODE_TREE
        right_tree = right is not None and right[0] == MODE_TREE
        if (left_tree or right_tree) and (paths is None or could_match_under(path, paths)):
            yield from _walk_changes(
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
        for path, _, entry in _walk_changes(repo, None, tree, None, unsafe)
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


class _TreeIndex:
    """Cached path lookups in one tree: leaves and folders."""

    def __init__(self, repo: Repository, tree: pygit2.Tree | None) -> None:
        self._repo = repo
        self._tree = tree
        self._leaves: dict[str, Entry | None] = {}

    def leaf(self, path: str) -> Entry | None:
        if path not in self._leaves:
            self._leaves[path] = _lookup(self._repo, self._tree, path)
        return self._leaves[path]


# ---------------------------------------------------------------------------
# looking at the disk while planning (never following a symlink)


def _kind(st_mode: int) -> str:
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


# ---------------------------------------------------------------------------
# planning


def _build_plan(
    changes: Iterable[tuple[str, Entry | None, Entry | None]],
    current: _TreeIndex,
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


def _blocked_reason(path: str, current: _TreeIndex) -> str:
    return REASON_OUTSIDE_SELECTION if current.leaf(path) is not None else REASON_IN_THE_WAY


def _write_blocker(
    path: str,
    want: Entry,
    cur: Entry | None,
    disk: _DiskView,
    current: _TreeIndex,
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
    return [{"path": path, "reason": REASON_UNSAFE} for path in unsafe]


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
    try:
        tree[path]
    except (KeyError, ValueError, pygit2.GitError):
        return False
    return True


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
    changes = list(_walk_changes(repo, current, target, paths, unsafe))
    return _build_plan(changes, _TreeIndex(repo, current), workdir, _unsafe_conflicts(unsafe))


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
    index = _TreeIndex(repo, current)
    unsafe: list[str] = []
    conflicts: list[dict[str, str]] = []
    changes: list[tuple[str, Entry | None, Entry | None]] = []
    for path, before, after in _walk_changes(repo, start, end, paths, unsafe):
        cur = index.leaf(path)
        if cur == before:
            continue
        if cur != after and not force:
            conflicts.append({"path": path, "reason": REASON_CHANGED})
            continue
        changes.append((path, cur, before))
    conflicts.extend(_unsafe_conflicts(unsafe))
    return _build_plan(changes, index, workdir, conflicts)


# ---------------------------------------------------------------------------
# applying


class _Blocked(Exception):
    """A path component is not a real folder (a symlink or a file)."""

    def __init__(self, path: str, is_link: bool) -> None:
        super().__init__(path)
        self.path = path
        self.reason = REASON_SYMLINK if is_link else REASON_FILE


def _blocked(dir_fd: int, name: str, path: str) -> _Blocked:
    try:
        is_link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        is_link = False
    return _Blocked(path, is_link)


def _split(path: str) -> list[str]:
    parts = path.split("/")
    if not all(_safe_name(part) for part in parts):
        raise InvalidParams(f"The path {path!r} is not a safe worktree path.", path=path)
    return parts


def _open_dir(root_fd: int, parts: Sequence[str], *, create: bool, created: list[str] | None = None) -> int:
    """Open the folder ``parts`` under ``root_fd``, never following a symlink.

    Missing folders are created when ``create`` (and their paths appended to
    ``created``); a component that is not a real folder raises _Blocked, a
    missing one FileNotFoundError (unless created).
    """
    fd = os.dup(root_fd)
    try:
        for depth, name in enumerate(parts):
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                    if created is not None:
                        created.append("/".join(parts[: depth + 1]))
                except FileExistsError:
                    pass
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _blocked(fd, name, "/".join(parts[: depth + 1])) from exc
                    raise
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _blocked(fd, name, "/".join(parts[: depth + 1])) from exc
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_umask() -> int:
    """The process umask, read without changing it (os.umask is not thread-safe)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _file_permissions(mode: int, existing: os.stat_result | None, umask: int) -> int:
    """Permission bits for a file of git ``mode``: the old file's, with the exec bits as recorded."""
    executable = bool(mode & 0o100)
    if existing is not None and stat.S_ISREG(existing.st_mode):
        perm = stat.S_IMODE(existing.st_mode) & 0o777
    else:
        perm = (0o777 if executable else 0o666) & ~umask
    if executable:
        return perm | ((perm & 0o444) >> 2)
    return perm & ~0o111


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove_empty_tree(dir_fd: int, name: str) -> bool:
    """Remove a folder that holds nothing but empty folders; False if anything else is in it."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        for child in os.listdir(fd):
            st = _lstat_at(fd, child)
            if st is None:
                continue
            if not stat.S_ISDIR(st.st_mode) or not _remove_empty_tree(fd, child):
                return False
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True


def _fsync_dir(root_fd: int, parts: Sequence[str]) -> None:
    try:
        fd = _open_dir(root_fd, parts, create=False)
    except (OSError, _Blocked):
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fail(path: str, exc: OSError) -> SnapshotdError:
    return filesystem_error(exc, path, "write", " in the worktree")


def _blob_id(data: bytes, like: str) -> str:
    """The git blob id of ``data``, in the object format of the id ``like`` (SHA-1 or SHA-256)."""
    digest = hashlib.sha256 if len(like) == 64 else hashlib.sha1
    return digest(b"blob %d\0" % len(data) + data).hexdigest()


def _read_at(dir_fd: int, name: str) -> bytes | None:
    """A regular file's bytes (never through a symlink, never blocking on a FIFO), or None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


def _validate(repo: Repository, plan: Plan) -> dict[str, bytes]:
    """Check every path and object of the plan before anything is touched.

    Returns the link targets (small) by path. Raises NotFound for a missing or
    wrong object, InvalidParams for an unsafe path or an unknown mode.
    """
    links: dict[str, bytes] = {}
    for path in plan.deletes:
        _split(path)
    for path, entry in plan.writes:
        _split(path)
        if entry.mode == MODE_GITLINK:
            continue
        if not (is_file_mode(entry.mode) or entry.mode == MODE_LINK):
            raise InvalidParams(f"Cannot write {path!r} with mode {entry.mode:06o}.", path=path)
        try:
            kind, _ = repo.odb.read_header(entry.oid)
        except (KeyError, ValueError, pygit2.GitError) as exc:
            raise NotFound(
                f"The object {entry.oid} for {path!r} is not in the repository.",
                oid=entry.oid,
                path=path,
            ) from exc
        if kind != pygit2.enums.ObjectType.BLOB:
            raise NotFound(f"The object {entry.oid} for {path!r} is not a blob.", oid=entry.oid)
        if entry.mode == MODE_LINK:
            target = repo[entry.oid].data
            if not target or b"\0" in target:
                raise InvalidParams(f"The symlink {path!r} has an invalid target.", path=path)
            links[path] = target
    return links


def _write_journal(
    journal_dir: str, token: str, workdir: str, temps: dict[str, str], stage: str | None, backups: str
) -> tuple[str, int]:
    """Record the temporary names about to be created; written atomically and synced.

    Returns the journal's path and an open descriptor holding an exclusive
    ``flock`` on it: while the writer lives, :func:`recover` leaves the journal
    alone, and the kernel drops the lock when the writer dies, so it never goes
    stale. The lock is taken before the journal gets its final name.
    """
    checked_private_folder(journal_dir)
    body = json.dumps(
        {
            "version": 1,
            "workdir": workdir,
            "pid": os.getpid(),
            "stage": stage,
            "backups": backups,
            "entries": [{"target": target, "temp": temp} for target, temp in temps.items()],
        }
    ).encode("ascii")
    final = os.path.join(journal_dir, f"apply-{token}{_JOURNAL_SUFFIX}")
    temp = os.path.join(journal_dir, f"{_JOURNAL_TEMP_PREFIX}{token}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _write_all(fd, body)
        os.fsync(fd)
        os.replace(temp, final)
        dir_fd = os.open(journal_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        os.close(fd)
        raise
    return final, fd


def _remove_temp(root_fd: int, temp: str) -> bool:
    """Remove a leftover temporary file (never a folder, never through a symlink)."""
    parts = temp.split("/")
    if not parts[-1].startswith(TEMP_PREFIX) or not all(_safe_name(p) for p in parts):
        return False
    try:
        fd = _open_dir(root_fd, parts[:-1], create=False)
    except (OSError, _Blocked):
        return False
    try:
        st = _lstat_at(fd, parts[-1])
        if st is None or stat.S_ISDIR(st.st_mode):
            return False
        os.unlink(parts[-1], dir_fd=fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class _Applier:
    """Carries out a plan path by path, keeping what it replaces so that a failure can be undone.

    Every file, link or empty folder the plan replaces or removes is first
    hard-linked (or copied, where the file system has no hard links) into a
    backup folder at the worktree's root, and every step is logged; on a
    failure :meth:`roll_back` undoes the steps newest first. Before touching a
    path it checks that the path still holds what the safety checkpoint
    recorded; one that was changed meanwhile is left alone as a conflict.
    """

    def __init__(self, repo: Repository, root_fd: int, plan: Plan, stage: _Stage, backups: str) -> None:
        self.repo = repo
        self.root_fd = root_fd
        self.plan = plan
        self.stage = stage
        self.umask = _read_umask()
        self.skipped: dict[str, str] = {}
        self.synced: set[tuple[str, ...]] = set()
        self.backups = backups
        self.backup_fd: int | None = None
        self.undo: list[tuple[str, str, Any]] = []
        self.slots = 0

    def skip(self, path: str, reason: str) -> None:
        self.skipped.setdefault(path, reason)

    def close(self) -> None:
        """Remove the backup folder (the plan is done or rolled back)."""
        if self.backup_fd is not None:
            os.close(self.backup_fd)
            self.backup_fd = None
        _remove_backups(self.root_fd, self.backups)

    # what is on disk --------------------------------------------------------

    def as_recorded(self, dir_fd: int, name: str, path: str) -> bool:
        """Whether ``path`` still holds what the safety checkpoint recorded there.

        Compared by kind and content (a file's bytes hashed as a blob, through
        git's clean filters when the raw bytes differ). A path the plan holds
        no record for (a hand-made plan) is not checked.
        """
        if path not in self.plan.expected:
            return True
        entry = self.plan.expected[path]
        st = _lstat_at(dir_fd, name)
        if st is None:
            return entry is None
        if entry is None:
            return stat.S_ISDIR(st.st_mode)  # a folder the plan may replace only if it is empty
        if entry.mode == MODE_GITLINK:
            return stat.S_ISDIR(st.st_mode)
        if entry.mode == MODE_LINK:
            return stat.S_ISLNK(st.st_mode) and os.fsencode(os.readlink(name, dir_fd=dir_fd)) == self.repo[entry.oid].data
        data = _read_at(dir_fd, name) if stat.S_ISREG(st.st_mode) else None
        if data is None:
            return False
        return _blob_id(data, entry.oid) == entry.oid or self.stage.clean_id(path, data) == entry.oid

    def stale(self) -> list[str]:
        """The planned paths that no longer hold what the safety checkpoint recorded."""
        found = []
        for path in (*self.plan.deletes, *(p for p, _ in self.plan.writes)):
            parts = path.split("/")
            try:
                fd = _open_dir(self.root_fd, parts[:-1], create=False)
            except FileNotFoundError:
                if self.plan.expected.get(path) is not None:
                    found.append(path)
                continue
            except (OSError, _Blocked):
                continue  # applying reports it
            try:
                if not self.as_recorded(fd, parts[-1], path):
                    found.append(path)
            finally:
                os.close(fd)
        return sorted(set(found))

    # undoing ------------------------------------------------------------------

    def _keep(self, dir_fd: int, name: str, path: str) -> None:
        """Put what stands at ``path`` aside in the backup folder, to put back on a failure."""
        if self.backup_fd is None:
            os.mkdir(self.backups, 0o700, dir_fd=self.root_fd)
            self.backup_fd = os.open(self.backups, _DIR_FLAGS, dir_fd=self.root_fd)
        self.slots += 1
        slot = str(self.slots)
        try:
            os.link(name, slot, src_dir_fd=dir_fd, dst_dir_fd=self.backup_fd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.EOPNOTSUPP):
                raise
            _copy_entry(dir_fd, name, self.backup_fd, slot)
        self.undo.append(("put_back", path, slot))

    def roll_back(self) -> list[str]:
        """Undo every step taken, newest first; returns the paths that could not be put back."""
        failed: set[str] = set()
        while self.undo:
            action, path, arg = self.undo.pop()
            try:
                self._undo_step(action, path, arg)
            except (OSError, _Blocked):
                failed.add(path)
        return sorted(failed)

    def _undo_step(self, action: str, path: str, arg: Any) -> None:
        parts = path.split("/")
        fd = _open_dir(self.root_fd, parts[:-1], create=action in ("put_back", "mkdir"))
        try:
            name = parts[-1]
            if action == "put_back":
                os.rename(arg, name, src_dir_fd=self.backup_fd, dst_dir_fd=fd)
            elif action == "remove":
                os.unlink(name, dir_fd=fd)
            elif action == "rmdir":
                os.rmdir(name, dir_fd=fd)
            elif action == "mkdir":
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
            elif action == "chmod":
                target = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
                try:
                    os.fchmod(target, arg)
                finally:
                    os.close(target)
        finally:
            os.close(fd)

    # deletes -------------------------------------------------------------

    def delete(self, path: str) -> None:
        parts = path.split("/")
        try:
            fd = _open_dir(self.root_fd, parts[:-1], create=False)
        except FileNotFoundError:
            return  # its folder is gone, so is it
        except _Blocked as blocked:
            self.skip(path, blocked.reason)
            return
        try:
            st = _lstat_at(fd, parts[-1])
            if st is None:
                return
            if not self.as_recorded(fd, parts[-1], path):
                self.skip(path, REASON_CHANGED_ON_DISK)
                return
            if stat.S_ISDIR(st.st_mode):
                # A nested repository's folder (or a race): only ever removed empty.
                try:
                    os.rmdir(parts[-1], dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                        self.skip(path, REASON_CHANGED_ON_DISK)
                        return
                    raise _fail(path, exc) from exc
                self.undo.append(("mkdir", path, None))
            else:
                self._keep(fd, parts[-1], path)
                os.unlink(parts[-1], dir_fd=fd)
            self.synced.add(tuple(parts[:-1]))
        except OSError as exc:
            raise _fail(path, exc) from exc
        finally:
            os.close(fd)

    def prune_folders(self, deleted: Iterable[str], keep: set[str]) -> None:
        """Remove folders the deletes left empty, deepest first, except those still needed."""
        folders: set[str] = set()
        for path in deleted:
            parts = path.split("/")
            for depth in range(1, len(parts)):
                folders.add("/".join(parts[:depth]))
        for folder in sorted(folders, key=lambda p: (-p.count("/"), p)):
            if folder in keep:
                continue
            parts = folder.split("/")
            try:
                fd = _open_dir(self.root_fd, parts[:-1], create=False)
            except (OSError, _Blocked):
                continue
            try:
                os.rmdir(parts[-1], dir_fd=fd)
                self.undo.append(("mkdir", folder, None))
                self.synced.add(tuple(parts[:-1]))
            except OSError:
                pass  # not empty, not a folder, or gone: left as it is
            finally:
                os.close(fd)

    # writes --------------------------------------------------------------

    def write(self, path: str, entry: Entry, temp: str | None, link: bytes | None) -> None:
        parts = path.split("/")
        name = parts[-1]
        created: list[str] = []
        try:
            fd = _open_dir(self.root_fd, parts[:-1], create=True, created=created)
        except _Blocked as blocked:
            self.skip(path, blocked.reason)
            return
        except OSError as exc:
            raise _fail(path, exc) from exc
        finally:
            self.undo.extend(("rmdir", folder, None) for folder in created)
        try:
            self._write_at(fd, path, name, entry, temp, link)
        except OSError as exc:
            raise _fail(path, exc) from exc
        finally:
            os.close(fd)
        self.synced.add(tuple(parts[:-1]))

    def _write_at(
        self, fd: int, path: str, name: str, entry: Entry, temp: str | None, link: bytes | None
    ) -> None:
        if not self.as_recorded(fd, name, path):
            self.skip(path, REASON_CHANGED_ON_DISK)
            return
        existing = _lstat_at(fd, name)
        if entry.mode == MODE_GITLINK:
            if existing is None:
                os.mkdir(name, 0o777, dir_fd=fd)
                self.undo.append(("rmdir", path, None))
            elif not stat.S_ISDIR(existing.st_mode):
                self.skip(path, REASON_CHANGED_ON_DISK)
            return
        if (
            path in self.plan.chmod_only
            and existing is not None
            and stat.S_ISREG(existing.st_mode)
            and self._chmod(fd, name, entry.mode, existing)
        ):
            self.undo.append(("chmod", path, stat.S_IMODE(existing.st_mode)))
            return
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            if not _remove_empty_tree(fd, name):
                self.skip(path, REASON_IN_THE_WAY)
                return
            self.undo.append(("mkdir", path, None))
            existing = None
        assert temp is not None
        tmp_name = temp.rsplit("/", 1)[-1]
        if entry.mode == MODE_LINK:
            assert link is not None
            os.symlink(link, os.fsencode(tmp_name), dir_fd=fd)
        else:
            data = self.stage.take(path, entry)
            out = os.open(
                tmp_name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=fd,
            )
            try:
                _write_all(out, data)
                os.fchmod(out, _file_permissions(entry.mode, existing, self.umask))
                os.fsync(out)
            finally:
                os.close(out)
        if existing is not None:
            self._keep(fd, name, path)
        try:
            os.rename(tmp_name, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name, dir_fd=fd)
            if existing is not None:
                self.undo.pop()  # nothing was replaced: its backup is not needed
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                self.skip(path, REASON_CHANGED_ON_DISK)
                return
            raise
        if existing is None:
            self.undo.append(("remove", path, None))

    def _chmod(self, dir_fd: int, name: str, mode: int, existing: os.stat_result) -> bool:
        """Change only the exec bits of the regular file there; False if it must be rewritten.

        A file with other hard links is rewritten instead: its inode may be
        shared with a file outside the worktree, whose mode must not change.
        """
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if (
                not stat.S_ISREG(st.st_mode)
                or st.st_nlink != 1
                or (st.st_dev, st.st_ino) != (existing.st_dev, existing.st_ino)
            ):
                return False
            os.fchmod(fd, _file_permissions(mode, st, self.umask))
            return True
        finally:
            os.close(fd)

    def sync(self) -> None:
        for parts in self.synced:
            _fsync_dir(self.root_fd, parts)


def _copy_entry(src_dir_fd: int, name: str, dst_dir_fd: int, slot: str) -> None:
    """Copy a file or symlink where it cannot be hard-linked (its bytes, link target and mode)."""
    st = os.stat(name, dir_fd=src_dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=src_dir_fd), slot, dir_fd=dst_dir_fd)
        return
    data = _read_at(src_dir_fd, name)
    if data is None:
        raise OSError(errno.EINVAL, "not a regular file", name)
    out = os.open(slot, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst_dir_fd)
    try:
        _write_all(out, data)
        os.fchmod(out, stat.S_IMODE(st.st_mode))
        os.fsync(out)
    finally:
        os.close(out)


def _remove_backups(root_fd: int, name: object) -> bool:
    """Remove a backup folder at the worktree's root (flat, only our files, never through a symlink).

    Returns whether there was one to remove.
    """
    if not isinstance(name, str) or not name.startswith(TEMP_PREFIX) or "/" in name:
        return False
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
    except OSError:
        return False
    try:
        for child in os.listdir(fd):
            with contextlib.suppress(OSError):
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=root_fd)
    return True


# ---------------------------------------------------------------------------
# file content as git checkout writes it


@dataclass(frozen=True)
class GitCheckout:
    """How to ask git for file content as ``git checkout`` would write it.

    Blobs hold content as git stores it; the worktree may hold something else
    (CRLF line endings with ``core.autocrlf`` or ``eol=crlf``, ``ident``,
    ``working-tree-encoding``, smudge filters such as LFS). When any of that can
    apply to a file being written, its content comes from ``git checkout-index``
    with the repository's configuration (read from ``git_dir``: the worktree's
    git dir, or a plain folder's store) and the ``.gitattributes`` files the
    worktree will hold once the plan is applied.
    """

    git_dir: str


def _config_value(repo: Repository, name: str) -> str | None:
    try:
        return str(repo.config[name])
    except (KeyError, ValueError, pygit2.GitError):
        return None


def _config_converts(repo: Repository) -> bool:
    """Whether the configuration alone may make checkout content differ from blobs."""
    autocrlf = (_config_value(repo, "core.autocrlf") or "").strip().lower()
    if autocrlf in ("true", "yes", "on", "1"):
        return True
    if _config_value(repo, "core.attributesFile") is not None:
        return True
    candidates = [
        os.path.join(repo.path, "info", "attributes"),
        str(git_config_home() / "attributes"),
        os.path.join(os.path.expanduser("~"), ".config", "git", "attributes"),
    ]
    if not os.environ.get("GIT_ATTR_NOSYSTEM"):
        candidates.append("/etc/gitattributes")
    return any(os.path.isfile(candidate) for candidate in candidates)


def _folders_of(path: str) -> list[str]:
    """Every folder from the root down to ``path``'s own ("" is the root)."""
    parts = path.split("/")
    return ["/".join(parts[:depth]) for depth in range(len(parts))]


def _attributes_path(folder: str) -> str:
    return f"{folder}/{_ATTRIBUTES}" if folder else _ATTRIBUTES


def _read_disk_file(root_fd: int, path: str) -> bytes | None:
    """A regular file's bytes, reached without following any symlink, or None."""
    parts = path.split("/")
    try:
        fd = _open_dir(root_fd, parts[:-1], create=False)
    except (OSError, _Blocked):
        return None
    try:
        return _read_at(fd, parts[-1])
    finally:
        os.close(fd)


class _GitIndex:
    """The stage's index where libgit2 cannot write one: entries go in with ``update-index --index-info``."""

    def __init__(self, path: str, git_dir: str) -> None:
        self.path = path
        self.git_dir = git_dir
        self.pending: list[tuple[str, Entry]] = []

    def add(self, path: str, entry: Entry) -> None:
        self.pending.append((path, entry))

    def write(self) -> None:
        if not self.pending:
            return
        listing = b"".join(
            f"{entry.mode:06o} {entry.oid}\t".encode() + os.fsencode(path) + b"\0" for path, entry in self.pending
        )
        run_git_sync(
            GitTarget(git_dir=self.git_dir, work_tree=None),
            ["update-index", "-z", "--add", "--index-info"],
            index_file=self.path,
            input=listing,
        )
        self.pending.clear()


class _Stage:
    """Checked-out content of the files a plan writes, prepared before anything is touched.

    Once :meth:`prepare` found that conversion may apply, a file that was not
    staged (a mode-only change that turns out to need a rewrite) is checked
    out on its own when asked for.
    """

    def __init__(self, repo: Repository, directory: str, checkout: GitCheckout | None, workdir: str) -> None:
        self.repo = repo
        self.directory = directory
        self.checkout = checkout
        self.workdir = workdir
        self.out = os.path.join(directory, "out")
        self.index_path = os.path.join(directory, "index")
        self.index: pygit2.Index | _GitIndex | None = None
        self.files: set[str] = set()
        self.rules_before: str | None = None

    def keep_attributes(self, root_fd: int, plan: Plan) -> None:
        """Copy the ``.gitattributes`` ruling the planned paths as they are now, when the plan changes one.

        Applying deletes and writes in path order, so a ``.gitattributes`` may
        be gone or rewritten before the files it rules are checked against
        the safety checkpoint; those were captured under the rules on disk
        now, so :meth:`clean_id` cleans them under this copy.
        """
        if self.checkout is None:
            return
        paths = [*plan.deletes, *(p for p, _ in plan.writes)]
        if not any(path.rpartition("/")[2] == _ATTRIBUTES for path in paths):
            return
        self.rules_before = os.path.join(self.directory, "rules-before")
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.mkdir(self.rules_before, mode=0o700)
        for folder in {folder for path in paths for folder in _folders_of(path)}:
            data = _read_disk_file(root_fd, _attributes_path(folder))
            if data is not None:
                os.makedirs(os.path.join(self.rules_before, folder), mode=0o700, exist_ok=True)
                with open(os.path.join(self.rules_before, _attributes_path(folder)), "wb") as handle:
                    handle.write(data)

    def prepare(self, root_fd: int, plan: Plan) -> None:
        """Have git check out every file the plan writes, if conversion may apply.

        Attributes are those the worktree will have once the plan is applied:
        each ``.gitattributes`` the plan writes, none where the plan deletes
        one, and the one on disk elsewhere. Nothing is run when neither the
        configuration nor any such file can change a file's content.
        """
        if self.checkout is None:
            return
        files = [(path, entry) for path, entry in plan.writes if is_file_mode(entry.mode)]
        if not files:
            return
        planned = dict(plan.writes)
        deleted = set(plan.deletes)
        attributes: dict[str, Entry] = {}
        for folder in {folder for path, _ in files for folder in _folders_of(path)}:
            name = _attributes_path(folder)
            if name in planned:
                if is_file_mode(planned[name].mode):
                    attributes[name] = planned[name]
                continue
            if name in deleted:
                continue
            data = _read_disk_file(root_fd, name)
            if data is not None:
                oid = self.repo.odb.write(pygit2.enums.ObjectType.BLOB, data)
                attributes[name] = Entry(str(oid), MODE_FILE)
        if not attributes and not _config_converts(self.repo):
            return
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.makedirs(os.path.join(self.directory, "wt"), mode=0o700)  # empty: attributes from the index
        os.makedirs(self.out, mode=0o700)
        if isinstance(self.repo, GitRepository):
            self.index = _GitIndex(self.index_path, self.checkout.git_dir)
        else:
            self.index = pygit2.Index(self.index_path)
        for path, entry in attributes.items():
            self._add(path, entry)
        # Mode-only changes keep their content on disk; they are checked out only if needed.
        self._check_out([(p, e) for p, e in files if p not in plan.chmod_only])

    def _check_out(self, files: list[tuple[str, Entry]]) -> None:
        assert self.index is not None and self.checkout is not None
        if not files:
            return
        for path, entry in files:
            self._add(path, entry)
        self.index.write()
        listing = b"".join(os.fsencode(path) + b"\0" for path, _ in files)
        run_git_sync(
            GitTarget(git_dir=self.checkout.git_dir, work_tree=os.path.join(self.directory, "wt")),
            ["checkout-index", "-f", "-z", "--stdin", f"--prefix={self.out}/"],
            index_file=self.index_path,
            input=listing,
        )
        self.files.update(path for path, _ in files)

    def _add(self, path: str, entry: Entry) -> None:
        if isinstance(self.index, _GitIndex):
            self.index.add(path, entry)
        elif self.index is not None:
            self.index.add(pygit2.IndexEntry(path, pygit2.Oid(hex=entry.oid), entry.mode))

    def clean_id(self, path: str, data: bytes) -> str | None:
        """The blob id git would record for ``data`` at ``path`` (clean filters, line endings), or None.

        Asked only when the raw bytes hash to another id, so a file that
        conversion cannot touch never costs a process. The attributes are
        those from before the plan was applied (see :meth:`keep_attributes`).
        """
        if self.checkout is None:
            return None
        out = run_git_sync(
            GitTarget(git_dir=self.checkout.git_dir, work_tree=self.rules_before or self.workdir),
            ["hash-object", "--stdin", f"--path={path}"],
            input=data,
        )
        return out.decode("ascii", "replace").strip()

    def take(self, path: str, entry: Entry) -> bytes:
        """The content to write at ``path``: as git checks it out, or the blob as it is."""
        if path not in self.files:
            if self.index is None:
                return self.repo[entry.oid].data
            self._check_out([(path, entry)])
        self.files.discard(path)
        full = os.path.join(self.out, path)
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InternalError(f"git did not check out {path!r} as a file.", path=path)
            with os.fdopen(fd, "rb", closefd=False) as handle:
                data = handle.read()
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(full)
        return data


class PreparedPlan:
    """A plan ready to apply: :meth:`stale` checks the disk against the safety checkpoint, :meth:`apply` applies."""

    def __init__(self, plan: Plan, applier: _Applier, temps: dict[str, str], links: dict[str, bytes]) -> None:
        self.plan = plan
        self._applier = applier
        self._temps = temps
        self._links = links

    def stale(self) -> list[str]:
        """The paths to touch that no longer hold what the safety checkpoint recorded."""
        return self._applier.stale()

    def apply(self) -> None:
        """Carry out the plan; on a failure put back everything done so far and re-raise.

        The error then says that nothing was changed, or names exactly the
        paths that could not be put back.
        """
        applier = self._applier
        try:
            for path in self.plan.deletes:
                applier.delete(path)
            keep: set[str] = set()
            for path, entry in self.plan.writes:
                parts = path.split("/")
                keep.update("/".join(parts[:depth]) for depth in range(1, len(parts)))
                if entry.mode == MODE_GITLINK:
                    keep.add(path)
            applier.prune_folders(self.plan.deletes, keep)
            for path, entry in self.plan.writes:
                applier.write(path, entry, self._temps.get(path), self._links.get(path))
            applier.sync()
        except SnapshotdError as exc:
            unrestored = applier.roll_back()
            if unrestored:
                raise type(exc)(
                    f"{exc.message} These paths could not be put back as they were (the safety checkpoint "
                    f"holds them): {', '.join(unrestored)}.",
                    **exc.data,
                    unrestored=unrestored,
                ) from exc
            raise type(exc)(f"{exc.message} Nothing was changed: every path already updated was put back.", **exc.data) from exc
        except BaseException:
            applier.roll_back()
            raise
        applier.undo.clear()


@contextlib.contextmanager
def prepared_plan(
    repo: Repository,
    workdir: str,
    plan: Plan,
    journal_dir: str,
    checkout: GitCheckout | None = None,
) -> Iterator[PreparedPlan]:
    """Get ready to carry out ``plan`` in ``workdir``.

    Everything that can fail without touching the worktree happens on entry:
    the whole plan is validated (NotFound for a missing object, InvalidParams
    for an unsafe path), the journal is written, and with ``checkout`` the
    content of every file is prepared as ``git checkout`` would write it (a
    failing filter raises GitError). So a caller can check the disk and record
    a safety checkpoint inside the block, knowing the plan is ready, and then
    apply. See :func:`apply_plan` for what applying does. Temporary files,
    backups, staged content and the journal are gone on exit, whatever happened.
    """
    links = _validate(repo, plan)
    try:
        root_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NotFound(f"The worktree {workdir} does not exist.", path=workdir) from exc
    except NotADirectoryError as exc:
        raise NotADirectory(f"The worktree {workdir} is not a folder.", path=workdir) from exc

    token = secrets.token_hex(8)
    stage = _Stage(repo, os.path.join(journal_dir, f"{_STAGE_PREFIX}{token}"), checkout, workdir)
    applier = _Applier(repo, root_fd, plan, stage, f"{TEMP_PREFIX}{token}")
    temps: dict[str, str] = {}
    for path, entry in plan.writes:
        if entry.mode != MODE_GITLINK:
            folder, _, _ = path.rpartition("/")
            temp_name = f"{TEMP_PREFIX}{secrets.token_hex(8)}"
            temps[path] = f"{folder}/{temp_name}" if folder else temp_name

    journal: str | None = None
    journal_fd: int | None = None
    try:
        if plan.writes or plan.deletes:
            try:
                journal, journal_fd = _write_journal(
                    journal_dir,
                    token,
                    os.path.abspath(workdir),
                    temps,
                    os.path.basename(stage.directory) if checkout is not None else None,
                    applier.backups,
                )
                stage.keep_attributes(root_fd, plan)
                stage.prepare(root_fd, plan)
            except OSError as exc:
                error = filesystem_error(exc, journal_dir, "prepare the restore in")
                raise type(error)(f"{error.message} Nothing was changed.", **error.data) from exc
        yield PreparedPlan(plan, applier, temps, links)
    finally:
        for temp in temps.values():
            _remove_temp(root_fd, temp)
        applier.close()
        shutil.rmtree(stage.directory, ignore_errors=True)
        if journal is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(journal)
        if journal_fd is not None:
            os.close(journal_fd)
        os.close(root_fd)
        if applier.skipped:
            plan.writes = [(p, e) for p, e in plan.writes if p not in applier.skipped]
            plan.deletes = [p for p in plan.deletes if p not in applier.skipped]
            plan.chmod_only -= applier.skipped.keys()
            known = {c["path"] for c in plan.conflicts}
            plan.conflicts.extend(
                {"path": p, "reason": r} for p, r in applier.skipped.items() if p not in known
            )
            plan.conflicts.sort(key=lambda c: c["path"])


def apply_plan(
    repo: Repository,
    workdir: str,
    plan: Plan,
    journal_dir: str,
    checkout: GitCheckout | None = None,
) -> None:
    """Carry out ``plan`` in ``workdir``: deletes (deepest first), then atomic writes.

    The whole plan is validated first (NotFound for a missing object,
    InvalidParams for an unsafe path), so a bad plan touches nothing. With
    ``checkout``, files are written as ``git checkout`` would write them (line
    endings, filters), their content prepared before anything is touched (a
    failing filter raises GitError and changes nothing). What turns out to be
    unsafe on disk while applying (a symlink or a foreign file where the plan
    expected otherwise) is skipped and moved from ``writes``/``deletes`` to
    ``conflicts``, as is a path that no longer holds what ``plan.expected``
    records (someone wrote it meanwhile), so the plan afterwards tells what
    was done. A filesystem error (FilesystemError for a full, read-only or
    forbidden disk) is raised after every step taken was undone; no temporary
    file or backup is left behind.
    """
    with prepared_plan(repo, workdir, plan, journal_dir, checkout) as prepared:
        prepared.apply()


def _journals(journal_dir: str) -> list[str]:
    """The names in the journal folder; none when it is missing or not snapshotd's own."""
    try:
        fd = open_private_folder(journal_dir, create=False)
    except (FileNotFoundError, NotADirectoryError, Untrusted):
        return []
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


@contextlib.contextmanager
def _unless_locked(path: str) -> Iterator[int | None]:
    """Open ``path`` and take its lock; yield None when it is gone or a live writer holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield None
            return
        yield fd
    finally:
        os.close(fd)


def _remove_stage(journal_dir: str, name: str | None) -> None:
    if isinstance(name, str) and name.startswith(_STAGE_PREFIX) and "/" not in name:
        full = os.path.join(journal_dir, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)


def recover(journal_dir: str, workdir: str) -> list[str]:
    """After a crash, remove the temporary files an interrupted apply left in ``workdir``.

    Reads every journal in ``journal_dir`` that names ``workdir``, removes the
    temporary files it lists (never a folder, never through a symlink, only
    names carrying the temporary prefix), the folder of backups it kept of
    what it replaced (the safety checkpoint holds those), its staged content,
    and then the journal. A journal whose writer is still alive (it holds the journal's
    lock) is left alone, so opening a worktree while another process restores
    into it never disturbs that restore. Returns the worktree-relative paths
    removed. Targets never need repair: they are only ever replaced whole by a
    rename.
    """
    cleaned: list[str] = []
    names = _journals(journal_dir)
    for name in names:
        if name.startswith(_JOURNAL_TEMP_PREFIX):
            full = os.path.join(journal_dir, name)
            with _unless_locked(full) as fd, contextlib.suppress(OSError):
                if fd is not None:
                    os.unlink(full)
    journals = {n for n in names if n.endswith(_JOURNAL_SUFFIX)}
    for name in names:
        # Staged content is created after its (locked) journal and removed before it.
        if name.startswith(_STAGE_PREFIX):
            token = name[len(_STAGE_PREFIX) :]
            if f"apply-{token}{_JOURNAL_SUFFIX}" not in journals and not os.path.exists(
                os.path.join(journal_dir, f"apply-{token}{_JOURNAL_SUFFIX}")
            ):
                _remove_stage(journal_dir, name)
    if not journals:
        return cleaned
    try:
        root_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return cleaned
    try:
        for name in sorted(journals):
            full = os.path.join(journal_dir, name)
            with _unless_locked(full) as fd:
                if fd is None:
                    continue
                try:
                    with os.fdopen(os.dup(fd), "rb") as handle:
                        record: Any = json.loads(handle.read().decode("ascii"))
                except (OSError, ValueError):
                    continue
                if not isinstance(record, dict) or not _same_folder(
                    str(record.get("workdir", "")), workdir
                ):
                    continue
                for item in record.get("entries", []):
                    temp = item.get("temp") if isinstance(item, dict) else None
                    if isinstance(temp, str) and _remove_temp(root_fd, temp):
                        cleaned.append(temp)
                _remove_stage(journal_dir, record.get("stage"))
                if _remove_backups(root_fd, record.get("backups")):
                    cleaned.append(record["backups"])
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(full)
    finally:
        os.close(root_fd)
    return sorted(cleaned)
