"""JSON read and written by the C parts that :mod:`json` itself uses, without importing :mod:`json`.

An agent hook reads its payload at every event, and ``import json`` compiles
the regular expressions of its pure-Python parts (with :mod:`re` and
:mod:`enum`): a few milliseconds of what the agent waits for. ``_json``'s
scanner is what ``json.loads`` runs, and its string encoder what
``json.dumps(..., ensure_ascii=True)`` runs; without them (another Python)
this falls back to :mod:`json`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from typing import Any

_WHITESPACE = " \t\n\r"


class _Context:
    """The settings ``_json.make_scanner`` reads, as :class:`json.JSONDecoder` has them, strict."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_scan: Any = None
_quote: Any = None
try:
    from _json import encode_basestring_ascii, make_scanner
except ImportError:  # pragma: no cover - CPython has them
    pass
else:
    _quote = encode_basestring_ascii
    _scan = make_scanner(_Context())  # type: ignore[arg-type]  # it reads a decoder's attributes


def loads(text: str) -> Any:
    """The value of the JSON document ``text``; ValueError (a :class:`json.JSONDecodeError`) when it is not one."""
    if _scan is None:  # pragma: no cover
        import json

        return json.loads(text)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration:
        import json

        return json.loads(text)  # raises json's own error, which says where
    if text[end:].strip(_WHITESPACE):
        import json

        return json.loads(text)
    return value


def _parts(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(_quote(value))
    elif value is None or isinstance(value, bool):
        out.append("null" if value is None else "true" if value else "false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float) and value == value and value not in (float("inf"), float("-inf")):
        out.append(float.__repr__(value))
    elif isinstance(value, dict) and all(isinstance(key, str) for key in value):
        out.append("{")
        for n, (key, item) in enumerate(value.items()):
            out.append("," if n else "")
            out.append(_quote(key) + ":")
            _parts(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for n, item in enumerate(value):
            out.append("," if n else "")
            _parts(item, out)
        out.append("]")
    else:
        raise TypeError(type(value).__name__)


def dumps(value: Any) -> str:
    """``value`` as ``json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))`` writes it."""
    if _quote is not None:
        out: list[str] = []
        try:
            _parts(value, out)
        except TypeError:
            pass  # a type json knows more of than this: json says what it makes of it
        else:
            return "".join(out)
    import json

    return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
