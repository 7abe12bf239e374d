"""The names of checkpoint refs: ``refs/snapshotd/<worktree>/<session key>``, any session mapped to a valid one."""

from __future__ import annotations

import re

REF_ROOT = "refs/snapshotd/"
_SESSION_SAFE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}$")


def session_key(session: str | None) -> str:
    """The ref name component of a session (any string maps to a valid, unique one)."""
    if session is None:
        return "default"
    if _SESSION_SAFE.match(session) and not session.endswith(".lock") and ".." not in session:
        return "s-" + session
    return "x-" + session.encode("utf-8", "surrogateescape").hex()


def session_of_key(key: str) -> str | None:
    """The session a ref name component stands for: the inverse of :func:`session_key`."""
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
