"""Identifying a worktree met before without reading again what has not changed since, by stat.

Every request names its worktree by a path, and :func:`~snapshotd.store.identity.identify`
then reads the records, the repository's object format, the worktree's id
file and git's back link, and checks its private folders: about 2 ms of the
daemon's one Python core per request, 250 sessions asking several times a
second. Here its answer is kept with the stat data of each thing it read
(files by identity, size, mtime and ctime; folders by identity, mode and
owner, which is what its checks look at) and given again while all of them
are unchanged. It is kept only when a run changed none of them (one that
wrote the record or claimed an id is followed by another that finds them in
place), and a file changed in any way (git and snapshotd replace them by
rename: a new inode) or a folder swapped, made another's or opened to others
sends the next request through :func:`identify` again, with all its checks.
"""

from __future__ import annotations

import os
import stat

from snapshotd.store.identity import Located, Records, WorktreeInfo, identify

__all__ = ["Identities"]

MAX_KEPT = 4096  # worktrees whose answer is kept; past that all are forgotten (each is read again once)

StatKey = tuple[int, ...] | None


def _stat_key(path: str) -> StatKey:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):  # its entries come and go (temporary files): only what is checked of it
        return (st.st_dev, st.st_ino, st.st_mode, st.st_uid)
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def signature(located: Located, info: WorktreeInfo, records: Records) -> tuple[StatKey, ...]:
    """The stat data of everything :func:`identify` reads for ``located``, whose answer was ``info``."""
    paths = [
        located.root,
        os.path.join(located.root, ".git"),
        str(records.home),
        str(records.path),
        os.path.dirname(info.state_dir),
        info.state_dir,
        os.path.join(info.state_dir, "tmp"),
        info.store_dir,
    ]
    if located.git_dir is not None:
        common = located.common_dir or located.git_dir
        paths += [
            located.git_dir,
            os.path.join(located.git_dir, "snapshotd"),
            os.path.join(located.git_dir, "snapshotd", "id"),
            os.path.join(located.git_dir, "gitdir"),
            os.path.join(common, "config"),
        ]
    else:
        paths.append(os.path.join(info.store_dir, "HEAD"))
    return tuple(_stat_key(path) for path in paths)


class Identities:
    """:func:`identify` for one engine, answering again from what it kept while nothing it read changed."""

    def __init__(self, records: Records) -> None:
        self.records = records
        self._kept: dict[Located, tuple[tuple[StatKey, ...] | None, WorktreeInfo]] = {}

    def identify(self, located: Located) -> WorktreeInfo:
        """The worktree ``located`` names, with its stable id (created on first sight)."""
        entry = self._kept.get(located)
        before = None
        if entry is not None:
            kept, info = entry
            before = signature(located, info, self.records)
            if kept is not None and before == kept:
                return info
        info = identify(located, self.records)
        after = signature(located, info, self.records)
        steady = entry is not None and entry[1] == info and before == after
        if len(self._kept) >= MAX_KEPT:
            self._kept.clear()
        self._kept[located] = (after if steady else None, info)
        return info
