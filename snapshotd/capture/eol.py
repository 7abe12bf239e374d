"""git's check-in conversion on the warm path, in-process, for paths only end-of-line rules touch.

A file with a CR byte went to git's ``update-index`` (capture/checkin.py): a
process at every capture that touched one, in every project whose files have
CRLF endings under end-of-line rules (``*.cs eol=crlf``, ``* text=auto``); and
in a project whose attributes name a filter, an encoding or ``ident`` anywhere
(capture/asis.py: Humanizer names ``working-tree-encoding`` for one kind of
file), every changed file did. Now the rules of each path are git's own
answer: ``git check-attr --stdin -z`` of ``text crlf eol filter
working-tree-encoding ident``, one long-lived child per warm state
(capture/coprocess.py), run with an index file that does not exist, so that it
reads the ``.gitattributes`` on disk as ``git add -A`` does once it has
dropped the deleted ones (a ``.gitattributes`` standing in the index alone
keeps the capture on git). Its answers are kept: a change of any attributes
file makes the next capture a full scan, which makes a new warm state (and a
folder met anew that holds one does too). Then, for a path:

- a filter driver named, an encoding, or ``ident`` set: git hashes it;
- no CR byte: stored as it is (the end-of-line conversion only removes CRs);
- ``text`` (set, ``input``, ``crlf``, or ``eol`` alone): each CR before a LF
  is removed (convert.c's ``crlf_to_git``);
- ``text=auto``: stored as it is when it looks binary (a lone CR, a NUL, or
  more than one control character in 128 printable ones) or when the user's
  index blob at its path has CRLF endings and does not look binary
  (``has_crlf_in_index``, the "safer autocrlf"); otherwise every CR is removed;
- ``-text`` (``binary``): stored as it is;
- no rule, so ``core.autocrlf`` decides (convert.c's ``convert_attrs``, read
  once per warm state, as a change of a config file makes a full scan):
  ``false`` or unset stores it as it is, ``true`` and ``input`` do what
  ``text=auto`` does; a value git refuses leaves it to git, as does a file too
  large to read at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from snapshotd.capture.asis import NotAsIs
from snapshotd.capture.coprocess import WarmChild
from snapshotd.errors import SpawnTimeout
from snapshotd.git.process import GitTarget

BINARY, TEXT, AUTO = "binary", "text", "auto"
ATTRIBUTES = ("text", "crlf", "eol", "filter", "working-tree-encoding", "ident")
CHECK_ATTR = ["check-attr", "--stdin", "-z", *ATTRIBUTES]
# Values under which the other three change nothing (a filter is a driver's name; ident set expands $Id$).
NO_CONTENT_CHANGE = {"filter": ("unspecified", "unset", "set"), "working-tree-encoding": ("unspecified",),
                     "ident": ("unspecified", "unset")}
GIT = "git"  # a path whose bytes only git may convert: a filter, an encoding or ident
# Control characters gather_stats counts as not printable (BS, HT, ESC and FF count as printable; CR and LF apart).
_NOT_PRINTABLE = bytes(c for c in range(32) if c not in b"\b\t\x1b\x0c\r\n") + b"\x7f"


@dataclass(frozen=True)
class TextStats:
    """convert.c's ``struct text_stat`` of some bytes."""

    crlf: int
    lonecr: int
    lonelf: int
    nul: int
    printable: int
    nonprintable: int

    @classmethod
    def of(cls, data: bytes) -> TextStats:
        crlf, cr, lf = data.count(b"\r\n"), data.count(b"\r"), data.count(b"\n")
        control = len(data) - len(data.translate(None, _NOT_PRINTABLE))
        printable = len(data) - cr - lf - control
        if data.endswith(b"\x1a"):  # a trailing EOF (Ctrl-Z) is not counted
            control -= 1
        return cls(crlf, cr - crlf, lf - crlf, data.count(b"\0"), printable, control)

    def binary(self) -> bool:
        """``convert_is_binary``: a lone CR, a NUL, or too many control characters."""
        return bool(self.lonecr or self.nul or (self.printable >> 7) < self.nonprintable)


def rules_of(values: dict[str, str]) -> str | None:
    """What ``git add`` does to a path, from check-attr's values: :data:`GIT` when a filter, an encoding or
    ``ident`` may change its bytes, else its line endings' action (None: ``core.autocrlf`` decides)."""
    if any(values.get(name, "unspecified") not in allowed for name, allowed in NO_CONTENT_CHANGE.items()):
        return GIT
    return action(values.get("text", ""), values.get("crlf", ""), values.get("eol", ""))


def action(text: str, crlf: str, eol: str) -> str | None:
    """What ``git add`` does to a path's line endings, from check-attr's values of ``text``, ``crlf`` and ``eol``:
    :data:`BINARY`, :data:`TEXT` or :data:`AUTO`; None when ``core.autocrlf`` decides (convert.c's ``convert_attrs``)."""
    chosen = _crlf_value(text)
    if chosen is None:
        chosen = _crlf_value(crlf)
    if chosen != BINARY and chosen != AUTO and eol in ("lf", "crlf"):
        chosen = TEXT
    return chosen


def _crlf_value(value: str) -> str | None:
    return {"set": TEXT, "unset": BINARY, "input": TEXT, "auto": AUTO}.get(value)


def unruled(autocrlf: str | None) -> str | None:
    """The action for a path no ``text``, ``crlf`` or ``eol`` rule covers, from ``core.autocrlf``
    (git/attributes.py's reading; None: git decides)."""
    return {"false": BINARY, "true": AUTO, "input": AUTO}.get(autocrlf or "")


def has_crlf(blob: bytes | None) -> bool:
    """``has_crlf_in_index``: the index blob has CRLF endings and does not look binary."""
    if not blob or b"\r" not in blob:
        return False
    stats = TextStats.of(blob)
    return bool(stats.crlf) and not stats.binary()


def to_git(data: bytes, chosen: str | None, index_blob: Callable[[], bytes | None]) -> bytes:
    """What ``git add`` stores of ``data`` under ``chosen`` (``index_blob``: the user's blob at the path);
    :class:`NotAsIs` when only git knows: :data:`GIT`, or no rule covers it and ``core.autocrlf`` could not be
    read (``chosen`` None) and a CR is there."""
    if chosen == GIT:
        raise NotAsIs("a filter, an encoding or ident")
    if chosen == BINARY or b"\r" not in data:
        return data
    if chosen is None:
        raise NotAsIs("core.autocrlf, as git reads it")
    stats = TextStats.of(data)
    if not stats.crlf:
        return data
    if chosen == AUTO:
        if stats.binary() or has_crlf(index_blob()):
            return data
        return data.replace(b"\r", b"")  # no lone CR: it would look binary
    return data.replace(b"\r\n", b"\n")


class AttributeOracle(WarmChild):
    """One worktree's ``git check-attr --stdin``, started for one warm state, and the actions it gave."""

    def __init__(self) -> None:
        super().__init__(CHECK_ATTR)
        self._kept: dict[str, str | None] = {}

    def actions(self, target: GitTarget, rules: object, index_file: str, paths: list[str]) -> dict[str, str | None] | None:
        """The action for each of ``paths`` under the rules of the warm state ``rules`` (None: git decides);
        None when check-attr could not say. ``index_file``: a path where no index is (git reads none)."""
        with self._lock:
            try:
                session = self._child(target, rules, index_file)
                if session is None:
                    return None
                asked = [path for path in dict.fromkeys(paths) if path not in self._kept]
                self._looking_in(asked)
                try:
                    if asked:
                        session.send(b"".join(os.fsencode(path) + b"\0" for path in asked))
                    for path in asked:
                        values = {}
                        for _ in ATTRIBUTES:
                            echoed, name, value = (session.read_until(b"\0") for _ in range(3))
                            if not value.endswith(b"\0") or echoed[:-1] != os.fsencode(path):
                                raise EOFError("check-attr ended or answered out of turn")
                            values[name[:-1].decode()] = value[:-1].decode("utf-8", "replace")
                        self._kept[path] = rules_of(values)
                except (OSError, EOFError, SpawnTimeout) as exc:
                    self._gave_no_answer(target, rules, exc)
                    return None
                return {path: self._kept[path] for path in paths}
            finally:
                self._after_use()

    def _ended(self) -> None:
        self._kept = {}


@dataclass(frozen=True)
class LineEndings:
    """What a warm capture converts line endings with: the worktree's check-attr and the warm state it answers for."""

    oracle: AttributeOracle
    target: GitTarget
    rules: object
    index_file: str  # where no index is: check-attr reads the .gitattributes on disk only

    def actions(self, paths: list[str]) -> dict[str, str | None] | None:
        return self.oracle.actions(self.target, self.rules, self.index_file, paths)
