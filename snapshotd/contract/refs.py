"""Checkpoint references as people and clients type them, parsed once where a request enters.

The grammar (protocol.md, "Checkpoint references"): a full id or a prefix
of at least 7 hex digits; ``@``, the newest checkpoint of a session in a
worktree, and ``@~N``, N before it; ``#N``, the checkpoint with seq N;
``SESSION@`` and ``SESSION@~N`` name the session inline. Without a session
(inline or the ``session`` param) ``@`` and ``#N`` mean the worktree's
newest session. ``@{REMOTE}``, ``SESSION@{REMOTE}`` and ``SESSION@{REMOTE}~N``
count in what was fetched from REMOTE instead (another machine's worktree). What a reference names is found in one place,
:func:`snapshotd.engine.reads.find_checkpoint`.

A worktree is named by ``path`` (a folder inside it) or ``worktree`` (its id):
:func:`worktree_param` reads both into a :class:`WorktreeRef`, which the engine
hands to :meth:`snapshotd.engine.registry.Registry.resolve`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from snapshotd.contract.params import optional_path, optional_str, validate_session
from snapshotd.errors import InvalidParams

MIN_PREFIX = 7  # shorter prefixes soon match other objects of a repository
MAX_HEX = 64  # a SHA-256 id; a SHA-1 store finds no longer prefix than its 40
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_BACK = re.compile(r"^~(\d*)$")
_SEQ = re.compile(r"^#(\d+)$")
_REMOTE = re.compile(r"^\{([^{}\s]+)\}(~\d*)?$")
SYNTAX = "an id (7 or more hex digits), @, @~N, #N, SESSION@, SESSION@~N or SESSION@{REMOTE}~N"


@dataclass(frozen=True)
class SessionChoice:
    """The session a relative reference counts in: ``name`` when ``named``, else the worktree's newest."""

    name: str | None = None
    named: bool = False


@dataclass(frozen=True)
class IdPrefix:
    """A full id or a prefix of one (lower case); it matches checkpoints only."""

    text: str
    hex: str

    relative = False


@dataclass(frozen=True)
class SessionHead:
    """``@``, ``@~N``, ``SESSION@``, ``SESSION@~N``: ``back`` checkpoints before the session's newest."""

    text: str
    session: SessionChoice
    back: int

    relative = True


@dataclass(frozen=True)
class SessionSeq:
    """``#N``: the checkpoint with seq N in the session."""

    text: str
    session: SessionChoice
    seq: int

    relative = True


@dataclass(frozen=True)
class RemoteHead:
    """``@{REMOTE}``, ``SESSION@{REMOTE}~N``: ``back`` before the newest fetched from ``remote`` (in the session)."""

    text: str
    remote: str
    session: SessionChoice
    back: int

    relative = True  # counted in the fetched refs of the worktree's store


CheckpointRef: TypeAlias = IdPrefix | SessionHead | SessionSeq | RemoteHead


@dataclass(frozen=True)
class WorktreeRef:
    """The worktree a request names: by a folder inside it (``path``), by its ``id``, by both (they must agree), or not at all.

    ``force`` opens a broad folder (``$HOME``, ``/``, one no repository holds)
    that is otherwise refused until asked for.
    """

    path: str | None = None
    id: str | None = None
    force: bool = False

    @property
    def named(self) -> bool:
        return self.path is not None or self.id is not None


def worktree_param(params: Mapping[str, Any]) -> WorktreeRef:
    """The worktree the ``path`` and ``worktree`` params name (a ``force`` of true opens a broad folder)."""
    return WorktreeRef(optional_path(params, "path"), optional_str(params, "worktree"), params.get("force") is True)


def _number(text: str, whole: str, name: str) -> int:
    if len(text) > 9:
        raise InvalidParams(f"The reference {whole!r} in {name!r} holds a number too large to be a checkpoint's.", param=name)
    return int(text)


def parse_ref(value: object, name: str = "checkpoint", session: SessionChoice | None = None) -> CheckpointRef:
    """The reference ``value`` (param ``name``), in ``session`` unless it names its own.

    A string that is none of the grammar's forms, or a hex prefix too short
    to be told from the repository's other objects, is refused here, with
    the reason.
    """
    if not isinstance(value, str):
        raise InvalidParams(f"The parameter {name!r} must be a checkpoint reference (a string): {SYNTAX}.", param=name)
    text = value.strip()
    choice = session or SessionChoice()
    if _HEX.match(text):
        if len(text) < MIN_PREFIX:
            raise InvalidParams(
                f"{text!r} is too short to name a checkpoint: give at least {MIN_PREFIX} hex digits "
                "(shorter prefixes soon match other objects of the repository), or @, @~N or #N.",
                param=name,
            )
        if len(text) > MAX_HEX:
            raise InvalidParams(f"{text!r} is longer than any checkpoint id ({MAX_HEX} hex digits at most).", param=name)
        return IdPrefix(text, text.lower())
    seq = _SEQ.match(text)
    if seq:
        number = _number(seq.group(1), text, name)
        if number < 1:
            raise InvalidParams(f"{text!r} names no checkpoint: seq numbers start at 1.", param=name)
        return SessionSeq(text, choice, number)
    inline, at, tail = text.rpartition("@")
    remote = _REMOTE.match(tail) if at else None
    if remote:
        steps = remote.group(2) or ""
        count = 0 if not steps else (_number(steps[1:], text, name) if steps[1:] else 1)
        named = SessionChoice(validate_session(inline, name), named=True) if inline else choice
        return RemoteHead(text, remote.group(1), named, count)
    back = _BACK.match(tail) if at else None
    if at and (tail == "" or back):
        steps = 0 if tail == "" else (_number(back.group(1), text, name) if back and back.group(1) else 1)
        if inline:
            choice = SessionChoice(validate_session(inline, name), named=True)
        return SessionHead(text, choice, steps)
    raise InvalidParams(f"{value!r} is not a checkpoint reference; give {SYNTAX}.", param=name)


def session_choice(params: Mapping[str, Any]) -> SessionChoice:
    """The session the ``session`` param chooses for relative references (absent: the newest)."""
    session = validate_session(params.get("session"))
    return SessionChoice(session, named=session is not None)


def ref_param(params: Mapping[str, Any], name: str = "checkpoint") -> CheckpointRef:
    """The reference in param ``name``, counted in the ``session`` param's session."""
    if params.get(name) is None:
        raise InvalidParams(f"The parameter {name!r} is required: {SYNTAX}.", param=name)
    return parse_ref(params.get(name), name, session_choice(params))


def is_relative(text: str) -> bool:
    """Whether ``text`` reads as a reference that needs a worktree (``@``, ``#N``, ``SESSION@~N``)."""
    try:
        return parse_ref(text).relative
    except InvalidParams:
        return False


def needs_session(text: str) -> bool:
    """Whether ``text`` counts in a session it does not name (``@``, ``@~N``, ``#N``): one must be given."""
    try:
        ref = parse_ref(text)
    except InvalidParams:
        return False
    return isinstance(ref, (SessionHead, SessionSeq)) and not ref.session.named


def is_reference(text: str) -> bool:
    """Whether ``text`` reads as a checkpoint reference at all."""
    try:
        parse_ref(text)
    except InvalidParams:
        return False
    return True
