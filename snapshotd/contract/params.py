"""Validation of wire params: each handler's params checked in one place, one sentence per refusal.

``None`` counts as absent for optional params. Every string is checked to be
storable text (no NUL, no lone surrogate outside file-name escapes), every
path to be shorter than PATH_MAX and every integer to be at most 2**31 - 1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from snapshotd.errors import InvalidParams

PATH_MAX = os.pathconf("/", "PC_PATH_MAX")
"""Longest path the system takes, in bytes with its NUL; longer path params are refused."""

INT_PARAM_MAX = 2**31 - 1
"""Largest integer any param takes unless its validator allows less."""

MAX_CONTEXT = 100_000
"""The most context lines a patch may ask for (``context``; libgit2 takes a 32-bit count)."""

DEFAULT_MAX_PATCH_BYTES = 8 * 1024 * 1024
"""Patch text one ``diff`` reply carries unless ``max_patch_bytes`` says otherwise."""

MAX_PATCH_BYTES = 32 * 1024 * 1024
"""The most ``max_patch_bytes`` may ask for, so that one reply stays within the daemon's budgets."""


def json_type(value: Any) -> str:
    """How a JSON value's type is named in an error sentence ("a string", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _wrong_type(name: str, expected: str, value: Any) -> InvalidParams:
    return InvalidParams(
        f"The parameter {name!r} must be {expected}, not {json_type(value)}.", param=name
    )


def check_text(name: str, value: str) -> str:
    """``value`` if it can name a file and be stored: no NUL, no lone surrogate outside file-name escapes.

    Strings the daemon sends back for undecodable file names (``\\udc80`` to
    ``\\udcff``, as ``os.fsdecode`` makes them) are accepted.
    """
    if "\0" in value:
        raise InvalidParams(f"The parameter {name!r} must not contain a NUL character.", param=name)
    try:
        os.fsencode(value)
    except UnicodeEncodeError as exc:
        raise InvalidParams(
            f"The parameter {name!r} holds a lone surrogate (U+{ord(value[exc.start]):04X}) "
            "that is not text; send it as valid UTF-8.",
            param=name,
        ) from None
    return value


def _path_text(name: str, value: str) -> str:
    size = len(check_text(name, value).encode("utf-8", "surrogateescape"))
    if size >= PATH_MAX:
        raise InvalidParams(
            f"The parameter {name!r} is a path of {size} bytes, over the system's limit of "
            f"{PATH_MAX - 1}.",
            param=name,
        )
    return value


def require_str(params: Mapping[str, Any], name: str) -> str:
    """The string param ``name``; raise :class:`InvalidParams` if missing or not a string."""
    value = params.get(name)
    if value is None:
        raise InvalidParams(f"The parameter {name!r} is required and must be a string.", param=name)
    if not isinstance(value, str):
        raise _wrong_type(name, "a string", value)
    return check_text(name, value)


def optional_str(params: Mapping[str, Any], name: str, default: str | None = None) -> str | None:
    """The string param ``name``, or ``default`` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _wrong_type(name, "a string", value)
    return check_text(name, value)


def optional_path(params: Mapping[str, Any], name: str) -> str | None:
    """The path param ``name`` (a string shorter than PATH_MAX), or None when absent."""
    value = optional_str(params, name)
    return None if value is None else _path_text(name, value)


def optional_int(
    params: Mapping[str, Any],
    name: str,
    default: int | None = None,
    *,
    min: int | None = None,
    max: int = INT_PARAM_MAX,
) -> int | None:
    """The integer param ``name`` within ``min``..``max``, or ``default`` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _wrong_type(name, "an integer", value)
    if min is not None and value < min:
        raise InvalidParams(
            f"The parameter {name!r} must be at least {min}, not {value}.", param=name
        )
    if value > max:
        raise InvalidParams(
            f"The parameter {name!r} must be at most {max}, not {value}.", param=name
        )
    return value


def optional_bool(params: Mapping[str, Any], name: str, default: bool = False) -> bool:
    """The boolean param ``name``, or ``default`` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _wrong_type(name, "a boolean", value)
    return value


def optional_str_list(
    params: Mapping[str, Any], name: str, default: list[str] | None = None
) -> list[str] | None:
    """The list-of-strings param ``name``, or ``default`` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        if isinstance(value, list):
            raise InvalidParams(
                f"The parameter {name!r} must be an array of strings, and one item is not a string.",
                param=name,
            )
        raise _wrong_type(name, "an array of strings", value)
    return [check_text(name, item) for item in value]


def optional_path_list(params: Mapping[str, Any], name: str) -> list[str] | None:
    """The list-of-paths param ``name`` (each shorter than PATH_MAX), or None when absent."""
    value = optional_str_list(params, name)
    return None if value is None else [_path_text(name, item) for item in value]


def validate_session(session: object, name: str = "session") -> str | None:
    """A session name (absent: None): a non-empty string of at most 200 characters, no control character."""
    if session is None:
        return None
    if not isinstance(session, str) or not session or len(session) > 200:
        raise InvalidParams(f"The parameter '{name}' must be a non-empty string of at most 200 characters.")
    if any(ord(ch) < 32 for ch in session):
        raise InvalidParams(f"The parameter '{name}' must not contain control characters.")
    return check_text(name, session)
