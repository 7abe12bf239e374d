"""The warm path: a capture from the watcher's dirty set, with no full scan.

After one cold capture the daemon keeps its in-memory index (the last tree's
entries) and the user's index as it was read (which paths git tracks, their
stat data and flags), as the originals of the entries captures changed since
(:mod:`snapshotd.capture.userindex`): one index in memory, not two. A warm capture re-examines only the paths the watcher
named: known paths are lstat'ed and re-hashed only when their stat data say
so, without any process. Paths the daemon has never seen (new files, writes
to ignored ones, new or moved-in folders) are put to git, because only git
knows git's ignore rules exactly (libgit2 differs on nested negations): to the
worktree's long-lived check-ignore, else to one ``ls-files`` run
(:mod:`snapshotd.capture.newpaths`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pygit2

from snapshotd.capture.builder import TreeBuilder, open_repo
from snapshotd.capture.checkin import is_attributes
from snapshotd.capture.eol import AttributeOracle, LineEndings
from snapshotd.capture.gitlinks import note_changes
from snapshotd.capture.ignores import IgnoreOracle, Ignores
from snapshotd.capture.linked import other_names
from snapshotd.capture.newpaths import apply_new_paths, holds_tracked
from snapshotd.capture.scan import git_target
from snapshotd.capture.state import (
    CaptureResult,
    CaptureStats,
    Settings,
    Skip,
    StatCache,
    attributes_files,
    config_sources,
    git_config,
)
from snapshotd.capture.treeedit import RecordingIndex
from snapshotd.capture.userindex import UserIndex, entries_under, entry_at
from snapshotd.capture.watchpaths import is_ignore_rules
from snapshotd.git.config import config_value
from snapshotd.git.modes import MODE_LINK
from snapshotd.paths import folders_above
from snapshotd.settings import git_config_home
from snapshotd.store.identity import WorktreeInfo


def dirty_under_removed_attributes(
    index: pygit2.Index, root: str, removed: set[str], flagged: set[str], index_path: str | None
) -> set[str]:
    """Entries ``git add -A`` hashes under the rules of a ``.gitattributes`` it removes first, unlike ``ls-files``.

    ``ls-files -m`` compares the content of an entry whose stat data changed
    (or that is racily clean) and reads the attributes of a ``.gitattributes``
    deleted from disk from the index; ``git add -A`` hashes such an entry after
    it has removed that file (in path order). So the entries below a deleted,
    unflagged ``.gitattributes`` whose stat data do not prove them unchanged
    are hashed anew, and those git calls racily clean: by the mtime alone, in
    whole seconds, as this git compares (the ctime counts in its stat match,
    never in its racy check). A ctime in the index's second but older than
    the index file is no reason: git keeps that entry's blob (a file rewritten
    with its mtime put back, then ``git commit -a``, a second after it was made).
    """
    folders = [path.rpartition("/")[0] for path in removed if is_attributes(path) and path not in flagged]
    if not folders or index_path is None:
        return set()
    index_ns = os.stat(index_path).st_mtime_ns  # in integer nanoseconds: a float rounds up to the next second
    index_second = index_ns // 1_000_000_000
    user = UserIndex(index)  # the index is still the user's here
    paths = [os.fsdecode(pygit2.ffi.string(entry_at(index, n).path)) for n in range(len(index))]
    if "" not in folders:
        paths = [path for path in paths if any(path.startswith(folder + "/") for folder in folders)]
    dirty = set()
    for path in paths:
        try:
            st = os.lstat(os.path.join(root, path))
        except OSError:
            continue
        if st.st_mtime_ns // 1_000_000_000 >= index_second or user.clean_oid(path, st, index_ns) is None:
            dirty.add(path)
    return dirty


@dataclass
class WarmState:
    """What a warm capture starts from: the last capture's index and the user's as read (what changed of it)."""

    index: pygit2.Index
    user: UserIndex
    flagged: set[str]
    settings: Settings
    tree: str
    index_mtime_ns: int
    sources: list[str]
    signature: tuple[object, ...]
    rules: object = None  # what proves the rules unchanged since (:meth:`same_rules`); None proves nothing
    not_ignored: set[str] = field(default_factory=set)
    ignored: Ignores = field(default_factory=Ignores)  # check-ignore's answers (capture/ignores.py)
    skipped: dict[str, Skip] = field(default_factory=dict)  # left out of the last tree, still on disk
    gitlinks: set[str] = field(default_factory=set)  # the index's gitlinks, whose HEADs each capture reads
    linked: set[str] = field(default_factory=set)  # files seen with other names (hard links), re-checked each capture

    @cached_property
    def flags_ignore_rules(self) -> bool:
        """Whether the user's index flags a ``.gitignore`` (skip-worktree: git reads it from the index)."""
        return any(is_ignore_rules(path) for path in self.flagged)

    def same_rules(self, other: WarmState | None) -> bool:
        """Whether ``other`` was read under the rules this one was: the same rule files by stat (the user's
        index aside), and the same live watch, not walked again and told of no rule file's change in between."""
        return other is not None and self.rules is not None and other.rules == self.rules

    @classmethod
    def from_cold(
        cls,
        result: CaptureResult,
        index_mtime_ns: int,
        sources: list[str],
        signature: tuple[object, ...],
        rules: object = None,
    ) -> WarmState | None:
        if result.index is None or result.user is None or result.settings is None:
            return None
        return cls(
            index=result.index,
            user=result.user,
            flagged=result.flagged,
            settings=result.settings,
            tree=result.tree,
            index_mtime_ns=index_mtime_ns,
            sources=sources,
            signature=signature,
            rules=rules,
            skipped=dict(result.stats.skipped),
            gitlinks=set(result.gitlinks or ()),
            linked=set(result.linked or ()),
        )


def exclude_files(info: WorktreeInfo) -> list[str]:
    """The ignore files git reads outside the worktree: the user's excludes file and ``info/exclude``."""
    excludes = config_value(git_config(info), "core.excludesFile")
    common = info.common_dir or info.store_dir
    return [
        os.path.expanduser(excludes) if excludes else os.path.join(str(git_config_home()), "ignore"),
        os.path.join(common, "info", "exclude"),
    ]


def rule_sources(info: WorktreeInfo) -> list[str]:
    """Files whose change can change what is ignored, tracked or converted: re-checked by stat each capture."""
    sources = [*config_sources(info), *attributes_files(info), *exclude_files(info)]
    if info.git_dir is not None:
        sources.append(os.path.join(info.git_dir, "index"))
    return sources


_CONFIG_ENV = ("HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM")


def signature_of(paths: list[str]) -> tuple[object, ...]:
    """Stat data of the rule files, and the variables that choose which files git reads."""
    out: list[object] = [tuple(os.environ.get(name) for name in _CONFIG_ENV)]
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino))
    return tuple(out)


@dataclass(frozen=True)
class WarmBasis:
    """The rule files a warm state is checked against, their stat signature and the user's index mtime."""

    sources: list[str]
    signature: tuple[object, ...]
    index_mtime_ns: int
    index: str | None = None  # the user's index, the one source the warm state's git children never read

    @classmethod
    def read(cls, info: WorktreeInfo, keep: bool) -> WarmBasis:
        """Read them from disk (config files, stat calls): on a worker thread."""
        sources = rule_sources(info) if keep else []
        index_mtime_ns = 0
        index = None if info.git_dir is None else os.path.join(info.git_dir, "index")
        if index is not None:
            try:
                index_mtime_ns = os.stat(index).st_mtime_ns
            except OSError:
                index_mtime_ns = 0
        return cls(sources, signature_of(sources), index_mtime_ns, index)

    def rules(self, epoch: tuple[object, ...] | None) -> object:
        """:attr:`WarmState.rules` for a warm state read now under the watch's ``epoch``
        (:meth:`~snapshotd.capture.watch.Watcher.rules_epoch`): None when the watch may have gaps."""
        if epoch is None:
            return None
        files = tuple((path, stat) for path, stat in zip(self.sources, self.signature[1:], strict=True) if path != self.index)
        return epoch, self.signature[0], files


class WarmBuilder(TreeBuilder):
    """A TreeBuilder that also trusts the user's index stat data for tracked files."""

    def __init__(self, warm: WarmState, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.warm = warm

    def _basis(self, path: str) -> pygit2.Oid | None:
        """The user's index blob at ``path``: the warm state keeps the user's index as it was read."""
        return self.warm.user.basis(path)

    def _hash(self, path: str, st: os.stat_result, mode: int) -> pygit2.Oid | None:
        basis = self._basis(path) if self.settings.filters else None
        if self.cache.lookup(path, st, basis) is None and mode != MODE_LINK:
            oid = self.warm.user.clean_oid(path, st, self.warm.index_mtime_ns)
            entry = self.warm.user.entry(path)
            if oid is not None and entry is not None and entry[1] == mode:
                return oid
        return super()._hash(path, st, mode)

    def _entry_mode(self, path: str) -> int | None:
        """The mode git would start from: the last capture's entry, else the user's index entry."""
        mode = super()._entry_mode(path)
        if mode is None:
            entry = self.warm.user.entry(path)
            mode = None if entry is None else entry[1]
        return mode

    def _users_entry(self, path: str) -> tuple[pygit2.Oid, int] | None:
        """The user's index entry as read (the last capture's may differ)."""
        return self.warm.user.entry(path)

    def known(self, path: str) -> bool:
        return path in self.index or self.warm.user.has(path)

    def drop(self, path: str) -> None:
        """A path is gone: remove it and everything under it, keeping flagged entries."""
        self._remove(path)
        self.cache.forget(path)
        for inner in entries_under(self.index, path):
            self._remove(inner)
        for flagged in self.warm.flagged:
            entry = self.warm.user.entry(flagged)
            if entry is not None and (flagged == path or flagged.startswith(path + "/")):
                self.index.add(pygit2.IndexEntry(flagged, entry[0], entry[1]))  # type: ignore[arg-type]  # an int mode; pygit2's stub says FileMode


def capture_warm(
    info: WorktreeInfo,
    warm: WarmState,
    dirty: set[str],
    cache: StatCache,
    stats: CaptureStats,
    size_cap: int,
    fence_ns: int,
    repo: pygit2.Repository | None = None,
    oracle: IgnoreOracle | None = None,
    attributes: AttributeOracle | None = None,
) -> str | None:
    """Apply the dirty paths to the warm index; the new tree, or None when a full scan is needed.

    ``repo`` is the worktree's open store, if it keeps one (see capture/resident.py);
    ``oracle`` its check-ignore and ``attributes`` its check-attr, if it keeps them
    (see capture/ignores.py, capture/eol.py).
    """
    repo = repo if repo is not None else open_repo(info)
    if warm.tree not in repo.odb:
        return None  # a gc of the store pruned the last tree: only a full scan can rebuild it
    recording = RecordingIndex(warm.index, warm.tree, warm.user)
    line_endings = None
    if attributes is not None:
        no_index = os.path.join(info.state_dir, "tmp", f"no-index-{os.getpid()}")
        line_endings = LineEndings(attributes, git_target(info), warm, no_index)
    builder = WarmBuilder(
        warm, repo, info, recording, warm.settings, cache, stats, size_cap, fence_ns, flagged=warm.flagged,
        line_endings=line_endings,
    )
    try:
        unknown: dict[str, os.stat_result] = {}
        linked_anew: set[tuple[int, int]] = set()
        for path in sorted(dirty):
            st = builder.walker.lstat(path)
            if st is None or not stat.S_ISREG(st.st_mode) or st.st_nlink == 1:
                warm.linked.discard(path)
            elif path not in warm.linked:
                warm.linked.add(path)
                linked_anew.add((st.st_dev, st.st_ino))
            if attributes is not None and (st is None or stat.S_ISDIR(st.st_mode)):
                attributes.met_anew(path)  # gone, or met anew: its rule files are not the ones check-attr read
            if st is None:
                builder.drop(path)
                continue
            if stat.S_ISDIR(st.st_mode):
                if not (warm.ignored.holds(path, folder=True) and not holds_tracked(builder, warm.user, path)):
                    unknown[path] = st  # met anew: what was known below it may not hold for what is there now
                    warm.not_ignored -= {p for p in warm.not_ignored if p.startswith(path + "/")}
                    warm.ignored.forget_under(path)
                    if oracle is not None:
                        oracle.met_anew(path)
                continue
            for inner in entries_under(builder.index, path):  # a file or link now: nothing lives below it
                builder.drop(inner)
            if builder.known(path):
                builder.apply(path, untracked=not warm.user.has(path), keep_if_missing=path in warm.flagged)
            elif path in warm.not_ignored:
                builder.apply(path, untracked=True)
            elif not warm.ignored.holds(path, folder=False):
                unknown[path] = st
        for path in sorted(other_names(warm.index, linked_anew, builder.walker) - dirty) if linked_anew else ():
            warm.linked.add(path)  # a write through one name of a file is told for that name only
            if builder.known(path):
                builder.apply(path, untracked=not warm.user.has(path), keep_if_missing=path in warm.flagged)
        if unknown and not apply_new_paths(builder, warm, info, oracle, unknown, stats):
            return None
        tree = builder.finish()
    finally:
        builder.close()
    warm.tree = tree
    note_changes(warm.gitlinks, recording.changes)
    warm.skipped = {**_untouched(warm.skipped, dirty), **stats.skipped}
    return tree


def _untouched(skipped: dict[str, Skip], dirty: set[str]) -> dict[str, Skip]:
    """The left-out paths that no dirty path names or holds: left out still, though not re-examined."""
    kept = {}
    for path, why in skipped.items():
        plain = path.rstrip("/")
        if plain not in dirty and not any(folder in dirty for folder in folders_above(plain)):
            kept[path] = why
    return kept
