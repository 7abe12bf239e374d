"""Words every front end prints alike: a count with its noun, what a restore did for a submodule.

The command line and the MCP tools both say these, so each is written once
here; nothing here prints or styles.
"""

from __future__ import annotations

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
