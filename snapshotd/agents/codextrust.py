"""Codex's trust in hook entries: how Codex records it, read and written the same way.

Codex (0.171) runs a hook from a user's or a project's ``hooks.json`` only once
a person trusted it: its ``/hooks`` screen records, in the user's
``config.toml``::

    [hooks.state."<hooks.json path>:<event>:<group>:<handler>"]
    trusted_hash = "sha256:<hex>"

The key names the entry by position (``user_prompt_submit``, group and handler
index from 0); the hash is SHA-256 of the entry's normalized identity as
compact JSON with sorted keys: the event's key, the group's matcher (for the
events that have one) and this one handler, with its timeout (600 when unset)
and ``async``. An entry whose hash differs (edited since) counts as untrusted.

:func:`entries` computes keys and hashes for snapshotd's own handlers in a
hooks file; :func:`status` compares them with ``config.toml``;
:func:`retrusted` adds or takes out exactly the tables that trust them,
appended at the end of the file, every other byte kept.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapshotd.agents.jsonedit import hook_handlers

EVENT_KEYS = {
    "PreToolUse": "pre_tool_use",
    "PermissionRequest": "permission_request",
    "PostToolUse": "post_tool_use",
    "PreCompact": "pre_compact",
    "PostCompact": "post_compact",
    "SessionStart": "session_start",
    "UserPromptSubmit": "user_prompt_submit",
    "Stop": "stop",
}
"""Codex's key for each hook event, as in the state keys and the hashed identity."""

MATCHER_EVENTS = ("PreToolUse", "PermissionRequest", "PostToolUse", "SessionStart", "PreCompact", "PostCompact")
"""Events whose group matcher is part of the entry (Codex ignores it for the others)."""

DEFAULT_TIMEOUT_S = 600


@dataclass(frozen=True)
class Entry:
    """One handler of snapshotd's in a hooks file, as Codex names and hashes it."""

    key: str
    hash: str
    event: str


def hook_hash(event: str, matcher: str | None, handler: dict[str, Any]) -> str:
    """The ``trusted_hash`` Codex expects for one command ``handler`` of a group of ``event``."""
    timeout = handler.get("timeout")
    normalized: dict[str, Any] = {
        "type": "command",
        "command": handler.get("command"),
        "timeout": max(int(timeout), 1) if isinstance(timeout, int) else DEFAULT_TIMEOUT_S,
        "async": bool(handler.get("async", False)),
    }
    if isinstance(handler.get("statusMessage"), str):
        normalized["statusMessage"] = handler["statusMessage"]
    identity: dict[str, Any] = {"event_name": EVENT_KEYS[event], "hooks": [normalized]}
    if matcher is not None and event in MATCHER_EVENTS:
        identity["matcher"] = matcher
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def entries(hooks_path: Path, text: str, is_ours: Any) -> list[Entry]:
    """Keys and hashes of the handlers in ``text`` (the hooks file at ``hooks_path``) for which ``is_ours(handler)``."""
    found = []
    for event, g, group, h, handler in hook_handlers(text):
        if event in EVENT_KEYS and isinstance(handler, dict) and handler.get("type") == "command" and is_ours(handler):
            matcher = group.get("matcher") if isinstance(group.get("matcher"), str) else None
            key = f"{hooks_path}:{EVENT_KEYS[event]}:{g}:{h}"
            found.append(Entry(key, hook_hash(event, matcher, handler), event))
    return found


def trusted_hashes(config_text: str) -> dict[str, str]:
    """Key -> ``trusted_hash`` of ``[hooks.state]`` in a ``config.toml`` text (empty if it does not parse)."""
    try:
        state = tomllib.loads(config_text).get("hooks", {}).get("state", {})
    except (tomllib.TOMLDecodeError, AttributeError):
        return {}
    if not isinstance(state, dict):
        return {}
    return {key.strip(): value["trusted_hash"] for key, value in state.items() if isinstance(value, dict) and isinstance(value.get("trusted_hash"), str)}


def status(found: list[Entry], config_text: str) -> dict[str, str]:
    """Key -> ``trusted``, ``modified`` (trusted with another hash) or ``untrusted``."""
    trusted = trusted_hashes(config_text)
    return {e.key: "untrusted" if e.key not in trusted else "trusted" if trusted[e.key] == e.hash else "modified" for e in found}


def _block(key: str, trusted_hash: str, newline: str) -> str:
    """The table :func:`retrusted` appends for one entry (after a blank line)."""
    return f'{newline}[hooks.state.{json.dumps(key, ensure_ascii=False)}]{newline}trusted_hash = "{trusted_hash}"{newline}'


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _without_block(text: str, key: str, trusted_hash: str, newline: str) -> str | None:
    """``text`` without the table snapshotd appended for ``key``, or None if that table is not there as written."""
    block = _block(key, trusted_hash, newline)
    if block in text:
        return text.replace(block, "", 1)
    if text.startswith(block[len(newline) :]):
        return text[len(block) - len(newline) :]
    return None


def retrusted(config_text: str, old: list[Entry], new: list[Entry]) -> str | None:
    """``config_text`` trusting exactly ``new`` instead of ``old`` (snapshotd's entries before and after the edit).

    The tables snapshotd appended for entries gone or changed are taken out, and
    one table is appended per entry not yet trusted; every other byte stays.
    None when that cannot be done so: the file does not parse, or an entry's
    state there was written by someone else (only Codex's ``/hooks`` should change it).
    """
    try:
        tomllib.loads(config_text)
    except tomllib.TOMLDecodeError:
        return None
    newline = _newline(config_text)
    text = config_text
    wanted = {e.key: e.hash for e in new}
    for entry in old:
        current = trusted_hashes(text).get(entry.key)
        if current is not None and wanted.get(entry.key) != current:
            without = _without_block(text, entry.key, current, newline)
            text = text if without is None else without
    state = _states(text)
    for entry in new:
        if entry.key in state:
            if trusted_hashes(text).get(entry.key) == entry.hash:
                continue
            return None
        if text and not text.endswith("\n"):
            text += newline
        block = _block(entry.key, entry.hash, newline)
        text += block if text else block[len(newline) :]
    if any(value != "trusted" for value in status(new, text).values()):
        return None
    return text


def moved_warnings(hooks_path: Path, old: str | None, new: str | None, config_text: str, is_theirs: Any) -> list[str]:
    """A warning when an edit of the hooks file (``old`` to ``new``) moves handlers of others that Codex
    trusted: it trusts one by its place in the file, so a handler moved no longer runs until trusted again."""
    before, after = (entries(hooks_path, text or "", is_theirs) for text in (old, new))
    trusted = trusted_hashes(config_text)
    now = {entry.key for entry in after}
    moved = [entry for entry in before if trusted.get(entry.key) == entry.hash and entry.key not in now]
    if not moved:
        return []
    return [f"Codex trusts a hook by its place in {hooks_path}, and this moves {len(moved)} of yours it trusted "
            f"({', '.join(entry.event for entry in moved)}); trust them again in Codex's /hooks."]


def _states(config_text: str) -> dict[str, Any]:
    try:
        state = tomllib.loads(config_text).get("hooks", {}).get("state", {})
    except (tomllib.TOMLDecodeError, AttributeError):
        return {}
    return {key.strip(): value for key, value in state.items()} if isinstance(state, dict) else {}


def manual_step(hooks_path: Path) -> str:
    """The one step a person takes when the trust could not be recorded here."""
    return f"Codex runs the new hooks in {hooks_path} only once trusted: start `codex`, type /hooks and trust the snapshotd entries."
