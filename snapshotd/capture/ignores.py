"""Whether git ignores a path the warm state has not met: one long-lived ``git check-ignore`` per worktree.

A warm capture put every path it did not know to one ``git ls-files`` run: a
process for each new file, and one at every capture that followed a write to
an ignored file (a log, a test run's ``__pycache__``, a build's output) for as
long as the daemon ran. Now one ``git check-ignore --stdin`` per worktree
answers, and the warm state keeps the answers. A change of any ignore rule,
of the configuration or of the user's index ends the warm state: the full
scan that makes a new one ends the child (it read the old rules), and the
next question starts another. It ends with the worktree's watch too. A child
that gave no answer (git stopped) is not started again for the same warm
state: its paths go to ``ls-files``, as before.

check-ignore matches with the function ``ls-files`` and ``git add`` use, on the
path and its kind (``build/`` matches folders only). What it says is used as
git would use it:

- ignored: final. ``ls-files -o`` never lists an excluded path, nor anything
  in an excluded folder, and a path the user's index tracks is known to the
  warm state before it gets here;
- not ignored: taken only for a regular file or link in a folder the last
  tree holds entries of (the root, or a folder git walked: not a nested
  repository or a submodule). A folder, or a file anywhere else, still goes
  to ``ls-files``, which says what it holds.

check-ignore is asked with ``--no-index`` (the user's index is not read: it
answers for untracked paths only), so a ``.gitignore`` git would read from the
index (skip-worktree, not on disk) keeps the worktree on ``ls-files``. A path
git would read as pathspec magic (a leading ``:``) goes to ``ls-files`` too.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from snapshotd.capture.coprocess import WarmChild
from snapshotd.capture.walker import Walker
from snapshotd.errors import SpawnTimeout
from snapshotd.git.attributes import ATTRIBUTES_FILE
from snapshotd.git.process import GitTarget

CHECK_IGNORE = ["check-ignore", "--stdin", "-z", "--verbose", "--non-matching", "--no-index"]
MAX_KEPT = 200_000  # answers kept per warm state; past it they are dropped and asked again
WALK_LIMIT = 2_000  # paths in a folder met anew that check-ignore settles; past it ls-files lists the folder


class Ignores:
    """The check-ignore answers a warm state keeps: paths git ignores, by kind (a folder rule may not match a file)."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.folders: set[str] = set()

    def holds(self, path: str, *, folder: bool) -> bool:
        """Whether git ignores ``path`` by an answer kept: its own, or a folder's above it."""
        if path in (self.folders if folder else self.files):
            return True
        end = path.rfind("/")
        while end > 0:
            if path[:end] in self.folders:
                return True
            end = path.rfind("/", 0, end)
        return False

    def forget_under(self, folder: str) -> None:
        """Drop the answers below ``folder``: it was met anew, and may hold ignore files of its own."""
        prefix = folder + "/"
        for kept in (self.files, self.folders):
            kept -= {path for path in kept if path.startswith(prefix)}

    def add(self, path: str, *, folder: bool) -> None:
        if len(self.files) + len(self.folders) >= MAX_KEPT:
            self.files.clear()
            self.folders.clear()
        (self.folders if folder else self.files).add(path)


class IgnoreOracle(WarmChild):
    """One worktree's ``git check-ignore --stdin``, started for one warm state (capture/coprocess.py)."""

    def __init__(self) -> None:
        super().__init__(CHECK_IGNORE)

    def ask(self, target: GitTarget, rules: object, paths: list[str]) -> dict[str, bool] | None:
        """Whether git ignores each of ``paths`` under the rules of the warm state ``rules``; None when
        check-ignore could not say. :attr:`started` counts the children started for it."""
        with self._lock:
            try:
                return self._ask(target, rules, paths)
            finally:
                self._after_use()

    def _ask(self, target: GitTarget, rules: object, paths: list[str]) -> dict[str, bool] | None:
        session = self._child(target, rules)
        if session is None:
            return None
        self._looking_in(paths)
        try:
            session.send(b"".join(os.fsencode(path) + b"\0" for path in paths))
            answers = {}
            for path in paths:
                _source, _line, pattern, echoed = fields = [session.read_until(b"\0") for _ in range(4)]
                if not all(field.endswith(b"\0") for field in fields) or echoed[:-1] != os.fsencode(path):
                    raise EOFError("check-ignore ended or answered out of turn")
                answers[path] = len(pattern) > 1 and not pattern.startswith(b"!")
        except (OSError, EOFError, SpawnTimeout) as exc:  # git died (a path beyond a link appeared meanwhile, say)
            self._gave_no_answer(target, rules, exc)
            return None
        return answers



@dataclass
class FolderListing:
    """What ``git add -A`` takes in a folder met anew, as check-ignore settles it: its files, and what it ignores;
    ``attributes``: a ``.gitattributes`` is in it (its rules are the full scan's to read)."""

    files: list[str]
    ignored: list[tuple[str, bool]]  # (path, is a folder)
    attributes: bool = False


def list_new_folder(
    walker: Walker, oracle: IgnoreOracle, target: GitTarget, rules: object, folder: str
) -> FolderListing | None:
    """The files git would list in ``folder`` (no entry of the last tree or the user's index is in it),
    found by a walk whose every path check-ignore settles, a folder at a time; None when ``ls-files``
    must list it: a ``.git`` in it (maybe a nested repository), more than :data:`WALK_LIMIT` paths,
    a folder changed meanwhile, or no answer. Like git, it enters no folder git ignores and lists only
    regular files and links."""
    listing = FolderListing([], [])
    pending, seen = [folder], 0
    while pending:
        current = pending.pop()
        names = walker.names(current)
        if names is None or any(name.lower() == ".git" for name in names):
            return None
        if ATTRIBUTES_FILE in names:
            return FolderListing([], [], attributes=True)
        kinds: dict[str, bool] = {}
        for name in names:
            st = walker.lstat(f"{current}/{name}")
            if st is None:
                return None
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                kinds[f"{current}/{name}"] = stat.S_ISDIR(st.st_mode)
        seen += len(kinds)
        if seen > WALK_LIMIT:
            return None
        answers = oracle.ask(target, rules, list(kinds)) if kinds else {}
        if answers is None:
            return None
        for path, is_folder in kinds.items():
            if answers[path]:
                listing.ignored.append((path, is_folder))
            elif is_folder:
                pending.append(path)
            else:
                listing.files.append(path)
    return listing
