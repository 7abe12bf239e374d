"""The agent's ids a checkpoint carries as git trailers: which keys and values fit, and their trailer names.

A ``checkpoint`` call may name the calling agent's ids (param ``agent``: an
object such as ``{"tool": "codex", "session": "…", "turn": "…"}``); each is
written into the checkpoint commit's message as ``Snapshotd-Agent-<Key>:
<value>`` (``tool_use`` becomes ``Tool-Use``), which ``git interpret-trailers
--parse`` reads, and comes back in the Checkpoint object's ``agent``. A key is
lower-case words joined by ``_``; a value is one line of text without
surrounding blanks, so that git keeps it as it was given. The agent hooks
check their payload's ids with the same rules (:func:`value_fits`) and leave
out what would be refused. Every agent hook imports this module, so it
imports nothing but :mod:`snapshotd.errors`.
"""

from __future__ import annotations

from snapshotd.errors import InvalidParams

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from typing import Any, TypeAlias

    Agent: TypeAlias = tuple[tuple[str, str], ...]
    """The agent's ids as (key, value) pairs, in the order given: hashable, so a Checkpoint stays frozen."""
else:
    Agent = tuple

AGENT = "Agent-"
"""What follows ``Snapshotd-`` in the name of each agent trailer."""

MAX_IDS = 16
MAX_KEY_CHARS = 32
MAX_VALUE_CHARS = 1024


def key_fits(key: object) -> bool:
    """Whether ``key`` is lower-case ASCII words (letters and digits, the first a letter) joined by single ``_``."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS or not key[0].isalpha():
        return False
    return all(part and part.isascii() and part.isalnum() and part == part.lower() for part in key.split("_"))


def value_fits(value: object) -> bool:
    """Whether ``value`` is one line of text git keeps as it is: no control characters, no blanks around it."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_VALUE_CHARS or value != value.strip():
        return False
    return not any(ord(char) < 0x20 or ord(char) == 0x7F or 0xD800 <= ord(char) <= 0xDFFF for char in value)


def trailer_name(key: str) -> str:
    """The trailer of ``key`` after ``Snapshotd-``: ``tool_use`` -> ``Agent-Tool-Use``."""
    return AGENT + "-".join(part.capitalize() for part in key.split("_"))


def key_of(name: str) -> str | None:
    """The key a trailer name after ``Snapshotd-`` stands for (``Agent-Tool-Use`` -> ``tool_use``), or None."""
    if not name.startswith(AGENT):
        return None
    key = name[len(AGENT) :].lower().replace("-", "_")
    return key if key_fits(key) else None


def agent_param(params: dict[str, Any], name: str = "agent") -> Agent:
    """The ``agent`` param as (key, value) pairs; absent or null is none. One sentence when it does not fit."""
    value = params.get(name)
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidParams(f"The parameter {name!r} must be an object of the agent's ids (key: text).", param=name)
    if len(value) > MAX_IDS:
        raise InvalidParams(f"The parameter {name!r} has {len(value)} ids; at most {MAX_IDS} are kept.", param=name)
    for key, text in value.items():
        if not key_fits(key):
            raise InvalidParams(
                f"The key {key!r} of {name!r} must be lower-case words joined by '_' (such as 'tool_use'), "
                f"at most {MAX_KEY_CHARS} characters.",
                param=name,
            )
        if not value_fits(text):
            raise InvalidParams(
                f"The value of {name}.{key} must be one line of text (no control characters, no blanks around it), "
                f"1 to {MAX_VALUE_CHARS} characters.",
                param=name,
            )
    return tuple(value.items())
