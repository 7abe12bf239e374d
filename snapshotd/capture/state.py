"""What a capture knows between runs and reports: the stat cache, the rules that convert files, the stats.

The stat cache keeps a hash only while the file's stat data match and the
conversion rules it was made under stand; a capture's result carries its
tree, its typed stats and what the warm path starts from.
"""

from __future__ import annotations

import os
import secrets
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pygit2

from snapshotd import fsutil
from snapshotd.capture.checkin import is_attributes
from snapshotd.capture.scan import attributes_in
from snapshotd.git.attributes import (
    attributes_files as git_attributes_files,
    autocrlf,
    git_bool,
    may_convert,
)
from snapshotd.git.config import included_files
from snapshotd.settings import git_config_home
from snapshotd.store.identity import WorktreeInfo

if TYPE_CHECKING:
    from snapshotd.capture.userindex import UserIndex


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
    basis: pygit2.Oid | None = None  # the user's index blob at the path, which git's conversion read


@dataclass
class StatCache:
    """Hashes of files keyed by path; an entry counts only while its stat data match.

    An entry is trusted only if the file's mtime and ctime are strictly older
    than the fence (the mtime of a file this process wrote just before
    hashing), so a write in the same timestamp tick as the hash is never
    missed, even one that put the old mtime back.
    """

    entries: dict[str, CachedBlob] = field(default_factory=dict)
    rules: tuple[object, ...] | None = None  # the conversion rules the entries were hashed under

    def follow_rules(self, rules: tuple[object, ...]) -> None:
        """Forget every entry if the rules that turn a file's bytes into a blob changed since.

        A new ``*.sh text eol=lf`` gives an unchanged CRLF file another blob, so
        a hash is worth keeping only under the rules it was made with.
        """
        if rules != self.rules:
            self.entries.clear()
            self.rules = rules

    def lookup(self, path: str, st: os.stat_result, basis: pygit2.Oid | None = None) -> pygit2.Oid | None:
        """The cached hash of ``path`` if its stat data and ``basis`` are those it was hashed under."""
        cached = self.lookup_entry(path, st)
        if cached is None or cached.basis != basis:
            return None  # git's conversion read another index blob there (safer autocrlf)
        return cached.oid  # type: ignore[return-value]

    def lookup_entry(self, path: str, st: os.stat_result) -> CachedBlob | None:
        cached = self.entries.get(path)
        if cached is None:
            return None
        if cached.state != FileState.of(st) or not fsutil.older_than(st, cached.fence_ns):
            return None
        return cached

    def store(
        self,
        path: str,
        st: os.stat_result,
        fence_ns: int,
        oid: pygit2.Oid | str,
        mode: int | None = None,
        *,
        basis: pygit2.Oid | None = None,
    ) -> None:
        self.entries[path] = CachedBlob(FileState.of(st), fence_ns, oid, mode, basis)

    def forget(self, path: str) -> None:
        self.entries.pop(path, None)


SKIP_TOO_LARGE = "larger than the size cap for untracked files"
SKIP_SPECIAL = "not a file, link or folder (a FIFO, socket or device), which git cannot add"
SKIP_NO_COMMIT = "a nested repository with no commit yet"
SKIP_REFUSED_NAME = "a name git refuses to record in an index (git add -A fails on it)"


@dataclass(frozen=True)
class Skip:
    """Why a path on disk was left out of a capture."""

    reason: str
    size: int | None = None
    cap: int | None = None

    def to_wire(self, path: str) -> dict[str, Any]:
        wire: dict[str, Any] = {"path": path, "reason": self.reason}
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
    shared: bool = False  # the capture served other checkpoint requests queued with this one
    phases: dict[str, float] = field(default_factory=dict)  # where ``ms`` went: queued, (sync, thread,) capture, record

    def skip(self, path: str, reason: str, *, size: int | None = None, cap: int | None = None) -> None:
        self.skipped[path] = Skip(reason, size, cap)

    def count_into(self, counters: Counter[str]) -> None:
        """Add this capture to the counts ``status`` reports: its processes, its kind, the kind of its fallback."""
        counters["processes"] += self.processes
        counters[f"captures.{self.scan}"] += 1
        if self.fallback:
            counters["fallbacks." + ("object_format" if self.fallback.startswith("object format") else "git_index")] += 1

    def to_wire(self) -> dict[str, Any]:
        return {
            "ms": round(self.ms, 3),
            "processes": self.processes,
            "scan": self.scan,
            "hashed": self.hashed,
            "shared": self.shared,
            "phases": {name: round(ms, 3) for name, ms in self.phases.items()},
            "skipped": sorted(self.skipped),
            "skipped_files": [self.skipped[path].to_wire(path) for path in sorted(self.skipped)],
        }


Then = Callable[[str], None]
"""Work to do with a capture's tree on the capture's own worker thread (the checkpoints' record)."""


@dataclass
class CaptureResult:
    tree: str
    stats: CaptureStats
    index: pygit2.Index | None  # the in-memory index the tree was written from
    flagged: set[str]  # assume-unchanged / skip-worktree paths of the user's index
    user: UserIndex | None = None  # the user's index as it was read (what the capture changed of it)
    settings: Settings | None = None
    gitlinks: set[str] | None = None  # the gitlink paths of the index the tree was written from
    linked: set[str] | None = None  # files met with several names (hard links)


@dataclass(frozen=True)
class Settings:
    """Per-repository switches that change how a file is recorded."""

    trust_exec: bool
    trust_symlinks: bool
    filters: bool  # CRLF, eol or attributes may change content: let git hash files
    content_filters: bool = True  # with filters, more than CR bytes may change (capture/asis.py): git hashes all
    autocrlf: str | None = None  # core.autocrlf ("false", "true", "input"; None: git's to read) for paths no rule covers

    @classmethod
    def read(cls, config: pygit2.Config, listing: bytes, info: WorktreeInfo, tracked_attributes: bool) -> Settings:
        """The switches under ``config``, the configuration git reads (:func:`git_config`)."""

        def flag(name: str, default: bool) -> bool:
            try:
                return config.get_bool(name)
            except (KeyError, pygit2.GitError, ValueError):
                return default

        filters = may_convert(
            config,
            info.common_dir or info.store_dir,
            worktree_attributes=tracked_attributes or bool(attributes_in(listing)),
        )
        return cls(flag("core.fileMode", True), flag("core.symlinks", True), filters, autocrlf=autocrlf(config))


def _stat_key(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


SYSTEM_CONFIG = "/etc/gitconfig"


def config_files(info: WorktreeInfo) -> list[str]:
    """The config files git reads for ``info``'s worktree, the system's first (later ones win)."""
    files = []
    if git_bool(os.environ.get("GIT_CONFIG_NOSYSTEM", "")) is not True:
        files.append(os.environ.get("GIT_CONFIG_SYSTEM") or SYSTEM_CONFIG)
    if os.environ.get("GIT_CONFIG_GLOBAL"):
        files.append(os.environ["GIT_CONFIG_GLOBAL"])
    else:
        files += [str(git_config_home() / "config"), os.path.expanduser("~/.gitconfig")]
    files.append(os.path.join(info.common_dir or info.store_dir, "config"))
    if info.git_dir is not None:
        files.append(os.path.join(info.git_dir, "config.worktree"))
    return files


def config_sources(info: WorktreeInfo) -> list[str]:
    """The config files git reads for ``info``'s worktree and every file they include: a change of any may change
    a setting."""
    return [included for path in config_files(info) for included in (path, *included_files(path))]


def git_config(info: WorktreeInfo) -> pygit2.Config:
    """The configuration git reads for ``info``'s worktree, from :func:`config_files`.

    Not ``repo.config``: libgit2 finds the system and global files by its own
    search, past ``GIT_CONFIG_SYSTEM``, ``GIT_CONFIG_GLOBAL`` and
    ``GIT_CONFIG_NOSYSTEM``. ``config.worktree`` counts only under
    ``extensions.worktreeConfig``, as in git.
    """
    config = pygit2.Config()
    files = config_files(info)
    own = os.path.join(info.git_dir, "config.worktree") if info.git_dir is not None else None
    for level, path in enumerate(files, start=1):
        if path == own:
            try:
                if not config.get_bool("extensions.worktreeConfig"):
                    continue
            except (KeyError, ValueError, pygit2.GitError):
                continue
        if os.path.isfile(path):
            try:
                config.add_file(path, level)
            except (OSError, pygit2.GitError):
                continue  # a file git cannot read either stops git: the capture's git says so
    return config


def attributes_files(info: WorktreeInfo) -> list[str]:
    """The attributes files outside the worktree that git reads for ``info``'s worktree."""
    return git_attributes_files(info.common_dir or info.store_dir)


def conversion_rules(
    info: WorktreeInfo, listing: bytes, tracked_attributes: bool, flagged: Iterable[str] = ()
) -> tuple[object, ...]:
    """The stat data of everything that decides how a file's bytes become a blob.

    That is the config files and those they include (``core.autocrlf``, ``core.eol``), the attributes
    files outside the worktree, every ``.gitattributes`` the scan listed
    (changed or untracked) or the index flags (skip-worktree, assume-unchanged:
    the file on disk counts while it is there, the index's blob once it is
    gone) and, when the index tracks one, the user's index, which holds the
    content of the others.
    """
    files = config_sources(info) + attributes_files(info)
    if tracked_attributes and info.git_dir is not None:
        files.append(os.path.join(info.git_dir, "index"))
    return (
        tuple(_stat_key(path) for path in files),
        tuple((path, _stat_key(os.path.join(info.path, path))) for path in listed_attributes(listing, flagged)),
    )


def listed_attributes(listing: bytes, flagged: Iterable[str]) -> list[str]:
    """The worktree's ``.gitattributes`` a scan listed (changed or untracked) or the index flags, sorted."""
    return sorted(set(attributes_in(listing)) | {path for path in flagged if is_attributes(path)})


FENCE_NAME = "fence"
_fence_lock = threading.Lock()


def make_fence(folder: str) -> int:
    """The mtime the file system gives a file written now: the racy-timestamp fence.

    One file per folder, written again each time rather than made and removed (an inode freed per capture
    slows the next allocations on an ext4 without a journal); the lock keeps another thread's write from
    coming between this write and its ``fstat``. Only a one-byte file of this user's, with one link, is
    written again: anything else at that name gets a file of its own, made and removed as before.
    """
    path = os.path.join(folder, FENCE_NAME)
    with _fence_lock:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1 or st.st_size > 1:
                return _fence_of_its_own(folder)
            os.pwrite(fd, b"f", 0)
            return os.fstat(fd).st_mtime_ns
        finally:
            os.close(fd)


def _fence_of_its_own(folder: str) -> int:
    path = os.path.join(folder, f"{FENCE_NAME}-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b"f")
        return os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)
        os.unlink(path)
