"""``snapshotd integrate opencode``: snapshotd's plug-in file in one of OpenCode's plug-in folders.

OpenCode (1.18) loads every ``.js`` file of ``.opencode/plugins/`` in the
project and of ``plugins/`` in its config folder (``$XDG_CONFIG_HOME/opencode``,
else ``~/.config/opencode``). snapshotd's file there is a few lines written
here: it imports the Node client's OpenCode plug-in (``clients/node/src/opencode.js``)
and snapshotd's program by absolute path, so OpenCode needs neither on its
PATH nor an ``npm install``. Its first line marks it as snapshotd's: only
such a file is replaced or removed.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from urllib.parse import unquote

from snapshotd.errors import InvalidParams

PLUGIN_NAME = "snapshotd.js"

MARK = "// snapshotd's OpenCode plug-in, written by `snapshotd integrate opencode`"
"""The first line of the file: it is snapshotd's to replace or remove."""

NODE_CLIENT = Path(__file__).resolve().parents[2] / "clients" / "node" / "src" / "index.js"
"""The Node client in snapshotd's source tree (an editable or source install has it beside the package)."""

EVENT_WORDS = {"turns": "before each prompt and after each turn", "tools": "before each prompt, before and after each bash, edit, write and apply_patch, and after each turn"}


def config_folder() -> Path:
    """OpenCode's own config folder: ``$XDG_CONFIG_HOME/opencode``, else ``~/.config/opencode``."""
    base = os.environ.get("XDG_CONFIG_HOME")
    return (Path(base) if base and os.path.isabs(base) else Path.home() / ".config") / "opencode"


def plugin_path(scope: str, project_root: str | None) -> Path:
    """Where the plug-in goes: the project's ``.opencode/plugins/`` or the user's ``plugins/``."""
    if scope == "local":
        raise InvalidParams("Only Claude Code has local settings (.claude/settings.local.json); use --project or --user.")
    if scope == "project":
        assert project_root is not None
        return Path(project_root) / ".opencode" / "plugins" / PLUGIN_NAME
    return config_folder() / "plugins" / PLUGIN_NAME


def daemon_command() -> list[str]:
    """What the plug-in runs when no daemon answers: this interpreter on the package, by absolute path."""
    return [sys.executable, "-m", "snapshotd"]


def plugin_text(events: str) -> str:
    """The file's text for ``events`` (``turns`` or ``tools``)."""
    if not NODE_CLIENT.is_file():
        raise InvalidParams(
            f"The Node client snapshotd's OpenCode plug-in runs on is not at {NODE_CLIENT}; "
            "install snapshotd from its source tree (./scripts/setup), which has clients/node."
        )
    options = json.dumps({"events": events, "daemonCommand": daemon_command()})
    return (
        f"{MARK};\n"
        "// `snapshotd integrate opencode --remove` removes it. What it does: the Node client's src/opencode.js.\n"
        f"import {{ opencodePlugin }} from {json.dumps(NODE_CLIENT.as_uri())};\n"
        "\n"
        f"export const SnapshotdPlugin = opencodePlugin({options});\n"
    )


def is_ours(text: str | None) -> bool:
    """Whether a plug-in file's text is snapshotd's (its first line is :data:`MARK`)."""
    return text is not None and text.startswith(MARK)


def events_of(text: str | None) -> str | None:
    """The event set a plug-in file of snapshotd's records (None: not ours, or unreadable)."""
    found = re.search(r'"events":\s*"(turns|tools)"', text or "") if is_ours(text) else None
    return found.group(1) if found else None


def imports_of(text: str) -> list[str]:
    """The absolute files the plug-in needs: the Node client it imports and the program it starts."""
    files = [unquote(m.group(1)) for m in re.finditer(r'from "file://([^"]+)"', text)]
    found = re.search(r'"daemonCommand":\s*\["([^"]+)"', text)
    return files + ([json.loads(f'"{found.group(1)}"')] if found else [])


def new_text(old: str | None, path: Path, *, remove: bool, events: str) -> str | None:
    """The file's new text (None: it is not to exist); a file there that is not snapshotd's is refused."""
    if old is not None and not is_ours(old):
        raise InvalidParams(f"{path} is not snapshotd's plug-in (its first line is not snapshotd's mark); move it away, then try again.")
    return None if remove else plugin_text(events)
