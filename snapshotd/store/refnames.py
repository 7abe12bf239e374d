"""The names of checkpoint refs: ``refs/snapshotd/<worktree>/<session key>``, any session mapped to a valid one."""

from __future__ import annotations

import hashlib
import re

REF_ROOT = "refs/snapshotd/"
_SESSION_SAFE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}$")
MAX_KEY_BYTES = 250  # a ref's file name and its ".lock" within the 255 bytes of a file name


def session_key(session: str | None) -> str:
    """The ref name component of a session (any string maps to a valid, unique one).

    A name that is not plain enough is written in hex; one whose hex would not fit a file name (over 124
    bytes of UTF-8) by the SHA-256 of its bytes: its checkpoints still carry the name itself.
    """
    if session is None:
        return "default"
    if _SESSION_SAFE.match(session) and not session.endswith(".lock") and ".." not in session:
        return "s-" + session
    raw = session.encode("utf-8", "surrogateescape")
    key = "x-" + raw.hex()
    return key if len(key) <= MAX_KEY_BYTES else "h-" + hashlib.sha256(raw).hexdigest()


def session_of_key(key: str) -> str | None:
    """The session a ref name component stands for: the inverse of :func:`session_key` (a hashed one is
    itself: the name is in its checkpoints)."""
    if key == "default":
        return None
    if key.startswith("x-"):
        try:
            return bytes.fromhex(key[2:]).decode("utf-8", "surrogateescape")
        except ValueError:
            return key
    return key[2:] if key.startswith("s-") else key


def ref_name(worktree_id: str, session: str | None) -> str:
    return f"{REF_ROOT}{worktree_id}/{session_key(session)}"
