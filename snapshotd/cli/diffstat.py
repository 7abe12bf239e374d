"""``diff --stat`` as git prints it: a name column, the line count, a graph of ``+`` and ``-``, then a summary.

The widths follow git's diff.c (``show_stats``): the line fits the terminal's
columns (80 when it is not a terminal), the graph gets at least 6 of them and
is scaled when a file's changes do not fit, a name too long for its column
keeps its end after ``...``, a rename is written ``pfx{old => new}sfx``, and a
binary file shows its sizes (``Bin 3 -> 7 bytes``).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any

import click

from snapshotd.paths import quote_path
from snapshotd.wording import plural


@dataclass(frozen=True)
class _Row:
    name: str
    added: int  # lines; bytes of the new side for a binary file
    deleted: int
    binary: bool


def stat_lines(files: list[dict[str, Any]], width: int | None = None) -> list[str]:
    """The lines ``git diff --stat`` prints for these FileChange records (styled; click drops styles off a terminal)."""
    rows = [_row(change) for change in files]
    if not rows:
        return []
    width = width if width is not None else shutil.get_terminal_size().columns
    texts = [row for row in rows if not row.binary]
    max_change = max((row.added + row.deleted for row in texts), default=0)
    binary_width = max((14 + len(str(row.added)) + len(str(row.deleted)) for row in rows if row.binary), default=0)
    number_width = max(len(str(max_change)), 3 if binary_width else 0)
    width = max(width, 16 + 6 + number_width)
    graph_width = max_change if max_change + 4 > binary_width else binary_width - 4
    name_width = max(len(row.name) for row in rows)
    if name_width + number_width + 6 + graph_width > width:
        if graph_width > width * 3 // 8 - number_width - 6:
            graph_width = max(width * 3 // 8 - number_width - 6, 6)
        if name_width > width - number_width - 6 - graph_width:
            name_width = width - number_width - 6 - graph_width
        else:
            graph_width = width - number_width - 6 - name_width
    lines = [_line(row, name_width, number_width, graph_width, max_change) for row in rows]
    return [*lines, _summary(rows)]


def _row(change: dict[str, Any]) -> _Row:
    old_path = change.get("old_path")
    name = _rename(old_path, change["path"]) if old_path else quote_path(change["path"])
    if change.get("binary"):
        return _Row(name, change.get("new_size") or 0, change.get("old_size") or 0, True)
    return _Row(name, change["additions"], change["deletions"], False)


def _line(row: _Row, name_width: int, number_width: int, graph_width: int, max_change: int) -> str:
    name, prefix = row.name, ""
    if len(name) > name_width:  # the end of the name, from a folder boundary where one is in it
        prefix = "..."
        name = name[len(name) - (name_width - 3):]
        slash = name.find("/")
        if slash >= 0:
            name = name[slash:]
    start = f" {prefix}{name.ljust(name_width - len(prefix))} |"
    if row.binary:
        if not row.added and not row.deleted:
            return f"{start} {'Bin'.rjust(number_width)}"
        return (f"{start} {'Bin'.rjust(number_width)} {click.style(str(row.deleted), fg='red')} -> "
                f"{click.style(str(row.added), fg='green')} bytes")
    added, deleted = row.added, row.deleted
    if graph_width <= max_change:
        total = _scale(added + deleted, graph_width, max_change)
        if total < 2 and added and deleted:
            total = 2
        if added < deleted:
            added = _scale(added, graph_width, max_change)
            deleted = total - added
        else:
            deleted = _scale(deleted, graph_width, max_change)
            added = total - deleted
    count = row.added + row.deleted
    graph = (click.style("+" * added, fg="green") if added > 0 else "") + (
        click.style("-" * deleted, fg="red") if deleted > 0 else "")
    return f"{start} {str(count).rjust(number_width)}{' ' if count else ''}{graph}"


def _scale(count: int, width: int, max_change: int) -> int:
    """At least one column for any change: scaled as if the graph were one column narrower, plus one."""
    return 0 if not count else 1 + count * (width - 1) // max_change


def _summary(rows: list[_Row]) -> str:
    insertions = sum(row.added for row in rows if not row.binary)
    deletions = sum(row.deleted for row in rows if not row.binary)
    parts = [f" {plural(len(rows), 'file')} changed"]
    if insertions or not deletions:
        parts.append(f"{plural(insertions, 'insertion')}(+)")
    if deletions or not insertions:
        parts.append(f"{plural(deletions, 'deletion')}(-)")
    return ", ".join(parts)


def _rename(old: str, new: str) -> str:
    """``pfx{old => new}sfx``: the common folders before and the common end after, each at a ``/``."""
    if quote_path(old) != old or quote_path(new) != new:
        return f"{quote_path(old)} => {quote_path(new)}"
    prefix = 0
    for at, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            break
        if a == "/":
            prefix = at + 1
    suffix = 0
    i, j = len(old) - 1, len(new) - 1
    floor = prefix - 1 if prefix else 0
    while i >= floor and j >= floor and old[i] == new[j]:
        if old[i] == "/":
            suffix = len(old) - i
        i, j = i - 1, j - 1
    old_mid = old[prefix:max(len(old) - suffix, prefix)]
    new_mid = new[prefix:max(len(new) - suffix, prefix)]
    if prefix + suffix:
        return f"{old[:prefix]}{{{old_mid} => {new_mid}}}{old[len(old) - suffix:]}"
    return f"{old_mid} => {new_mid}"
