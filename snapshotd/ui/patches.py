"""One file's patch for the page: fetched alone, cut into hunks, each side coloured by Pygments.

The daemon's ``diff`` is asked for the one path with a patch of at most
:data:`MAX_PATCH_BYTES`; a larger one (``too_large``) and a binary file are
summarised instead of shown. Each hunk's old side (context and removed lines)
and new side (context and added lines) are highlighted as a whole, so a
string or comment that spans lines keeps its colour, then split back into
lines: Pygments closes its spans at each line's end. The page lays the same
lines out unified or side by side.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name, get_lexer_for_filename
from pygments.util import ClassNotFound

from snapshotd.errors import TooLarge
from snapshotd.ui.bridge import Bridge

MAX_PATCH_BYTES = 1024 * 1024
"""The most patch text of one file the page shows; past it the file is summarised."""
MAX_HIGHLIGHT_BYTES = 256 * 1024
"""Past this much text a hunk is shown plain (escaped), not coloured: Pygments' time grows with it."""

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@(.*)$")
_FORMATTER = HtmlFormatter(nowrap=True)


@lru_cache(maxsize=256)
def _lexer(path: str) -> Lexer:
    try:
        return get_lexer_for_filename(path, stripnl=False, stripall=False, ensurenl=False)
    except ClassNotFound:
        return get_lexer_by_name("text", stripnl=False, ensurenl=False)


def _coloured(path: str, lines: list[str]) -> list[str]:
    """``lines`` of ``path`` as HTML (escaped, with Pygments' spans), one string per line."""
    text = "\n".join(lines)
    if not lines:
        return []
    if len(text) > MAX_HIGHLIGHT_BYTES:
        return [_escape(line) for line in lines]
    out = highlight(text + "\n", _lexer(path), _FORMATTER).split("\n")
    if len(out) < len(lines):  # should not happen; never show fewer lines than there are
        return [_escape(line) for line in lines]
    return out[: len(lines)]


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def parse_patch(path: str, text: str) -> dict[str, Any]:
    """The headers and hunks of a one-file patch; each line ``{"kind": " "|"+"|"-"|"\\\\", "old", "new", "html"}``."""
    headers: list[str] = []
    hunks: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.split("\n"):
        match = _HUNK.match(line)
        if match:
            current = {"header": line, "old_start": int(match[1]), "new_start": int(match[2]), "raw": []}
            hunks.append(current)
        elif current is None:
            if line:
                headers.append(line)
        elif line[:1] in (" ", "+", "-", "\\"):
            current["raw"].append(line)
        elif line.startswith("diff --git "):  # a second file (a folder of that name): its own headers
            current = None
            headers.append(line)
    return {"headers": headers, "hunks": [_lay_out(path, hunk) for hunk in hunks]}


def _lay_out(path: str, hunk: dict[str, Any]) -> dict[str, Any]:
    raw: list[str] = hunk.pop("raw")
    old_side = [line[1:] for line in raw if line[:1] in (" ", "-")]
    new_side = [line[1:] for line in raw if line[:1] in (" ", "+")]
    old_html, new_html = iter(_coloured(path, old_side)), iter(_coloured(path, new_side))
    old_no, new_no = hunk["old_start"], hunk["new_start"]
    lines = []
    for line in raw:
        kind = line[:1]
        if kind == " ":
            html = next(old_html)
            next(new_html)
            lines.append({"kind": kind, "old": old_no, "new": new_no, "html": html})
            old_no, new_no = old_no + 1, new_no + 1
        elif kind == "-":
            lines.append({"kind": kind, "old": old_no, "new": None, "html": next(old_html)})
            old_no += 1
        elif kind == "+":
            lines.append({"kind": kind, "old": None, "new": new_no, "html": next(new_html)})
            new_no += 1
        else:
            lines.append({"kind": "\\", "old": None, "new": None, "html": _escape(line[2:])})
    return {"header": hunk["header"], "lines": lines}


async def file_patch(bridge: Bridge, worktree_id: str, source: str, target: str, change: dict[str, Any]) -> dict[str, Any]:
    """What the page shows for one changed file: its hunks, or why they are not shown."""
    summary = {"path": change["path"], "status": change["status"], "old_mode": change.get("old_mode"),
               "new_mode": change.get("new_mode")}
    if change.get("binary"):
        return {**summary, "shown": "binary"}
    if change.get("new_mode") == "160000" or change.get("old_mode") == "160000":
        return {**summary, "shown": "submodule"}
    paths = [change["path"], *([change["old_path"]] if change.get("old_path") else [])]
    params = {"from": source, "to": target, "worktree": worktree_id, "paths": paths, "patch": True,
              "max_patch_bytes": MAX_PATCH_BYTES}
    try:
        found = await bridge.call("diff", params)
    except TooLarge as error:
        return {**summary, "shown": "large", "bytes": error.data.get("bytes"), "limit": MAX_PATCH_BYTES}
    if found.get("next_offset") is not None:
        return {**summary, "shown": "large", "bytes": None, "limit": MAX_PATCH_BYTES}
    return {**summary, "shown": "patch", **parse_patch(change["path"], found.get("patch") or "")}


def style_sheet() -> str:
    """Pygments' colours for ``.hl`` code: its default style, and a dark one under ``prefers-color-scheme``."""
    # types-Pygments leaves HtmlFormatter.get_style_defs unannotated (it returns the CSS text)
    light: str = HtmlFormatter(style="default").get_style_defs(".hl")  # type: ignore[no-untyped-call]
    dark: str = HtmlFormatter(style="github-dark").get_style_defs(".hl")  # type: ignore[no-untyped-call]
    return f"{_tokens_only(light)}\n@media (prefers-color-scheme: dark) {{\n{_tokens_only(dark)}\n}}\n"


def _tokens_only(css: str) -> str:
    """The rules for token classes only (the page sets the background and line numbers itself)."""
    return "\n".join(line for line in css.splitlines() if line.startswith(".hl .") and "linenos" not in line)
