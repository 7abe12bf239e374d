"""The folders git ignores whole are left unwatched: ``node_modules``, ``target/``, a virtualenv.

Nothing under such a folder can change a capture: ``ls-files -o`` never
enters an excluded folder, and ``git add -A`` takes nothing from one. Yet its
watches count against the user's ``fs.inotify.max_user_watches`` and the
worktree's ceiling (a ``node_modules`` of 60,000 folders left the worktree
unwatched, every capture a full scan), and an install or a build inside it
floods the watcher with events. So the walk leaves a folder out when:

- git ignores it: asked of ``git check-ignore`` (capture/ignores.py), which
  matches as ``ls-files`` does, and only for a folder whose name some ignore
  pattern's last part could match (:class:`PatternWords`, read as the walk
  goes: a cheap test that can only ask too often, never too seldom);
- and the user's index has no entry at or under it (:class:`TrackedFolders`):
  a tracked file in an ignored folder is still a tracked file.

A folder left out is decided again before the next full scan whenever the
rules or the user's index may have changed (a ``.gitignore`` event, the
stat data of the rule files and the index); if one no longer qualifies, the
whole worktree is walked again under the new rules before that scan (a rare
event: an edit of the rules), which lists whatever was written there
meanwhile; a watched folder git now ignores whole loses its watches. A folder
moved in whole is asked of a check-ignore that has not read the rules of an
earlier folder at that path. When git cannot answer, the index cannot be read
in-process, or git would read a ``.gitignore`` from the index (skip-worktree),
nothing is left out.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from collections.abc import Iterable
from fnmatch import translate

import pygit2

from snapshotd.capture.ignores import IgnoreOracle
from snapshotd.capture.newpaths import outermost
from snapshotd.capture.scan import git_target, index_facts, read_index
from snapshotd.capture.userindex import holds_entries
from snapshotd.capture.warm import exclude_files, rule_sources, signature_of
from snapshotd.capture.watchpaths import descend, is_ignore_rules
from snapshotd.paths import is_git_dir_name
from snapshotd.store.identity import WorktreeInfo

MAX_RULES_BYTES = 1 << 20  # a larger ignore file makes every folder a question
MAX_WORDS = 10_000
_GLOB = re.compile(r"[*?\[]")


class PatternWords:
    """The last part of every ignore pattern met, to say which folder names could be ignored at all.

    Only ever a superset: a negation adds nothing, anchoring and "folders
    only" are not looked at, case is not either, and anything unclear
    (``foo/**``, a glob, an unreadable file) widens it. A folder whose name
    it rules out cannot be ignored, so the walk asks git of the others only.
    """

    def __init__(self) -> None:
        self.literal: set[str] = set()
        self.globs: set[str] = set()
        self.everything = False
        self._match: re.Pattern[str] | None = None

    def read(self, data: bytes) -> None:
        for raw in data.split(b"\n"):
            line = os.fsdecode(raw.rstrip(b"\r").rstrip(b" \t"))
            if not line or line.startswith(("#", "!")):
                continue
            parts = [part for part in line.split("/") if part and part != "**"]
            if not parts:
                self.everything = True
                continue
            word = parts[-1].lower().replace("\\", "")  # an escaped character stands for itself
            if _GLOB.search(word):
                self.globs.add(word)
                self._match = None
            else:
                self.literal.add(word)
        if len(self.literal) + len(self.globs) > MAX_WORDS:
            self.everything = True

    def read_file(self, path: str, dir_fd: int | None = None) -> None:
        """Read the patterns of one ignore file (not through a link); a file that cannot be read widens to all."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        except OSError:
            self.everything = True
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RULES_BYTES:
                self.everything = True
                return
            self.read(os.read(fd, MAX_RULES_BYTES + 1))
        except OSError:
            self.everything = True
        finally:
            os.close(fd)

    def could_match(self, name: str) -> bool:
        if self.everything:
            return True
        lowered = name.lower()
        if lowered in self.literal:
            return True
        if not self.globs:
            return False
        if self._match is None:
            self._match = re.compile("|".join(translate(glob_) for glob_ in sorted(self.globs)), re.IGNORECASE)
        return self._match.match(lowered) is not None


class TrackedFolders:
    """Whether the user's index has an entry at or under a folder, read again when the index file changes.

    Versions 2 and 3 of the index store every path whole, so a folder's name
    found nowhere in its bytes holds no entry; otherwise (and always for
    version 4, which keeps only what a path adds to the one before it)
    libgit2 reads it and answers exactly. ``unsure`` when neither can (a split
    index) or when it flags a ``.gitignore`` (git reads a skip-worktree one
    from the index): then nothing is left out. What is read is kept until
    :meth:`release` (after the first walk, and while the worktree is idle): a
    few megabytes of a big index held by every idle worktree would outweigh
    all else it keeps.
    """

    def __init__(self, info: WorktreeInfo) -> None:
        self._git_dir = info.git_dir
        self._common = info.common_dir or info.git_dir
        self._signature: tuple[int, int, int, int] | None = None
        self._whole_paths = True  # versions 2 and 3
        self._raw: bytes | None = None
        self._index: pygit2.Index | None = None
        self.unsure = False

    def refresh(self) -> None:
        """Look at the index again if its file changed."""
        if self._git_dir is None:
            return
        path = os.path.join(self._git_dir, "index")
        try:
            st = os.stat(path)
        except OSError:
            self._signature, self._raw, self._index, self.unsure = None, b"", None, False
            return
        signature = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
        if signature == self._signature:
            return
        self._signature, self._raw, self._index, self.unsure = signature, None, None, False
        folders = {self._git_dir, self._common or self._git_dir}
        if any(glob.glob(os.path.join(folder, "sharedindex.*")) for folder in folders):
            self.unsure = True
            return
        raw = self._read()
        if raw is None:
            return
        version = int.from_bytes(raw[4:8], "big") if len(raw) >= 8 else 2
        self._whole_paths = version in (2, 3)
        if version != 2:  # a flagged .gitignore: as WarmState.flags_ignore_rules, the warm path's rule
            self._load()
            self.unsure = self._index is None or any(map(is_ignore_rules, index_facts(self._index, raw)[0]))

    def release(self) -> None:
        """Let go of the index's bytes and entries until the next question (its signature is kept)."""
        if self._raw:
            self._raw = None
        self._index = None

    def _read(self) -> bytes | None:
        """The index file's bytes (read once until released); None, and ``unsure``, when it cannot be read."""
        if self._raw is None and self._git_dir is not None:
            try:
                with open(os.path.join(self._git_dir, "index"), "rb") as handle:
                    self._raw = handle.read()
            except OSError:
                self.unsure = True
        return self._raw

    def _load(self) -> None:
        if self._index is None and self._git_dir is not None:
            try:
                self._index = read_index(os.path.join(self._git_dir, "index"))
            except (pygit2.GitError, OSError):
                self.unsure = True

    def holds(self, folder: str) -> bool:
        """Whether the index has an entry at ``folder`` or inside it (always True while ``unsure``)."""
        if self.unsure or self._git_dir is None:
            return self.unsure
        if self._whole_paths:
            raw = self._read()
            if raw is None:
                return True
            if os.fsencode(folder) not in raw:
                return False
        self._load()
        index = self._index
        if index is None:
            return True
        at = pygit2.C.git_index_find(pygit2.ffi.NULL, index._index, os.fsencode(folder)) == 0
        return at or holds_entries(index, folder)


class _Rules:
    """The rules one set of decisions was made under (check-ignore is started anew for another)."""


class UnwatchedFolders:
    """The folders of one worktree that the watch leaves out because git ignores them whole.

    Used by the watcher's walks, one at a time on a worker thread; ``folders``
    holds the worktree-relative paths left out.
    """

    def __init__(self, info: WorktreeInfo) -> None:
        self.info = info
        self.folders: set[str] = set()
        self.kept: set[str] = set()  # folders git ignores that are watched for the tracked entries in them
        self.words = PatternWords()
        self.tracked = TrackedFolders(info)
        self._target = git_target(info)
        self._oracle = IgnoreOracle()
        self._rules = _Rules()
        self._basis: tuple[object, ...] | None = None  # the rules' stat data and the watcher's count of rule events
        self._decided: tuple[object, ...] | None = None  # the basis every folder left out was decided under
        self._changed: set[str] = set()  # ignore files events named since the words were last read

    def begin(self, rule_events: int, *, full: bool) -> None:
        """Before a walk: look at the rules again (their files' stat data too when ``full``), and start
        check-ignore anew if they may have changed."""
        signature = signature_of(rule_sources(self.info)) if full or self._basis is None else self._basis[0]
        basis = (signature, rule_events)
        self.tracked.refresh()
        if basis == self._basis:
            return
        self._basis, self._rules = basis, _Rules()
        for path in [*exclude_files(self.info), *self._changed]:
            self.words.read_file(path)
        self._changed.clear()

    def start_over(self, rule_events: int) -> None:
        """Before a walk of the whole worktree: every folder is decided anew, under the rules as they are now."""
        self.begin(rule_events, full=True)
        self.forget_under("")
        self._decided = self._basis

    def note_rules(self, path: str) -> None:
        """An event named the ignore file ``path`` (absolute): its words are read before the next decision."""
        if path.endswith("/.gitignore"):
            if len(self._changed) >= MAX_WORDS:
                self.words.everything = True
            else:
                self._changed.add(path)

    def to_watch(self, folder_fd: int | None, rel: str, names: list[str], rules: bool = False) -> list[str]:
        """Of the folders ``names`` in ``rel`` (open as ``folder_fd``, whose ``.gitignore`` is read when
        ``rules``), those the walk watches; the ones git ignores whole are kept in :attr:`folders`."""
        names = [name for name in names if descend(rel, name)]
        if rules and folder_fd is not None:
            self.words.read_file(".gitignore", dir_fd=folder_fd)
        if any(is_git_dir_name(part) for part in rel.split("/")):
            return names
        every = rel in self.kept  # git ignores the folder: each folder in it may be left out
        asked = {f"{rel}/{name}" if rel else name: name for name in names
                 if not is_git_dir_name(name) and (every or self.words.could_match(name))}
        if not asked or self.tracked.unsure:
            return names
        answers = self._oracle.ask(self._target, self._rules, list(asked))
        if answers is None:
            return names
        ignored = {path for path in asked if answers[path]}
        kept = {path for path in ignored if self.tracked.holds(path)}
        self.kept |= kept
        left_out = ignored - kept
        self.folders |= left_out
        return [name for name in names if (f"{rel}/{name}" if rel else name) not in left_out]

    def met_anew(self, rel: str) -> bool:
        """A folder appeared at ``rel``: whether to watch it. What was decided at or under it is past, and
        check-ignore starts anew if it had read ignore files there (a folder moved in brings its own)."""
        self.forget_under(rel)
        self._oracle.met_anew(rel)
        parent, _, name = rel.rpartition("/")
        return bool(self.to_watch(None, parent, [name]))

    def forget_under(self, rel: str) -> None:
        """Drop what was decided at ``rel`` and below it ("": everything); a walk there decides anew."""
        prefix = rel + "/"
        self.folders, self.kept = (
            {folder for folder in decided if rel and folder != rel and not folder.startswith(prefix)}
            for decided in (self.folders, self.kept)
        )

    def recheck(self, rule_events: int, root: str, watched: Iterable[str]) -> tuple[bool, list[str]]:
        """Before a full scan, if the rules or the index changed: whether a folder left out must now be
        watched (git no longer ignores it whole), and of the folders ``watched`` (absolute paths), the
        outermost ones git now ignores whole, left out from here on (their watches are the caller's to drop)."""
        try:
            self.begin(rule_events, full=True)  # a walk of new folders may have begun under new rules already
            if self._basis == self._decided:
                return False, []
            decisions = self._decide_again(root, watched)
            self._decided = self._basis
            return decisions
        finally:
            self._oracle.close()  # an idle worktree keeps no child (the next question starts one)
            self.tracked.release()  # nor the index's bytes

    def _decide_again(self, root: str, watched: Iterable[str]) -> tuple[bool, list[str]]:
        earlier, self.folders = self.folders, set()
        unignored = False
        for rel in sorted(earlier):
            parent, _, name = rel.rpartition("/")
            try:
                if not stat.S_ISDIR(os.lstat(os.path.join(root, rel)).st_mode):
                    continue
            except OSError:
                continue
            unignored = bool(self.to_watch(None, parent, [name])) or unignored
        by_parent: dict[str, list[str]] = {}
        for path in watched:
            if path.startswith(root + "/"):
                parent, _, name = path[len(root) + 1 :].rpartition("/")
                by_parent.setdefault(parent, []).append(name)
        before = set(self.folders)
        for parent, names in sorted(by_parent.items()):
            self.to_watch(None, parent, names)
        ignored = outermost(list(self.folders - before))
        self.folders = before | set(ignored)
        return unignored, ignored

    def close(self) -> None:
        self._oracle.close()
