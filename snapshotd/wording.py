"""Words every front end prints alike: a count with its noun, what a restore did for a submodule, a label on one line.

The command line, the MCP tools and the ui all say these, so each is written once
here; nothing here prints or styles.
"""

from __future__ import annotations

import re

from snapshotd.paths import quote_path


def plural(count: int, noun: str) -> str:
    """``1 checkpoint``, ``2 checkpoints``, ``2 processes``."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {noun}es" if noun.endswith(("s", "x", "ch", "sh")) else f"{count} {noun}s"


def submodule_note(path: str, dry_run: bool) -> str:
    """What a restore does for a submodule (a gitlink): only its folder, which ``git submodule update`` fills."""
    made = "would make" if dry_run else "made"
    return (
        f"{quote_path(path)}: submodule: {made} its folder only (a checkpoint holds no submodule's files); "
        f"'git submodule update --init -- {quote_path(path)}' checks it out"
    )


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def one_line(text: str) -> str:
    """``text`` on one line: control characters (a newline, an escape sequence) written as escapes.

    A label is whatever a client sent; printed raw, a newline would break a
    listing into two rows and an escape sequence would reach the terminal.
    """
    return _CONTROL.sub(lambda m: _ESCAPES.get(m.group(), f"\\x{ord(m.group()):02x}"), text)
