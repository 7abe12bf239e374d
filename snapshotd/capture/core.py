"""Tree capture: the worktree as ``git add -A && git write-tree`` would record it.

The cold path copies the user's index (keeping its mtime, which git's racy
check depends on) to a private ``GIT_INDEX_FILE`` and asks git once, with a
tagged ``ls-files``, which tracked paths changed, which were removed, which
entries are flagged assume-unchanged or skip-worktree, and which untracked
paths are not ignored. Only those paths are then hashed, in-process, and the
tree is written from an in-memory index with pygit2. Where libgit2 cannot
match git (split or sparse index, clean filters, CRLF conversion) git does
that part instead.

In a repository libgit2 cannot open (SHA-256) the whole capture is git's: the
same ``ls-files`` scan (also listing every index entry, for the flags), then
``update-index`` on a private index copy and ``write-tree``.

The phases follow jj's working copy: scan (git or the watcher names the
paths), process each path's file state, write the tree.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pygit2
import trio
from pygit2.errors import check_error

from snapshotd.capture.treeedit import RecordingIndex
from snapshotd.errors import GitError
from snapshotd.fsutil import checked_private_folder
from snapshotd.git.modes import MODE_EXEC, MODE_FILE, MODE_GITLINK, MODE_LINK
from snapshotd.git.process import GitTarget, run_git, run_git_sync
from snapshotd.git.repository import is_git_only
from snapshotd.settings import git_config_home
from snapshotd.store.identity import WorktreeInfo, object_format

LS_FILES = ["ls-files", "-z", "-v", "-m", "-d", "-o", "--exclude-standard"]
_INTERESTING = re.compile(rb"(?:^|\0)([^H\0]) ([^\0]*)")
_ATTRIBUTES = re.compile(rb"(?:^|\0). ((?:[^\0]*/)?\.gitattributes)(?=\0|$)")
# In index versions 2 and 3 a path ends in NUL and is preceded by '/' or by the
# binary flags field; version 4 compresses paths, so its entries are walked instead.
_INDEXED_ATTRIBUTES = re.compile(rb"(?:/|[\x00-\x1f\x80-\xff])\.gitattributes\0")
FLAG_ASSUME_VALID = 0x8000
FLAG_EXTENDED_SKIP_WORKTREE = 0x4000

STREAM_ABOVE = 32 * 1024 * 1024  # larger files are hashed by libgit2 straight from disk

thread_limiter = trio.CapacityLimiter(max(2, len(os.sched_getaffinity(0))))


@dataclass(frozen=True)
class FileState:
    """What lstat said when the content was hashed, and the fence it was hashed under."""

    mtime_ns: int
    ctime_ns: int
    size: int
    ino: int
    mode: int
    uid: int
    gid: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileState:
        return cls(st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode, st.st_uid, st.st_gid)


@dataclass
class CachedBlob:
    state: FileState
    fence_ns: int
    oid: pygit2.Oid | str  # hex where git hashed the file (repositories libgit2 cannot open)
    mode: int | None = None  # the git mode, where git chose it


@dataclass
class StatCache:
    """Hashes of files keyed by path; an entry counts only while its stat data match.

    An entry is trusted only if the file's mtime and ctime are strictly older
    than the fence (the mtime of a file this process wrote just before
    hashing), so a write in the same timestamp tick as the hash is never
    missed, even one that put the old mtime back.
    """

    entries: dict[str, CachedBlob] = field(default_factory=dict)
    rules: tuple | None = None  # the conversion rules the entries were hashed under

    def follow_rules(self, rules: tuple) -> None:
        """Forget every entry if the rules that turn a file's bytes into a blob changed since.

        A new ``*.sh text eol=lf`` gives an unchanged CRLF file another blob, so
        a hash is worth keeping only under the rules it was made with.
        """
        if rules != self.rules:
            self.entries.clear()
            self.rules = rules

    def lookup(self, path: str, st: os.stat_result) -> pygit2.Oid | None:
        cached = self.lookup_entry(path, st)
        return None if cached is None else cached.oid  # type: ignore[return-value]

    def lookup_entry(self, path: str, st: os.stat_result) -> CachedBlob | None:
        cached = self.entries.get(path)
        if cached is None:
            return None
        if cached.state != FileState.of(st) or max(st.st_mtime_ns, st.st_ctime_ns) >= cached.fence_ns:
            return None
        return cached

    def store(
        self, path: str, st: os.stat_result, fence_ns: int, oid: pygit2.Oid | str, mode: int | None = None
    ) -> None:
        self.entries[path] = CachedBlob(FileState.of(st), fence_ns, oid, mode)

    def forget(self, path: str) -> None:
        self.entries.pop(path, None)


SKIP_TOO_LARGE = "larger than the size cap for untracked files"
SKIP_SPECIAL = "not a file, link or folder (a FIFO, socket or device), which git cannot add"
SKIP_NO_COMMIT = "a nested repository with no commit yet"


@dataclass(frozen=True)
class Skip:
    """Why a path on disk was left out of a capture."""

    reason: str
    size: int | None = None
    cap: int | None = None

    def to_wire(self, path: str) -> dict:
        wire: dict = {"path": path, "reason": self.reason}
        if self.size is not None:
            wire["size"] = self.size
        if self.cap is not None:
            wire["cap"] = self.cap
        return wire


@dataclass
class CaptureStats:
    ms: float = 0.0
    processes: int = 0
    scan: str = "full"
    hashed: int = 0
    skipped: dict[str, Skip] = field(default_factory=dict)  # path (a folder's ends in "/") -> why
    fallback: str | None = None
    objects_written: int = 0

    def skip(self, path: str, reason: str, *, size: int | None = None, cap: int | None = None) -> None:
        self.skipped[path] = Skip(reason, size, cap)

    def to_wire(self) -> dict:
        return {
            "ms": round(self.ms, 3),
            "processes": self.processes,
            "scan": self.scan,
            "hashed": self.hashed,
            "skipped": sorted(self.skipped),
            "skipped_files": [self.skipped[path].to_wire(path) for path in sorted(self.skipped)],
        }


@dataclass
class CaptureResult:
    tree: str
    stats: CaptureStats
    index: pygit2.Index | None  # the in-memory index the tree was written from
    flagged: set[str]  # assume-unchanged / skip-worktree paths of the user's index
    pristine: pygit2.Index | None = None  # the user's index as it was read
    settings: Settings | None = None


@dataclass(frozen=True)
class Settings:
    """Per-repository switches that change how a file is recorded."""

    trust_exec: bool
    trust_symlinks: bool
    filters: bool  # CRLF, eol or attributes may change content: let git hash files

    @classmethod
    def read(cls, repo: pygit2.Repository, listing: bytes, info: WorktreeInfo, tracked_attributes: bool) -> Settings:
        config = repo.config

        def flag(name: str, default: bool) -> bool:
            try:
                return config.get_bool(name)
            except (KeyError, pygit2.GitError, ValueError):
                return default

        def present(name: str) -> bool:
            try:
                return bool(config[name])
            except (KeyError, pygit2.GitError, ValueError):
                return False

        autocrlf = False
        with contextlib.suppress(KeyError, pygit2.GitError, ValueError):
            autocrlf = str(config["core.autocrlf"]).lower() in ("true", "input", "1", "yes", "on")
        attributes_file = Path(info.common_dir or info.store_dir, "info", "attributes")
        filters = (
            autocrlf
            or present("core.eol")
            or present("core.attributesFile")
            or attributes_file.exists()
            or tracked_attributes
            or bool(_ATTRIBUTES.search(listing))
            or (git_config_home() / "attributes").exists()
        )
        return cls(flag("core.fileMode", True), flag("core.symlinks", True), filters)


def _stat_key(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def config_files(info: WorktreeInfo) -> list[str]:
    """The config files git reads for ``info``'s worktree, global first (later ones win)."""
    if os.environ.get("GIT_CONFIG_GLOBAL"):
        files = [os.environ["GIT_CONFIG_GLOBAL"]]
    else:
        files = [str(git_config_home() / "config"), os.path.expanduser("~/.gitconfig")]
    files.append(os.path.join(info.common_dir or info.store_dir, "config"))
    if info.git_dir is not None:
        files.append(os.path.join(info.git_dir, "config.worktree"))
    return files


def attributes_files(info: WorktreeInfo) -> list[str]:
    """The attributes files outside the worktree: the repository's own and the user's."""
    return [os.path.join(info.common_dir or info.store_dir, "info", "attributes"), str(git_config_home() / "attributes")]


def conversion_rules(info: WorktreeInfo, listing: bytes, tracked_attributes: bool) -> tuple:
    """The stat data of everything that decides how a file's bytes become a blob.

    That is the config files (``core.autocrlf``, ``core.eol``), the attributes
    files outside the worktree, every ``.gitattributes`` the scan listed
    (changed or untracked) and, when the index tracks one, the user's index,
    which holds the content of the others.
    """
    files = config_files(info) + attributes_files(info)
    if tracked_attributes and info.git_dir is not None:
        files.append(os.path.join(info.git_dir, "index"))
    listed = sorted(os.fsdecode(match.group(1)) for match in _ATTRIBUTES.finditer(listing))
    return (
        tuple(_stat_key(path) for path in files),
        tuple((path, _stat_key(os.path.join(info.path, path))) for path in listed),
    )


_WILDCARD = re.compile(r"([*?\[\\ ])")


def own_data_excludes(info: WorktreeInfo) -> list[str]:
    """``ls-files`` options that leave snapshotd's own data out of a scan of ``info``'s worktree.

    Its home (records and the repositories of plain folders) changes at every
    checkpoint, so a worktree holding it (a plain folder at ``$HOME``, say)
    would otherwise capture the store's new objects forever.
    """
    home = os.path.realpath(info.home)
    root = os.path.realpath(info.path)
    if not home.startswith(root.rstrip("/") + "/"):
        return []
    relative = os.path.relpath(home, root)
    return ["--exclude=/" + _WILDCARD.sub(r"\\\1", relative) + "/"]


def git_target(info: WorktreeInfo) -> GitTarget:
    return GitTarget(git_dir=info.git_dir or info.store_dir, work_tree=info.path)


def make_fence(folder: str) -> int:
    """The mtime the file system gives a file written now: the racy-timestamp fence."""
    path = os.path.join(folder, f"fence-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b"f")
        return os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)
        os.unlink(path)


def file_mode(st: os.stat_result, previous_mode: int | None, settings: Settings) -> int | None:
    """The git mode of a file as ``git add`` records it, or None for what git cannot add."""
    if stat.S_ISLNK(st.st_mode):
        if not settings.trust_symlinks and previous_mode in (MODE_FILE, MODE_EXEC):
            return previous_mode
        return MODE_LINK
    if stat.S_ISREG(st.st_mode):
        if not settings.trust_symlinks and previous_mode == MODE_LINK:
            return MODE_LINK
        if not settings.trust_exec:
            return previous_mode if previous_mode in (MODE_FILE, MODE_EXEC) else MODE_FILE
        return MODE_EXEC if st.st_mode & stat.S_IXUSR else MODE_FILE
    return None


def gitlink_head(path: str) -> pygit2.Oid | None:
    """The commit a nested repository has checked out, or None (no commit, not a repository)."""
    text = gitlink_commit(path)
    return pygit2.Oid(hex=text) if text is not None and len(text) == 40 else None


def gitlink_commit(path: str) -> str | None:
    """:func:`gitlink_head` as hex, also for a nested repository libgit2 cannot open (git answers)."""
    dotgit = os.path.join(path, ".git")
    if not os.path.lexists(dotgit):
        return None
    try:
        nested = pygit2.Repository(path, pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
        if nested.head_is_unborn:
            return None
        return str(nested.head.target)
    except (pygit2.GitError, KeyError, ValueError):
        pass
    try:
        out = run_git_sync(
            GitTarget(git_dir=dotgit, work_tree=path), ["rev-parse", "--verify", "-q", "HEAD"], ok_codes=(0, 1)
        )
    except GitError:
        return None
    text = out.decode().strip()
    return text if len(text) in (40, 64) and all(ch in "0123456789abcdef" for ch in text) else None


class _Walker:
    """Per-capture memo of which parent folders are real folders (not symlinks)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._real: dict[str, bool] = {"": True}

    def parent_is_real(self, path: str) -> bool:
        parent = path.rpartition("/")[0]
        known = self._real.get(parent)
        if known is None:
            if not self.parent_is_real(parent):
                known = False
            else:
                try:
                    known = stat.S_ISDIR(os.lstat(os.path.join(self.root, parent)).st_mode)
                except OSError:
                    known = False
            self._real[parent] = known
        return known

    def lstat(self, path: str) -> os.stat_result | None:
        if not self.parent_is_real(path):
            return None
        try:
            return os.lstat(os.path.join(self.root, path))
        except (FileNotFoundError, NotADirectoryError):
            return None


class TreeBuilder:
    """Applies per-path file states to an in-memory index and writes the tree."""

    def __init__(
        self,
        repo: pygit2.Repository,
        info: WorktreeInfo,
        index: pygit2.Index,
        settings: Settings,
        cache: StatCache,
        stats: CaptureStats,
        size_cap: int,
        fence_ns: int,
    ) -> None:
        self.repo = repo
        self.info = info
        self.index = index
        self.settings = settings
        self.cache = cache
        self.stats = stats
        self.size_cap = size_cap
        self.fence_ns = fence_ns
        self.walker = _Walker(info.path)
        self.odb = repo.odb
        self._git_hash: list[tuple[str, os.stat_result, int]] = []

    def _entry_mode(self, path: str) -> int | None:
        entry = self._get(path)
        return None if entry is None else int(entry.mode)

    def _get(self, path: str) -> pygit2.IndexEntry | None:
        try:
            return self.index[path]
        except (KeyError, ValueError):
            return None

    def _remove(self, path: str) -> None:
        with contextlib.suppress(OSError, KeyError, ValueError, pygit2.GitError):
            self.index.remove(path)

    def _hash(self, path: str, st: os.stat_result, mode: int) -> pygit2.Oid | None:
        cached = self.cache.lookup(path, st)
        if cached is not None and cached in self.odb:  # a gc of the store may have pruned it
            return cached
        absolute = os.path.join(self.info.path, path)
        if mode == MODE_LINK and stat.S_ISLNK(st.st_mode):
            oid = self.repo.create_blob(os.readlink(os.fsencode(absolute)))
        elif self.settings.filters:
            self._git_hash.append((path, st, mode))
            return None
        else:
            oid = self._stable_blob(absolute, st)
            if oid is None:
                return None
        self.stats.hashed += 1
        self.cache.store(path, st, self.fence_ns, oid)
        return oid

    def _write_blob(self, absolute: str, st: os.stat_result) -> pygit2.Oid | None:
        """Store the bytes of the regular file ``st`` describes as a blob; None if another file is there now.

        The open neither follows a link nor blocks (a FIFO swapped in since the
        lstat would hang it for good), and fstat checks that the descriptor is
        that same regular file before a byte is read. The blob object is
        written only if it is new.
        """
        fd = os.open(absolute, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                return None
            with os.fdopen(fd, "rb", closefd=False) as handle:
                if opened.st_size > STREAM_ABOVE:
                    return self.repo.create_blob_fromiobase(handle)
                data = handle.read()
        finally:
            os.close(fd)
        oid = pygit2.hash(data)
        if oid not in self.odb:
            self.odb.write(pygit2.enums.ObjectType.BLOB, data)
            self.stats.objects_written += 1
        return oid

    def _stable_blob(self, absolute: str, st: os.stat_result) -> pygit2.Oid | None:
        """Hash a file, again if it changed while being read, so the blob is never torn.

        None when it is gone or no longer a regular file.
        """
        oid = None
        for _ in range(5):
            try:
                oid = self._write_blob(absolute, st)
                after = os.lstat(absolute)
            except OSError:
                return None
            if not stat.S_ISREG(after.st_mode):
                return None
            if oid is not None and FileState.of(after) == FileState.of(st):
                return oid
            st = after
        return oid

    def apply(self, path: str, *, untracked: bool, keep_if_missing: bool = False) -> None:
        """Record ``path`` as it is on disk now (or drop it if it is gone)."""
        st = self.walker.lstat(path)
        if st is None:
            if not keep_if_missing:
                self._remove(path)
                self.cache.forget(path)
            return
        previous = self._entry_mode(path)
        if stat.S_ISDIR(st.st_mode):
            if previous == MODE_GITLINK or untracked:
                head = gitlink_head(os.path.join(self.info.path, path))
                if head is not None:
                    self.index.add(pygit2.IndexEntry(path, head, MODE_GITLINK))
                elif untracked:
                    self.stats.skip(path + "/", SKIP_NO_COMMIT)
                return
            self._remove(path)  # a file that became a folder; its contents are listed apart
            return
        mode = file_mode(st, previous, self.settings)
        if mode is None:
            self.stats.skip(path, SKIP_SPECIAL)
            return
        if untracked and self.size_cap and st.st_size > self.size_cap and mode != MODE_LINK:
            self.stats.skip(path, SKIP_TOO_LARGE, size=st.st_size, cap=self.size_cap)
            self._remove(path)
            return
        oid = self._hash(path, st, mode)
        if oid is not None:
            self.index.add(pygit2.IndexEntry(path, oid, mode))

    def finish(self) -> str:
        """Hash what needs git's filters, then write the tree."""
        if self._git_hash:
            target = git_target(self.info)
            paths = b"".join(os.fsencode(path) + b"\n" for path, _, _ in self._git_hash)
            if any("\n" in path for path, _, _ in self._git_hash):
                raise GitError("A file name with a newline cannot be hashed through git's filters.")
            out = run_git_sync(target, ["hash-object", "-w", "--stdin-paths"], input=paths)
            self.stats.processes += 1
            for (path, st, mode), line in zip(self._git_hash, out.split(), strict=True):
                oid = pygit2.Oid(hex=line.decode())
                self.stats.hashed += 1
                self.cache.store(path, st, self.fence_ns, oid)
                self.index.add(pygit2.IndexEntry(path, oid, mode))
            self._git_hash.clear()
        return str(self.index.write_tree(self.repo))


def parse_listing(listing: bytes) -> tuple[set[str], set[str], set[str], set[str]]:
    """Split tagged ``ls-files`` output into modified, removed, untracked and flagged paths."""
    modified: set[str] = set()
    removed: set[str] = set()
    untracked: set[str] = set()
    flagged: set[str] = set()
    for match in _INTERESTING.finditer(listing):
        tag = match.group(1)
        path = os.fsdecode(match.group(2))
        if tag == b"?":
            untracked.add(path)
        elif tag == b"C":
            modified.add(path)
        elif tag == b"R":
            removed.add(path)
        elif tag == b"S" or tag.islower():
            flagged.add(path)
        else:
            modified.add(path)  # unmerged ("M") and other tags: let the disk decide
    return modified, removed, untracked, flagged


def index_facts(index: pygit2.Index, raw: bytes) -> tuple[set[str], bool]:
    """Entries flagged assume-unchanged or skip-worktree, and whether a .gitattributes is tracked.

    Walks libgit2's entries through cffi (about 0.5 us an entry), which is far
    cheaper than having ``ls-files -c`` print every entry.
    """
    flagged: set[str] = set()
    get = pygit2.C.git_index_get_byindex
    pointer = index._index
    version = int.from_bytes(raw[4:8], "big") if len(raw) >= 8 else 2
    walk_paths = version >= 4
    attributes = False if walk_paths else bool(_INDEXED_ATTRIBUTES.search(raw))
    for position in range(len(index)):
        entry = get(pointer, position)
        if entry.flags & FLAG_ASSUME_VALID or entry.flags_extended & FLAG_EXTENDED_SKIP_WORKTREE:
            flagged.add(os.fsdecode(pygit2.ffi.string(entry.path)))
        if walk_paths and not attributes:
            path = pygit2.ffi.string(entry.path)
            attributes = path == b".gitattributes" or path.endswith(b"/.gitattributes")
    return flagged, attributes


def seed_index(user_index: str, index_path: str) -> bool:
    """Copy the user's index to the capture's own file, keeping its mtime; False when there is none.

    A hard link would save the copy but changes the user's file (its ctime and
    link count), which watchers, including ours, see as a change to the index.
    """
    try:
        shutil.copy2(user_index, index_path)
    except FileNotFoundError:
        return False
    return True


def read_index(path: str | None) -> pygit2.Index:
    """Load an index file into memory (an empty index for None).

    Goes through libgit2 directly so that a file it cannot read (split or sparse
    index) raises GitError without leaving a half-built ``pygit2.Index`` behind.
    """
    if path is None:
        return pygit2.Index()
    cindex = pygit2.ffi.new("git_index **")
    check_error(pygit2.C.git_index_open(cindex, os.fsencode(path)))
    return pygit2.Index.from_c(None, cindex)


def open_repo(info: WorktreeInfo) -> pygit2.Repository:
    return pygit2.Repository(info.store_dir, pygit2.enums.RepositoryOpenFlag.NO_SEARCH)


@dataclass
class LoadedIndex:
    """The user's index read in-process, with the facts the capture needs from it."""

    index: pygit2.Index
    pristine: pygit2.Index | None
    flagged: set[str]
    tracked_attributes: bool


def load_index(index_path: str | None, keep_pristine: bool) -> LoadedIndex | str:
    """Read the index copy (runs while git scans); the reason as a string if libgit2 cannot."""
    try:
        index = read_index(index_path)
        pristine = read_index(index_path) if keep_pristine else None
    except pygit2.GitError as exc:
        return f"index not readable in-process ({exc})"
    raw = b""
    if index_path is not None:
        with open(index_path, "rb") as handle:
            raw = handle.read()
    flagged, tracked_attributes = index_facts(index, raw)
    return LoadedIndex(index, pristine, flagged, tracked_attributes)


def _build(
    info: WorktreeInfo,
    index_path: str | None,
    loaded: LoadedIndex | str,
    listing: bytes,
    cache: StatCache,
    stats: CaptureStats,
    size_cap: int,
    fence_ns: int,
    hints: set[str],
) -> CaptureResult:
    repo = open_repo(info)
    modified, removed, untracked, flagged = parse_listing(listing)
    if isinstance(loaded, str):
        stats.fallback = loaded
        return _build_with_git(info, index_path, modified | removed, untracked, flagged, stats, size_cap)
    index = loaded.index
    flagged |= loaded.flagged
    modified |= {path for path in hints if path in index}
    settings = Settings.read(repo, listing, info, loaded.tracked_attributes)
    cache.follow_rules(conversion_rules(info, listing, loaded.tracked_attributes))
    conflicts = index.conflicts
    if conflicts is not None:
        conflicted = set()
        for ancestor, ours, theirs in conflicts:
            for side in (ancestor, ours, theirs):
                if side is not None:
                    conflicted.add(side.path)
        for path in conflicted:
            del conflicts[path]
        modified |= conflicted
    # The index's own tree comes from its cache-tree extension (milliseconds when
    # valid); the changes are then edited in along their paths only.
    recording = RecordingIndex(index, str(index.write_tree(repo)))
    builder = TreeBuilder(repo, info, recording, settings, cache, stats, size_cap, fence_ns)
    for path in modified | removed:
        builder.apply(path, untracked=False, keep_if_missing=path in flagged)
    for path in flagged - modified - removed:
        builder.apply(path, untracked=False, keep_if_missing=True)
    for path in untracked:
        nested = path.endswith("/")
        builder.apply(path.rstrip("/") if nested else path, untracked=True)
    tree = builder.finish()
    return CaptureResult(
        tree=tree, stats=stats, index=index, flagged=flagged, pristine=loaded.pristine, settings=settings
    )


def _flag_kinds(listing: bytes) -> tuple[set[str], set[str]]:
    """Skip-worktree and assume-unchanged paths of a tagged ``ls-files -v`` listing."""
    skip: set[str] = set()
    valid: set[str] = set()
    for match in _INTERESTING.finditer(listing):
        tag = match.group(1)
        if tag in (b"S", b"s"):
            skip.add(os.fsdecode(match.group(2)))
        if tag.islower():
            valid.add(os.fsdecode(match.group(2)))
    return skip, valid


def folders_above(path: str) -> Iterator[str]:
    """The folders that hold ``path``, outermost first ("a", "a/b" for "a/b/c")."""
    parts = path.split("/")
    for depth in range(1, len(parts)):
        yield "/".join(parts[:depth])


def _nul_list(paths: Iterable[str]) -> bytes:
    return b"".join(os.fsencode(path) + b"\0" for path in paths)


MAX_CACHEINFO_BYTES = 256 * 1024  # known untracked entries given on update-index's command line


def _build_with_git(
    info: WorktreeInfo,
    index_path: str | None,
    changed: set[str],
    untracked: set[str],
    flagged: set[str],
    stats: CaptureStats,
    size_cap: int,
    *,
    flag_listing: bytes | None = None,
    cache: StatCache | None = None,
    fence_ns: int = 0,
) -> CaptureResult:
    """The same result through git alone, for indexes and repositories libgit2 cannot read.

    ``flag_listing`` is a tagged listing of every index entry (``ls-files -v
    -c``) when the scan already made one. With ``cache``, the id and mode git
    gave each file it hashed are remembered (by stat data, under the racy
    fence, as for in-process hashing), so a file unchanged since (untracked,
    or tracked and modified) is neither read nor filtered again: it is given to
    ``update-index`` as a known entry.
    """
    target = git_target(info)
    walker = _Walker(info.path)
    if flag_listing is None:
        flag_listing = run_git_sync(target, ["ls-files", "-z", "-v"], index_file=index_path)
        stats.processes += 1
    skip, valid = _flag_kinds(flag_listing)
    flagged = flagged | skip | valid
    # As the contract says: a flagged entry whose file is on disk is taken from disk.
    # (One flag per run: update-index applies only the first of two unmark options.)
    for option, paths_flagged in (("--no-skip-worktree", skip), ("--no-assume-unchanged", valid)):
        present = {path for path in paths_flagged if walker.lstat(path) is not None}
        if present:
            run_git_sync(target, ["update-index", "-z", option, "--stdin"], index_file=index_path, input=_nul_list(sorted(present)))
            stats.processes += 1
    on_disk = {path for path in flagged if walker.lstat(path) is not None}
    # A flagged entry missing from disk stays as the index has it (sparse checkout).
    paths = sorted((changed - flagged) | on_disk)
    beyond = {path for path in paths if not walker.parent_is_real(path)}
    if beyond:
        # Inside a folder now replaced by a symlink or a file: gone, though lstat through the link may find it.
        run_git_sync(target, ["update-index", "-z", "--force-remove", "--stdin"], index_file=index_path, input=_nul_list(sorted(beyond)))
        stats.processes += 1
        paths = [path for path in paths if path not in beyond]
    for raw in sorted(untracked):
        path = raw.rstrip("/")
        st = walker.lstat(path)
        if st is None:
            continue
        if raw.endswith("/") and gitlink_commit(os.path.join(info.path, path)) is None:
            stats.skip(raw, SKIP_NO_COMMIT)
            continue
        if not raw.endswith("/") and size_cap and stat.S_ISREG(st.st_mode) and st.st_size > size_cap:
            stats.skip(path, SKIP_TOO_LARGE, size=st.st_size, cap=size_cap)
            continue
        paths.append(path)
    # Files hashed before and unchanged since go in as known entries, which update-index
    # applies before the listed paths. Inside a tracked path that is now a folder (a file
    # turned folder) they would meet the old entry first and fail: those are listed.
    turned = {p for p in changed | on_disk if (st := walker.lstat(p)) is not None and stat.S_ISDIR(st.st_mode)}
    listed: list[str] = []
    known: list[str] = []
    known_bytes = 0
    fresh: dict[str, os.stat_result] = {}
    for path in paths:
        st = walker.lstat(path) if cache is not None else None
        if st is not None and (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            assert cache is not None
            hit = cache.lookup_entry(path, st)
            inside_turned = bool(turned) and any(folder in turned for folder in folders_above(path))
            if hit is not None and hit.mode is not None and not inside_turned and known_bytes < MAX_CACHEINFO_BYTES:
                item = f"{hit.mode:o},{hit.oid},{path}"
                known += ["--cacheinfo", item]
                known_bytes += len(os.fsencode(item)) + 13
                continue
            fresh[path] = st
        listed.append(path)
    if listed or known:
        run_git_sync(
            target,
            ["update-index", "-z", "--add", "--remove", "--replace", "--ignore-skip-worktree-entries", *known, "--stdin"],
            index_file=index_path,
            input=_nul_list(listed),
        )
        stats.processes += 1
        stats.hashed += len(fresh) if cache is not None else len(listed)
    if cache is not None and fresh:
        _remember(target, index_path, fresh, cache, fence_ns, stats)
    tree = run_git_sync(target, ["write-tree"], index_file=index_path).decode().strip()
    stats.processes += 1
    return CaptureResult(tree=tree, stats=stats, index=None, flagged=flagged)


def _remember(
    target: GitTarget,
    index_path: str | None,
    fresh: dict[str, os.stat_result],
    cache: StatCache,
    fence_ns: int,
    stats: CaptureStats,
) -> None:
    """Cache the id and mode git gave the untracked files it just hashed (one ``ls-files -s``)."""
    chosen: list[str] = []
    size = 0
    for path in sorted(fresh):
        size += len(os.fsencode(path)) + 1
        if size > MAX_CACHEINFO_BYTES:
            break  # the rest is hashed again next time
        chosen.append(path)
    out = run_git_sync(
        target,
        ["ls-files", "-s", "-z", "--", *chosen],
        index_file=index_path,
        env_extra={"GIT_LITERAL_PATHSPECS": "1"},
    )
    stats.processes += 1
    for record in out.split(b"\0"):
        meta, _, raw_path = record.partition(b"\t")
        fields = meta.split(b" ")
        path = os.fsdecode(raw_path)
        if len(fields) == 3 and fields[2] == b"0" and path in fresh:
            cache.store(path, fresh[path], fence_ns, fields[1].decode("ascii"), int(fields[0], 8))


def _build_git_only(
    info: WorktreeInfo,
    index_path: str,
    listing: bytes,
    cache: StatCache,
    stats: CaptureStats,
    size_cap: int,
    fence_ns: int,
) -> CaptureResult:
    """The capture of a repository libgit2 cannot open: git's scan applied by git to the index copy."""
    modified, removed, untracked, flagged = parse_listing(listing)
    stats.fallback = f"object format {object_format(info.store_dir)}"
    cache.follow_rules(conversion_rules(info, listing, tracked_attributes=False))  # listing -c names every one
    return _build_with_git(
        info, index_path, modified | removed, untracked, flagged, stats, size_cap,
        flag_listing=listing, cache=cache, fence_ns=fence_ns,
    )


async def capture_cold(
    info: WorktreeInfo,
    cache: StatCache,
    size_cap: int,
    *,
    keep_pristine: bool = False,
    hints: set[str] | None = None,
) -> CaptureResult:
    """One full capture: one ``ls-files`` process, hashing only what it names.

    ``hints`` are tracked paths known to have been written (by the watcher):
    they are re-examined even where git's stat check, which compares
    timestamps only to the second, calls them clean.
    """
    started = time.perf_counter()
    stats = CaptureStats(scan="full")
    tmp_dir = checked_private_folder(os.path.join(info.state_dir, "tmp"))
    index_path = os.path.join(tmp_dir, f"index-{os.getpid()}-{secrets.token_hex(6)}")
    user_index = os.path.join(info.git_dir, "index") if info.git_dir else None
    try:
        seeded = user_index is not None and seed_index(user_index, index_path)
        if is_git_only(info.store_dir):
            # Hashing, flags and the tree all by git; a missing index file is an empty index.
            fence_ns = make_fence(tmp_dir)
            listing = await run_git(git_target(info), [*LS_FILES, *own_data_excludes(info), "-c"], index_file=index_path)
            stats.processes += 1
            result = await trio.to_thread.run_sync(
                _build_git_only, info, index_path, listing, cache, stats, size_cap, fence_ns, limiter=thread_limiter
            )
            stats.ms = (time.perf_counter() - started) * 1000
            return result
        fence_ns = make_fence(tmp_dir)
        seed = index_path if seeded else None
        loaded: list[LoadedIndex | str] = []

        async def load() -> None:
            loaded.append(await trio.to_thread.run_sync(load_index, seed, keep_pristine, limiter=thread_limiter))

        try:
            async with trio.open_nursery() as nursery:  # read the index in-process while git scans
                nursery.start_soon(load)
                listing = await run_git(git_target(info), [*LS_FILES, *own_data_excludes(info)], index_file=index_path)
                stats.processes += 1
        except BaseExceptionGroup as group:
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        result = await trio.to_thread.run_sync(
            _build, info, seed, loaded[0], listing, cache, stats, size_cap, fence_ns, hints or set(),
            limiter=thread_limiter,
        )
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(index_path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(index_path + ".lock")
    stats.ms = (time.perf_counter() - started) * 1000
    return result
