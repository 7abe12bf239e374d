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
import secrets
import time
from dataclasses import replace
from typing import cast

import pygit2
import trio

from snapshotd.capture.asis import names_content_filters
from snapshotd.capture.builder import TreeBuilder, open_repo
from snapshotd.capture.fallback import build_git_only, build_with_git
from snapshotd.capture.gitlinks import note_changes
from snapshotd.capture.linked import other_names
from snapshotd.capture.resident import Resident
from snapshotd.capture.scan import (
    LS_FILES,
    LoadedIndex,
    git_target,
    load_index,
    own_data_excludes,
    parse_listing,
    seed_index,
)
from snapshotd.capture.state import (
    CaptureResult,
    CaptureStats,
    Settings,
    StatCache,
    attributes_files,
    conversion_rules,
    git_config,
    listed_attributes,
    make_fence,
)
from snapshotd.capture.treeedit import RecordingIndex
from snapshotd.capture.userindex import UserIndex
from snapshotd.capture.walker import Walker
from snapshotd.capture.warm import dirty_under_removed_attributes
from snapshotd.fsutil import checked_private_folder
from snapshotd.git import loose
from snapshotd.git.modes import MODE_GITLINK
from snapshotd.git.process import run_git
from snapshotd.git.repository import libgit2_opens
from snapshotd.store.identity import WorktreeInfo
from snapshotd.threads import thread_limiter


def _lacking_objects(index: pygit2.Index, repo: pygit2.Repository) -> set[str]:
    """The paths whose index entry names a blob the store lacks (``update-index --cacheinfo`` of an id never
    written): ``git add -A`` hashes such a file anew, as its stat data cannot match, and writes its blob."""
    odb = repo.odb
    return {entry.path for entry in index if int(entry.mode) != MODE_GITLINK and entry.id not in odb}


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
    resident: Resident | None,
) -> CaptureResult:
    kept = resident.store(info) if resident is not None else None
    repo = kept if kept is not None else open_repo(info)
    modified, removed, untracked, flagged = parse_listing(listing)
    if isinstance(loaded, str):
        stats.fallback = loaded
        return build_with_git(info, index_path, modified | removed, untracked, flagged, stats, size_cap)
    index = loaded.index
    flagged |= loaded.flagged
    modified |= {path for path in hints if path in index}
    modified |= dirty_under_removed_attributes(index, info.path, removed, flagged, index_path) - removed
    config = git_config(info)
    settings = Settings.read(config, listing, info, loaded.tracked_attributes)
    if settings.filters:
        on_disk = listed_attributes(listing, flagged)
        with Walker(info.path) as walker:
            named = names_content_filters(repo, config, attributes_files(info), index, loaded.attributes, on_disk,
                                          walker)
        settings = replace(settings, content_filters=named)
    cache.follow_rules(conversion_rules(info, listing, loaded.tracked_attributes, flagged))
    user = UserIndex(index)  # the user's index as read: what the capture changes of it is kept there
    conflicts = index.conflicts
    conflict_ours: dict[str, pygit2.Oid] = {}
    if conflicts is not None:
        conflicted = set()
        for ancestor, ours, theirs in conflicts:
            for side in (ancestor, ours, theirs):
                if side is not None:
                    conflicted.add(side.path)
            if ours is not None and int(ours.mode) != MODE_GITLINK:
                conflict_ours[ours.path] = ours.id
        for path in conflicted:
            user.save(path)
            del conflicts[path]
        modified |= conflicted
    # The index's own tree comes from its cache-tree extension (milliseconds when
    # valid); the changes are then edited in along their paths only.
    with loose.written_elsewhere(repo.path):  # libgit2 writes the trees an invalid cache-tree lacks
        try:
            base = str(index.write_tree(repo))
        except pygit2.GitError:
            lacking = _lacking_objects(index, repo)
            if not lacking:
                raise
            for path in lacking:
                user.save(path)
                index.remove(path)
            modified |= lacking
            base = str(index.write_tree(repo))
    recording = RecordingIndex(index, base, user)
    builder = TreeBuilder(  # the recording index stands for the index it wraps
        repo, info, cast(pygit2.Index, recording), settings, cache, stats, size_cap, fence_ns, flagged=flagged, conflict_ours=conflict_ours
    )
    try:  # in path order, so the folders held open are those near the next path
        for path in sorted(modified | removed):
            builder.apply(path, untracked=False, keep_if_missing=path in flagged)
        for path in sorted(flagged - modified - removed):
            builder.apply(path, untracked=False, keep_if_missing=True)
        for path in sorted(untracked):
            nested = path.endswith("/")
            builder.apply(path.rstrip("/") if nested else path, untracked=True)
        tree = builder.finish()
        note_changes(loaded.gitlinks, recording.changes)
        if builder.linked:  # their other names too, each re-checked by stat at every warm capture
            builder.linked |= other_names(index, builder.linked_files, builder.walker)
    finally:
        builder.close()
    return CaptureResult(
        tree=tree, stats=stats, index=index, flagged=flagged, user=user, settings=settings,
        gitlinks=loaded.gitlinks, linked=builder.linked,
    )


def _seed(info: WorktreeInfo, index_path: str) -> tuple[bool, int]:
    """Copy the user's index to ``index_path`` and take the racy fence; on a worker thread, as both touch the disk.

    Returns whether there was an index to copy, and the fence.
    """
    tmp_dir = checked_private_folder(os.path.dirname(index_path))
    seeded = info.git_dir is not None and seed_index(os.path.join(info.git_dir, "index"), index_path)
    return seeded, make_fence(tmp_dir)


async def capture_cold(
    info: WorktreeInfo,
    cache: StatCache,
    size_cap: int,
    *,
    hints: set[str] | None = None,
    resident: Resident | None = None,
) -> CaptureResult:
    """One full capture: one ``ls-files`` process, hashing only what it names.

    ``hints`` are tracked paths known to have been written (by the watcher):
    they are re-examined even where git's stat check, which compares
    timestamps only to the second, calls them clean. ``resident`` is the
    worktree's open store, which decided its back-end once (see :mod:`.resident`).
    """
    started = time.perf_counter()
    stats = CaptureStats(scan="full")
    tmp_dir = os.path.join(info.state_dir, "tmp")
    index_path = os.path.join(tmp_dir, f"index-{os.getpid()}-{secrets.token_hex(6)}")
    try:
        seeded, fence_ns = await trio.to_thread.run_sync(_seed, info, index_path, limiter=thread_limiter)
        if not (resident.in_process(info) if resident is not None else libgit2_opens(info.store_dir)):
            # Hashing, flags and the tree all by git; a missing index file is an empty index.
            listing = await run_git(git_target(info), [*LS_FILES, *own_data_excludes(info), "-c"], index_file=index_path)
            stats.processes += 1
            result = await trio.to_thread.run_sync(
                build_git_only, info, index_path, listing, cache, stats, size_cap, fence_ns, limiter=thread_limiter
            )
            stats.ms = (time.perf_counter() - started) * 1000
            return result
        seed = index_path if seeded else None
        loaded: list[LoadedIndex | str] = []

        async def load() -> None:
            loaded.append(await trio.to_thread.run_sync(load_index, seed, limiter=thread_limiter))

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
            _build, info, seed, loaded[0], listing, cache, stats, size_cap, fence_ns, hints or set(), resident,
            limiter=thread_limiter,
        )
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(index_path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(index_path + ".lock")
    stats.ms = (time.perf_counter() - started) * 1000
    return result

