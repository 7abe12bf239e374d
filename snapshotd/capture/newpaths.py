"""A warm capture's paths it has not met: settled by check-ignore, else listed by ``git ls-files``.

A new file, a write to an ignored one, a folder moved in: only git knows git's
ignore rules exactly. check-ignore (capture/ignores.py) settles what it can;
``ls-files -t -c -o --exclude-standard`` lists the rest, which also says what a
folder holds and which of it is tracked.
"""

from __future__ import annotations

import os
import stat
from typing import Protocol

import pygit2

from snapshotd.capture.checkin import is_attributes
from snapshotd.capture.ignores import IgnoreOracle, Ignores, list_new_folder
from snapshotd.capture.scan import git_target, own_data_excludes
from snapshotd.capture.state import CaptureStats
from snapshotd.capture.userindex import UserIndex, entries_under, holds_entries
from snapshotd.capture.walker import Walker
from snapshotd.git.process import run_git_sync
from snapshotd.paths import folders_above
from snapshotd.store.identity import WorktreeInfo

MAX_UNKNOWN_PATHS = 2000  # more new paths than this for ls-files and a full scan is cheaper
MAX_ASKED = 20_000  # more than this for check-ignore and a full scan is cheaper
MAX_ARGV_BYTES = 512 * 1024


class Builder(Protocol):
    """What this needs of the warm capture's tree builder (capture/warm.py's ``WarmBuilder``)."""

    walker: Walker
    index: pygit2.Index

    def known(self, path: str) -> bool: ...

    def apply(self, path: str, *, untracked: bool, keep_if_missing: bool = False) -> None: ...

    def drop(self, path: str) -> None: ...


class Known(Protocol):
    """What this needs of the warm state (capture/warm.py's ``WarmState``): what it knows of paths."""

    user: UserIndex
    flagged: set[str]
    not_ignored: set[str]
    ignored: Ignores

    @property
    def flags_ignore_rules(self) -> bool: ...



def outermost(paths: list[str]) -> list[str]:
    """``paths`` without those that lie inside another of them, sorted.

    Git answers for a folder's whole content; a pathspec below it as well
    would make ``ls-files`` look into the folder even when it is a nested
    repository (and then list neither the repository nor its files).
    """
    given = set(paths)
    return sorted(path for path in given if not any(folder in given for folder in folders_above(path)))


def apply_new_paths(
    builder: Builder,
    warm: Known,
    info: WorktreeInfo,
    oracle: IgnoreOracle | None,
    unknown: dict[str, os.stat_result],
    stats: CaptureStats,
) -> bool:
    """Apply what git takes of the paths the warm state has not met (with their lstat); False when so
    many are left for ``ls-files`` that a full scan is cheaper.

    check-ignore is not asked where the worktree holds the daemon's own data (``ls-files`` leaves it
    out by an exclude check-ignore has no option for) or the index flags a ``.gitignore`` (git reads
    it from the index, which check-ignore ``--no-index`` does not)."""
    unknown = {path: unknown[path] for path in outermost(list(unknown))}
    excludes = own_data_excludes(info)
    try:
        if oracle is not None and not excludes and not warm.flags_ignore_rules and len(unknown) <= MAX_ASKED:
            unknown = _settle_by_check_ignore(builder, warm, info, oracle, unknown, stats)
        if len(unknown) > MAX_UNKNOWN_PATHS or sum(len(p) + 1 for p in unknown) > MAX_ARGV_BYTES:
            return False
        if unknown:
            _apply_listing(builder, warm, info, list(unknown), excludes, stats)
    except AttributesMetAnew:
        return False
    return True


class AttributesMetAnew(Exception):
    """A folder met anew holds a ``.gitattributes``: no event named it, so only a full scan reads its rules
    (a folder moved in whole, or made and filled before its watch)."""


def holds_tracked(builder: Builder, user: UserIndex, folder: str) -> bool:
    """Whether the last tree or the user's index has an entry at or inside ``folder`` (then ``ls-files`` lists it)."""
    return builder.known(folder) or holds_entries(builder.index, folder) or user.has_saved_under(folder)


def _settle_by_check_ignore(
    builder: Builder,
    warm: Known,
    info: WorktreeInfo,
    oracle: IgnoreOracle,
    unknown: dict[str, os.stat_result],
    stats: CaptureStats,
) -> dict[str, os.stat_result]:
    """Apply or leave out the unknown paths check-ignore settles (capture/ignores.py); those left for ``ls-files``."""
    asked = [path for path in unknown if not path.startswith(":")]
    if not asked:
        return unknown
    started, target = oracle.started, git_target(info)
    try:
        answers = oracle.ask(target, warm, asked)
        if answers is None:
            return unknown
        left = {}
        for path, st in unknown.items():
            folder = stat.S_ISDIR(st.st_mode)
            ignored = answers.get(path)
            if ignored:
                warm.ignored.add(path, folder=folder)
                if folder and holds_tracked(builder, warm.user, path):
                    left[path] = st  # tracked files inside: ls-files says which
            elif ignored is None:
                left[path] = st
            elif not folder and (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                if holds_entries(builder.index, path.rpartition("/")[0]):
                    warm.not_ignored.add(path)
                    builder.apply(path, untracked=True)
                else:
                    left[path] = st
            elif folder and not holds_tracked(builder, warm.user, path):
                listing = list_new_folder(builder.walker, oracle, target, warm, path)
                if listing is None:
                    left[path] = st
                    continue
                if listing.attributes:
                    raise AttributesMetAnew(path)
                for inner, inner_is_folder in listing.ignored:
                    warm.ignored.add(inner, folder=inner_is_folder)
                for inner in listing.files:
                    warm.not_ignored.add(inner)
                    builder.apply(inner, untracked=True)
            else:
                left[path] = st
        return left
    finally:
        stats.processes += oracle.started - started


def _apply_listing(
    builder: Builder, warm: Known, info: WorktreeInfo, unknown: list[str], excludes: list[str], stats: CaptureStats
) -> None:
    """Apply what ``git ls-files`` lists at the unknown paths: the untracked files it does not ignore and
    the tracked ones, in folders and below, and drop what it no longer lists there."""
    listing = run_git_sync(
        git_target(info),
        ["ls-files", "-z", "-t", "-c", "-o", "--exclude-standard", *excludes, "--", *unknown],
        env_extra={"GIT_LITERAL_PATHSPECS": "1"},
    )
    stats.processes += 1
    listed: dict[str, bool] = {}
    for record in listing.split(b"\0"):
        if len(record) > 2:
            listed[os.fsdecode(record[2:])] = record[:1] == b"?"
    folders = set(unknown)
    for path in listed:
        if is_attributes(path) and any(folder in folders for folder in folders_above(path)):
            raise AttributesMetAnew(path)
    for path in unknown:
        st = builder.walker.lstat(path)
        if st is not None and stat.S_ISDIR(st.st_mode):
            for inner in entries_under(builder.index, path):
                if inner not in listed:
                    builder.drop(inner)
            if path in builder.index:  # a file that became a folder
                builder.drop(path)
    for raw, untracked in sorted(listed.items()):
        nested = raw.endswith("/")
        path = raw.rstrip("/") if nested else raw
        if untracked and not nested:
            warm.not_ignored.add(path)
        builder.apply(path, untracked=untracked and not warm.user.has(path), keep_if_missing=path in warm.flagged)
