"""The capture through git alone, for indexes and repositories libgit2 cannot read.

A split or sparse index, or a SHA-256 repository, gets the same tree from
``update-index`` on the private index copy and ``write-tree``; files git
hashed before and unchanged since go in as known entries. git opens files by
path, so its work tree is a private copy of the paths it updates, read by
descriptor (capture/mirror.py): a folder swapped for a link while it runs is
never followed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from snapshotd.capture.builder import git_refuses
from snapshotd.capture.checkin import NO_SAFECRLF, is_attributes
from snapshotd.capture.gitlinks import commit_at
from snapshotd.capture.mirror import Mirror
from snapshotd.capture.scan import flag_kinds, git_target, parse_listing
from snapshotd.capture.state import (
    SKIP_NO_COMMIT,
    SKIP_REFUSED_NAME,
    SKIP_TOO_LARGE,
    CaptureResult,
    CaptureStats,
    FileState,
    StatCache,
    conversion_rules,
)
from snapshotd.capture.walker import Walker
from snapshotd.git import loose
from snapshotd.git.format import object_format
from snapshotd.git.process import GitTarget, run_git_sync
from snapshotd.paths import folders_above
from snapshotd.store.identity import WorktreeInfo


def _nul_list(paths: Iterable[str]) -> bytes:
    return b"".join(os.fsencode(path) + b"\0" for path in paths)


MAX_CACHEINFO_BYTES = 256 * 1024  # known untracked entries given on update-index's command line


def build_with_git(
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
    with loose.written_elsewhere(info.store_dir), Walker(info.path) as walker:  # git writes every object
        return _build_with_git(
            info, walker, index_path, changed, untracked, flagged, stats, size_cap, flag_listing, cache, fence_ns
        )


def _build_with_git(
    info: WorktreeInfo,
    walker: Walker,
    index_path: str | None,
    changed: set[str],
    untracked: set[str],
    flagged: set[str],
    stats: CaptureStats,
    size_cap: int,
    flag_listing: bytes | None,
    cache: StatCache | None,
    fence_ns: int,
) -> CaptureResult:
    target = git_target(info)
    if flag_listing is None:
        flag_listing = run_git_sync(target, ["ls-files", "-z", "-v"], index_file=index_path)
        stats.processes += 1
    skip, valid = flag_kinds(flag_listing)
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
    tracked = set(paths)  # a folder at a tracked path is copied: a gitlink, or a file turned folder
    commits: dict[str, str] = {}  # each untracked nested repository's commit, read by descriptor
    for raw in sorted(untracked):
        path = raw.rstrip("/")
        st = walker.lstat(path)
        if st is None:
            continue
        if git_refuses(path, link=stat.S_ISLNK(st.st_mode)):  # update-index would pass over it in silence
            stats.skip(raw, SKIP_REFUSED_NAME)
            continue
        if raw.endswith("/"):
            commit = commit_at(walker, path)
            if commit is None:
                stats.skip(raw, SKIP_NO_COMMIT)
                continue
            commits[path] = commit
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
        stats.hashed += len(fresh) if cache is not None else len(listed)
        with Mirror(walker, os.path.join(info.state_dir, "tmp")) as mirror:
            for path in listed:
                mirror.copy_attributes_above(path)
                copied = mirror.copy(path, folder=path in tracked or path in commits, commit=commits.get(path))
                if path in fresh and (copied is None or FileState.of(copied) != FileState.of(fresh[path])):
                    del fresh[path]  # changed while copied: hashed again next time
            run_git_sync(
                GitTarget(git_dir=target.git_dir, work_tree=mirror.path),
                ["update-index", "-z", "--add", "--remove", "--replace", "--ignore-skip-worktree-entries", *known, "--stdin"],
                index_file=index_path,
                input=_nul_list(listed),
                env_extra=NO_SAFECRLF,
            )
        stats.processes += 1
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


def build_git_only(
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
    # The listing (-c) names every .gitattributes; the user's index counts too: git's conversion
    # reads its blob at each path (the safer autocrlf), and this cache keeps no blob per entry.
    cache.follow_rules(conversion_rules(info, listing, tracked_attributes=True, flagged=flagged))
    return build_with_git(
        info, index_path, modified | removed | _under_removed_attributes(listing, removed, flagged), untracked,
        flagged, stats, size_cap, flag_listing=listing, cache=cache, fence_ns=fence_ns,
    )


def _under_removed_attributes(listing: bytes, removed: set[str], flagged: set[str]) -> set[str]:
    """The tracked paths below a ``.gitattributes`` deleted from disk (see warm.dirty_under_removed_attributes).

    ``update-index`` removes that file first (paths go in sorted) and then
    compares each of these as ``git add -A`` does; ``ls-files -m`` compared
    them under the index's copy.
    """
    folders = [path.rpartition("/")[0] for path in removed if is_attributes(path) and path not in flagged]
    if not folders:
        return set()
    prefixes = tuple(folder + "/" for folder in folders if folder)
    found = set()
    for record in listing.split(b"\0"):
        if record[:2] == b"H ":
            path = os.fsdecode(record[2:])
            if "" in folders or path.startswith(prefixes):
                found.add(path)
    return found

