"""git's end-of-line conversion on check-in, in-process: what ``git add`` stores of a file with a CR byte.

A file with a CR byte went to git's ``update-index`` (capture/checkin.py): a
process at every capture that touched one, in every project whose files have
CRLF endings under end-of-line rules (``*.cs eol=crlf``, ``* text=auto``).
Where nothing else converts (no attributes file names a filter, an encoding
or ``ident``: capture/asis.py; no ``.gitattributes`` stands in the index
alone), the conversion is convert.c's ``crlf_to_git``, done here:

- the rules of a path are git's own answer: ``git check-attr --stdin -z text
  crlf eol``, one long-lived child per warm state (capture/coprocess.py), run
  with an empty index, so that it reads the ``.gitattributes`` on disk as
  ``git add -A`` does once it has dropped the deleted ones. Its answers are
  kept: a change of any attributes file makes the next capture a full scan,
  which makes a new warm state (and a folder met anew that holds one does too);
- ``text`` (set, ``input``, or ``eol`` alone) removes each CR before a LF;
- ``text=auto`` stores the file as it is when it looks binary (a lone CR, a
  NUL, or more than one control character in 128 printable ones), or when the
  user's index blob at its path has CRLF endings and does not look binary
  (``has_crlf_in_index``, the "safer autocrlf"); otherwise it removes every CR;
- ``-text`` (``binary``) stores it as it is.

A path whose attributes leave the choice to ``core.autocrlf`` still goes to git,
as does a file too large to read at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from snapshotd.capture.coprocess import WarmChild
from snapshotd.errors import SpawnTimeout
from snapshotd.git.process import GitTarget

BINARY, TEXT, AUTO = "binary", "text", "auto"
ATTRIBUTES = ("text", "crlf", "eol")
CHECK_ATTR = ["check-attr", "--stdin", "-z", *ATTRIBUTES]
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


def has_crlf(blob: bytes | None) -> bool:
    """``has_crlf_in_index``: the index blob has CRLF endings and does not look binary."""
    if not blob or b"\r" not in blob:
        return False
    stats = TextStats.of(blob)
    return bool(stats.crlf) and not stats.binary()


def to_git(data: bytes, chosen: str, index_blob: Callable[[], bytes | None]) -> bytes:
    """What ``git add`` stores of ``data`` under ``chosen`` (``index_blob``: the user's blob at the path)."""
    if chosen == BINARY or not data:
        return data
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
                        self._kept[path] = action(values.get("text", ""), values.get("crlf", ""), values.get("eol", ""))
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
