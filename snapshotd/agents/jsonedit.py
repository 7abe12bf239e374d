"""Edit JSON text in place: add and remove members and items, leaving every other byte alone.

Settings files belong to their owners, who keep their own key order,
indentation and spacing. Re-serializing a parsed file would rewrite all of
that, so this module locates values by their offsets in the text
(:func:`parse`) and splices only the part that changes. An item added with
:func:`append_item` or :func:`add_member` and later taken out with
:func:`remove_child` gives back the original text byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from snapshotd.errors import InvalidParams

_WHITESPACE = " \t\n\r"
_DECODER = json.JSONDecoder()
MAX_DEPTH = 64  # settings nest a few levels; a deeper file is not one, and would exhaust the stack


@dataclass
class Node:
    """A JSON value and where it lies in the text (``text[start:end]``).

    ``children`` holds an array's items, or an object's values; ``keys`` and
    ``key_starts`` hold an object's member names and the offsets of their quotes.
    """

    kind: str  # "object", "array" or "scalar"
    start: int
    end: int
    value: Any = None
    children: list[Node] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    key_starts: list[int] = field(default_factory=list)

    def member(self, key: str) -> Node | None:
        """The value of the object member ``key`` (the last one, as JSON parsers take it)."""
        for name, child in zip(reversed(self.keys), reversed(self.children), strict=True):
            if name == key:
                return child
        return None

    def index_of(self, child: Node) -> int:
        return next(i for i, node in enumerate(self.children) if node is child)

    def child_start(self, index: int) -> int:
        """Where child ``index`` begins: an item's first byte, or a member's key quote."""
        return self.key_starts[index] if self.kind == "object" else self.children[index].start


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def _expect(text: str, pos: int, char: str) -> None:
    if pos >= len(text) or text[pos] != char:
        raise ValueError(f"expected {char!r} at offset {pos}")


def _parse_value(text: str, pos: int, depth: int = 0) -> Node:
    pos = _skip(text, pos)
    if pos >= len(text):
        raise ValueError("unexpected end of text")
    if text[pos] not in "{[":
        value, end = _DECODER.raw_decode(text, pos)
        return Node("scalar", pos, end, value)
    if depth >= MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels at offset {pos}")
    node = Node("object" if text[pos] == "{" else "array", pos, pos)
    close = "}" if node.kind == "object" else "]"
    pos = _skip(text, pos + 1)
    if pos < len(text) and text[pos] == close:
        node.end = pos + 1
        return node
    while True:
        if node.kind == "object":
            _expect(text, pos, '"')
            key, after_key = _DECODER.raw_decode(text, pos)
            node.keys.append(key)
            node.key_starts.append(pos)
            pos = _skip(text, after_key)
            _expect(text, pos, ":")
            pos += 1
        child = _parse_value(text, pos, depth + 1)
        node.children.append(child)
        pos = _skip(text, child.end)
        if pos < len(text) and text[pos] == ",":
            pos = _skip(text, pos + 1)
            continue
        _expect(text, pos, close)
        node.end = pos + 1
        return node


def parse(text: str, name: str) -> Node:
    """The value tree of ``text``; an :class:`InvalidParams` naming ``name`` if it is not JSON."""
    try:
        root = _parse_value(text, 0)
        if _skip(text, root.end) != len(text):
            raise ValueError(f"extra data at offset {root.end}")
    except ValueError as exc:
        raise InvalidParams(f"{name} is not valid JSON ({exc}); fix or move it, then try again.") from exc
    return root


def indent_unit(text: str, root: Node) -> str:
    """The file's indentation step, read from its first nested line (two spaces if none)."""
    for start in (*root.key_starts, *(child.start for child in root.children)):
        line_start = text.rfind("\n", 0, start) + 1
        leading = text[line_start:start]
        if line_start and leading and not leading.strip():
            return leading
    return "  "


def _line_indent(text: str, pos: int) -> str:
    """The whitespace that opens the line holding ``pos``."""
    line_start = text.rfind("\n", 0, pos) + 1
    end = line_start
    while end < len(text) and text[end] in " \t":
        end += 1
    return text[line_start:end]


def _render(value: Any, unit: str, indent: str, multiline: bool) -> str:
    """``value`` as JSON text placed at ``indent``, in the file's own style."""
    if not multiline:
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    text = json.dumps(value, ensure_ascii=False, indent=unit)
    return text.replace("\n", "\n" + indent)


def _insert(text: str, container: Node, piece: Any, key: str | None, unit: str) -> str:
    """Append one item (``key`` None) or member to ``container``, spaced like its siblings."""
    if container.children:
        last = len(container.children) - 1
        before = container.children[last - 1].end if last else container.start + 1
        gap = text[before : container.child_start(last)]
        separator = gap[gap.find(",") + 1 :] if "," in gap else gap
        multiline = "\n" in separator
        indent = _line_indent(text, container.child_start(last)) if multiline else ""
        head = "," + separator
        tail = ""
    else:
        indent = _line_indent(text, container.start) + unit
        multiline = True
        head = "\n" + indent
        tail = "\n" + _line_indent(text, container.start)
    rendered = _render(piece, unit, indent, multiline)
    if key is not None:
        rendered = json.dumps(key, ensure_ascii=False) + ": " + rendered
    at = container.children[-1].end if container.children else container.start + 1
    end = at if container.children else container.end - 1
    return text[:at] + head + rendered + tail + text[end:]


def append_item(text: str, array: Node, value: Any, unit: str) -> str:
    """``text`` with ``value`` added as the last item of ``array``."""
    return _insert(text, array, value, None, unit)


def add_member(text: str, obj: Node, key: str, value: Any, unit: str) -> str:
    """``text`` with the member ``key: value`` added at the end of ``obj``."""
    return _insert(text, obj, value, key, unit)


def remove_child(text: str, container: Node, index: int) -> str:
    """``text`` without child ``index`` of ``container`` (an item, or a member with its key).

    A child after others goes with the comma and spacing before it, a first
    child with those after it, and an only child leaves ``[]`` or ``{}``.
    """
    children = container.children
    if index > 0:
        return text[: children[index - 1].end] + text[children[index].end :]
    if len(children) > 1:
        return text[: container.child_start(0)] + text[container.child_start(1) :]
    return text[: container.start + 1] + text[container.end - 1 :]


def hook_handlers(text: str) -> Iterator[tuple[str, int, dict[str, Any], int, Any]]:
    """(event, group index, group, handler index, handler) of every hook handler in a settings text.

    The same walk of ``{"hooks": {EVENT: [{"matcher"?, "hooks": [handler…]}]}}``
    serves Claude Code's and Codex's files; a text that is not JSON, or not of
    that shape, has none.
    """
    try:
        hooks = json.loads(text).get("hooks", {})
    except (ValueError, AttributeError):
        return
    for event, groups in hooks.items() if isinstance(hooks, dict) else ():
        for g, group in enumerate(groups if isinstance(groups, list) else []):
            handlers = group.get("hooks") if isinstance(group, dict) else None
            for h, handler in enumerate(handlers if isinstance(handlers, list) else []):
                yield event, g, group, h, handler
