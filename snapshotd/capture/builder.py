"""Building the tree: each path's file state applied to an in-memory index, hashed in-process.

``TreeBuilder`` records a path as ``git add`` would (mode, symlink, gitlink,
the size cap for untracked files) and hashes its bytes with libgit2, or hands
files whose content git's filters may change to one ``hash-object`` run.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable
from functools import partial

import pygit2

from snapshotd.capture.asis import NotAsIs
from snapshotd.capture.checkin import Pending, hash_through_git, is_attributes
from snapshotd.capture.eol import LineEndings, to_git, unruled
from snapshotd.capture.gitlinks import commit_at
from snapshotd.capture.state import (
    SKIP_NO_COMMIT,
    SKIP_REFUSED_NAME,
    SKIP_SPECIAL,
    SKIP_TOO_LARGE,
    CaptureStats,
    FileState,
    Settings,
    StatCache,
)
from snapshotd.capture.userindex import index_blob
from snapshotd.capture.walker import CHANGED, Walker
from snapshotd.errors import GitError
from snapshotd.git import loose
from snapshotd.git.modes import MODE_EXEC, MODE_FILE, MODE_GITLINK, MODE_LINK
from snapshotd.store.identity import WorktreeInfo

STREAM_ABOVE = 32 * 1024 * 1024  # larger files are hashed by libgit2 straight from disk


def open_repo(info: WorktreeInfo) -> pygit2.Repository:
    """The worktree's store, opened by libgit2 without searching upwards."""
    return pygit2.Repository(info.store_dir, pygit2.enums.RepositoryOpenFlag.NO_SEARCH)


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


_ANY_BLOB = pygit2.Oid(hex="e69de29bb2d1d6434b8b29ae775ad8c2e48c5391")


_GITMODULES_ALIAS = re.compile(r"\.gitmodules|gitmod~[1-4]|gi7eba~[1-9][0-9]*")


def git_refuses(path: str, *, link: bool = False) -> bool:
    """Whether git will not record ``path`` (a symbolic link with ``link``) in an index.

    libgit2 checks a name as git's ``verify_path`` does when an entry is added
    (the ``.git`` folder in any case and its NTFS and HFS+ aliases: ``.GIT/x``,
    ``.git.``, ``git~1/x``); git also refuses a symbolic link named
    ``.gitmodules`` in any case, or one of its NTFS short names. ``git add -A``
    stops on such a name; a capture leaves the file out and names it.
    """
    if link:
        name = path.rpartition("/")[2].lower().partition(":")[0].rstrip(" .")
        if _GITMODULES_ALIAS.fullmatch(name):
            return True
    if path.isascii() and "git" not in path.lower():
        return False  # every name libgit2 refuses here holds "git" or (HFS+ aliases) other than ASCII
    try:
        pygit2.Index().add(pygit2.IndexEntry(path, _ANY_BLOB, MODE_FILE))  # type: ignore[arg-type]  # an int mode; pygit2's stub says FileMode
    except pygit2.GitError:
        return True
    return False


def gitlink_head(walker: Walker, path: str) -> pygit2.Oid | None:
    """The commit the nested repository at ``path`` has checked out, read by descriptor; None for none (see gitlinks)."""
    text = commit_at(walker, path)
    return pygit2.Oid(hex=text) if text is not None and len(text) == 40 else None


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
        *,
        flagged: set[str] | None = None,
        conflict_ours: dict[str, pygit2.Oid] | None = None,
        line_endings: LineEndings | None = None,
    ) -> None:
        self.repo = repo
        self.info = info
        self.index = index
        self.settings = settings
        self.cache = cache
        self.stats = stats
        self.size_cap = size_cap
        self.fence_ns = fence_ns
        self.walker = Walker(info.path)
        self.odb = repo.odb
        self.batch = loose.Batch(repo.path)  # the blobs hashed here: one pack when there are many
        self.flagged = flagged or set()  # the user's assume-unchanged and skip-worktree entries
        self.conflict_ours = conflict_ours or {}  # "ours" of each conflicted path, read before the conflicts go
        self._git_hash: list[tuple[Pending, os.stat_result, int]] = []
        self.line_endings = line_endings  # files with a CR byte converted here, not by git (capture/eol.py)
        self.linked: set[str] = set()  # files met with several names (hard links), for the warm state
        self.linked_files: set[tuple[int, int]] = set()  # their (device, inode)

    def _entry_mode(self, path: str) -> int | None:
        entry = self._get(path)
        return None if entry is None else int(entry.mode)

    def _get(self, path: str) -> pygit2.IndexEntry | None:
        try:
            return self.index[path]
        except (KeyError, ValueError):
            return None

    def _users_entry(self, path: str) -> tuple[pygit2.Oid, int] | None:
        """The id and mode of the user's index entry at ``path``: the in-memory index holds it still, as each path is applied once."""
        entry = self._get(path)
        return None if entry is None else (entry.id, int(entry.mode))

    def _keep_users_gitlink(self, path: str) -> None:
        """A submodule folder with nothing checked out: git keeps the user's gitlink there, as it is."""
        users = self._users_entry(path)
        if users is None or users[1] != MODE_GITLINK:
            self._remove(path)
            return
        now = self._get(path)
        if now is None or (now.id, int(now.mode)) != users:
            self.index.add(pygit2.IndexEntry(path, users[0], MODE_GITLINK))  # type: ignore[arg-type]  # an int mode; pygit2's stub says FileMode

    def _remove(self, path: str) -> None:
        with contextlib.suppress(OSError, KeyError, ValueError, pygit2.GitError):
            self.index.remove(path)

    def _basis(self, path: str) -> pygit2.Oid | None:
        """The user's index blob at ``path``, which git's conversion of the file reads (see capture/checkin.py).

        The in-memory index still holds the user's entry when a path is hashed:
        each path is applied once.
        """
        if path in self.conflict_ours:
            return self.conflict_ours[path]
        return index_blob(self.index, path)

    def _kept_attributes(self) -> list[tuple[str, pygit2.Oid]]:
        """The user's ``.gitattributes`` entries that stand with no file on disk (flagged ones), for git's conversion."""
        kept = []
        for path in sorted(path for path in self.flagged if is_attributes(path)):
            if self.walker.lstat(path) is None:
                oid = self._basis(path)
                if oid is not None:
                    kept.append((path, oid))
        return kept

    def _hash(self, path: str, st: os.stat_result, mode: int) -> pygit2.Oid | None:
        basis = self._basis(path) if self.settings.filters else None
        cached = self.cache.lookup(path, st, basis)
        if cached is not None and cached in self.odb:  # a gc of the store may have pruned it
            return cached
        if mode == MODE_LINK and stat.S_ISLNK(st.st_mode):
            target = self.walker.readlink(path)
            if target is None:
                return None  # no longer a link: the watcher names the path again
            oid = loose.write_object(self.repo.path, "blob", target, self.odb, self.batch)
        elif self.settings.filters and self.settings.content_filters:
            self._git_hash.append((Pending(path, basis), st, mode))
            return None
        else:
            try:
                stable = self._stable_blob(path, st, as_is_only=self.settings.filters)
            except NotAsIs:  # a CR byte git's end-of-line conversion may remove (capture/asis.py)
                self._git_hash.append((Pending(path, basis), st, mode))
                return None
            if stable is None:
                return None
            oid = stable
        self.stats.hashed += 1
        self.cache.store(path, st, self.fence_ns, oid)
        return oid

    def _write_blob(
        self, path: str, st: os.stat_result, as_is_only: bool = False, convert: Callable[[bytes], bytes] | None = None
    ) -> pygit2.Oid | None:
        """Store the bytes of the regular file ``st`` describes as a blob; None if another file is there now.

        ``as_is_only``: raise :class:`NotAsIs` instead for a file holding a CR
        byte, or too large to read at once, which git's conversion may change.
        ``convert``: store what it makes of the bytes (NotAsIs for a file too large).

        The file is opened from its folder's descriptor (see :class:`Walker`),
        neither following a link nor blocking (a FIFO swapped in since the
        lstat would hang it for good), and fstat checks that the descriptor is
        that same regular file before a byte is read. The blob object is
        written only if it is new.
        """
        fd = self.walker.open_file(path)
        if fd is None:
            return None
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                return None
            with os.fdopen(fd, "rb", closefd=False) as handle:
                if opened.st_size > STREAM_ABOVE:
                    if as_is_only or convert is not None:
                        raise NotAsIs(path)
                    with loose.written_elsewhere(self.repo.path):  # libgit2 writes it
                        return self.repo.create_blob_fromiobase(handle)
                data = handle.read()
        finally:
            os.close(fd)
        if as_is_only and b"\r" in data:
            raise NotAsIs(path)
        if convert is not None:
            data = convert(data)
        return loose.write_object(self.repo.path, "blob", data, self.odb, self.batch)

    def _stable_blob(
        self, path: str, st: os.stat_result, as_is_only: bool = False, convert: Callable[[bytes], bytes] | None = None
    ) -> pygit2.Oid | None:
        """Hash a file, again if it changed while being read, so the blob is never torn.

        None when it is gone or no longer a regular file.
        """
        oid = None
        for _ in range(5):
            try:
                oid = self._write_blob(path, st, as_is_only, convert)
                after = self.walker.lstat(path)
            except OSError as exc:
                if exc.errno in CHANGED:  # gone or replaced meanwhile
                    return None
                raise  # a full disk or an unreadable file: the capture fails, it never leaves the file out
            if after is None or not stat.S_ISREG(after.st_mode):
                return None
            if oid is not None and FileState.of(after) == FileState.of(st):
                return oid
            st = after
        return oid

    def apply(self, path: str, *, untracked: bool, keep_if_missing: bool = False) -> None:
        """Record ``path`` as it is on disk now (or drop it if it is gone)."""
        st = self.walker.lstat(path)
        if st is not None and st.st_nlink > 1 and stat.S_ISREG(st.st_mode):
            self.linked.add(path)
            self.linked_files.add((st.st_dev, st.st_ino))
        if st is None:
            if not keep_if_missing:
                self._remove(path)
                self.cache.forget(path)
            return
        previous = self._entry_mode(path)
        if untracked and git_refuses(path, link=stat.S_ISLNK(st.st_mode)):
            self.stats.skip(path + "/" if stat.S_ISDIR(st.st_mode) else path, SKIP_REFUSED_NAME)
            return
        if stat.S_ISDIR(st.st_mode):
            if previous == MODE_GITLINK or untracked:
                head = gitlink_head(self.walker, path)
                if head is not None:
                    self.index.add(pygit2.IndexEntry(path, head, MODE_GITLINK))  # type: ignore[arg-type]  # an int mode; pygit2's stub says FileMode
                elif untracked:
                    self.stats.skip(path + "/", SKIP_NO_COMMIT)
                else:
                    self._keep_users_gitlink(path)
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
            self.index.add(pygit2.IndexEntry(path, oid, mode))  # type: ignore[arg-type]  # an int mode; pygit2's stub says FileMode

    def close(self) -> None:
        """Let go of the worktree's folders (their descriptors)."""
        self.walker.close()

    def finish(self) -> str:
        """Write the blobs hashed here, hash what needs git's filters, then write the tree."""
        if self._git_hash and self.line_endings is not None:
            self._convert_here(self.line_endings)
        self.batch.write()
        if self._git_hash:
            ids = self._hash_with_git()
            for (item, st, mode), oid in zip(self._git_hash, ids, strict=True):
                if oid is None:
                    continue
                self.stats.hashed += 1
                self.cache.store(item.path, st, self.fence_ns, oid, basis=item.basis)
                self.index.add(pygit2.IndexEntry(item.path, oid, mode))  # type: ignore[arg-type]  # an int mode; pygit2's stub says FileMode
            self._git_hash.clear()
        if isinstance(self.index, pygit2.Index):  # libgit2 writes the trees (a recording index edits them here)
            with loose.written_elsewhere(self.repo.path):
                return str(self.index.write_tree(self.repo))
        return str(self.index.write_tree(self.repo))

    def _convert_here(self, line_endings: LineEndings) -> None:
        """Hash here the files left for git whose bytes check-attr's rules say only line endings may change
        (capture/eol.py); the rest stay for git."""
        if self._kept_attributes():
            return  # git reads those from the index: check-attr, run with none, would not
        started = line_endings.oracle.started
        actions = line_endings.actions([item.path for item, _, _ in self._git_hash])
        self.stats.processes += line_endings.oracle.started - started
        if actions is None:
            return
        left = []
        for item, st, mode in self._git_hash:
            if item.path not in actions:
                left.append((item, st, mode))
                continue
            chosen = actions[item.path]
            if chosen is None:
                chosen = unruled(self.settings.autocrlf)
            try:
                oid = self._stable_blob(item.path, st, convert=partial(to_git, chosen=chosen,
                                                                        index_blob=partial(self._blob, item.basis)))
            except NotAsIs:
                left.append((item, st, mode))
                continue
            if oid is not None:
                self.stats.hashed += 1
                self.cache.store(item.path, st, self.fence_ns, oid, basis=item.basis)
                self.index.add(pygit2.IndexEntry(item.path, oid, mode))  # type: ignore[arg-type]  # an int mode; pygit2's stub says FileMode
        self._git_hash = left

    def _blob(self, oid: pygit2.Oid | None) -> bytes | None:
        """A blob's bytes from the store (None for no blob); NotAsIs when the store lacks it (git reads it then)."""
        if oid is None:
            return None
        try:
            return bytes(self.odb.read(oid)[1])
        except (KeyError, ValueError, pygit2.GitError) as exc:
            raise NotAsIs(str(oid)) from exc

    def _is_file(self, path: str) -> bool:
        st = self.walker.lstat(path)
        return st is not None and stat.S_ISREG(st.st_mode)

    def _hash_with_git(self) -> list[pygit2.Oid | None]:
        """One git run over the files git's filters may change (see capture/checkin.py): their ids, in order.

        A file deleted since it was listed gets no id (git drops it from the
        private index), as one that vanishes while hashed in-process; one that
        is no longer a file makes git fail, and git is asked once more for the
        files still there, the other left as the index has it.
        """
        for attempt in range(2):
            if not self._git_hash:
                return []
            self.stats.processes += 1
            try:
                with loose.written_elsewhere(self.repo.path):  # git writes the blobs
                    return hash_through_git(
                        self.info, [item for item, _, _ in self._git_hash], self._kept_attributes(), self.walker
                    )
            except GitError:
                still = [entry for entry in self._git_hash if self._is_file(entry[0].path)]
                if attempt or len(still) == len(self._git_hash):
                    raise
                self._git_hash = still
        raise AssertionError("unreachable")
