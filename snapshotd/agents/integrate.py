"""Add snapshotd's hook entries to an agent tool's settings, or take them out again.

Claude Code reads hooks from ``.claude/settings.json`` (project) and
``~/.claude/settings.json`` (user); Codex from ``.codex/hooks.json`` and
``~/.codex/hooks.json``. Both use the same shape::

    {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "...", "timeout": 60}]}],
               "PostToolUse": [{"matcher": "Bash", "hooks": [...]}]}}

:func:`plan` computes the new text of the file with :mod:`.jsonedit`, so that
everything else in it stays as it was, byte for byte; adding twice changes
nothing, and removing after adding gives back the file as it was before.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapshotd.agents import jsonedit, projectfiles
from snapshotd.agents.hooks import TOOLS
from snapshotd.agents.hookserve import NATIVE_EVENTS, native_entry
from snapshotd.agents.payload import INTEGRATIONS
from snapshotd.errors import InvalidParams, SnapshotdError
from snapshotd.fsutil import atomic_write
from snapshotd.settings import HOOK_TIMEOUT_S

TURN_EVENTS = {"claude-code": ("SessionStart", "UserPromptSubmit", "Stop", "StopFailure"), "codex": ("SessionStart", "UserPromptSubmit", "Stop")}
"""The events of ``--events turns``: the session's start checkpoints and warms the worktree, so that
the first "before" (which waits for its checkpoint) is quick; Claude Code also ends a turn on an API
error (``StopFailure``)."""

TOOL_EVENTS = {"claude-code": ("PostToolUse", "PostToolUseFailure"), "codex": ("PostToolUse",)}
"""The events ``--events tools`` adds, each with :data:`EDIT_MATCHERS` (a failed tool may have changed
files too); Claude Code's ``SubagentStop`` comes with them, unmatched."""

BACKGROUND = "async"
"""The hooks after a tool (and a subagent) run in the background (``"async": true``): the agent starts the
hook and goes on, waiting for nothing; their checkpoints still keep the order of the session's events
(:mod:`.hookorder`). The session's start, a prompt and a turn's end keep the agent waiting for their
hook: a prompt's "before" must be recorded before the agent acts, and the turn's last hook holds
``claude -p`` until the turn's background hooks have handed their checkpoints off."""

EDIT_MATCHERS = {"claude-code": "Bash|Edit|Write|MultiEdit|NotebookEdit|mcp__.*", "codex": "Bash|apply_patch"}
"""The tools after which ``--events tools`` also checkpoints, as each agent's matcher regex (Claude
Code's MCP tools, ``mcp__<server>__<tool>``, may edit files too)."""

@dataclass
class Change:
    """What :func:`plan` would do to one settings file."""

    path: Path
    old: str | None  # None: the file does not exist
    new: str | None  # None: it is not to exist
    events: list[str]
    warnings: list[str] = field(default_factory=list)
    project: Path | None = None  # the project's root for a project's settings: the file must stay inside it
    trust: Change | None = None  # Codex: the change to config.toml that trusts (or forgets) the entries

    @property
    def changed(self) -> bool:
        return self.old != self.new

    def diff(self) -> str:
        """The change as a unified diff, for a dry run."""
        old, new = ((text or "").splitlines(keepends=True) for text in (self.old, self.new))
        lines = difflib.unified_diff(old, new, fromfile=str(self.path), tofile=str(self.path))
        text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
        return text + (self.trust.diff() if self.trust is not None else "")

    def to_wire(self) -> dict[str, Any]:
        wire = {"file": str(self.path), "changed": self.changed, "events": self.events, "warnings": self.warnings}
        if self.trust is not None:
            wire["trust"] = {"file": str(self.trust.path), "changed": self.trust.changed}
        return wire


HOOK_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hookentry.py")
"""The hook program the agent runs (:mod:`.hookentry`): light enough for every event."""


def hook_command(tool: str) -> str:
    """The command the agent runs: this interpreter on :data:`HOOK_PROGRAM` with ``-I -S`` (no
    site-packages, no PYTHON* variables), both by absolute path, since the agent's shell may not have
    this PATH (an activated venv)."""
    return f"{shlex.quote(sys.executable)} -I -S {shlex.quote(HOOK_PROGRAM)} {tool}"


def native_command(tool: str) -> str:
    """The native entry (:mod:`.hookserve`) if built, running :func:`hook_command` when the daemon cannot take the hook."""
    native = native_entry()
    return f"{shlex.quote(native)} {hook_command(tool)}" if native else hook_command(tool)


_OURS = r"(?:snapshotd\S*\s+(?:\S.*\s)?hook|snapshotd/agents/hookentry\.py'?)\s+{tool}(\s|$)"
"""A handler is snapshotd's when it runs ``snapshotd ... hook TOOL`` (older settings) or the hook program."""


def _is_ours(hook: Any, tool: str) -> bool:
    """Whether one hook handler of the settings runs snapshotd's hook for ``tool``."""
    command = hook.get("command") if isinstance(hook, dict) else None
    return isinstance(command, str) and re.search(_OURS.format(tool=re.escape(tool)), command) is not None


def is_ours(hook: Any, tool: str) -> bool:
    """Whether one hook handler of the settings runs snapshotd's hook for ``tool``."""
    return _is_ours(hook, tool)


def our_handlers(text: str, tool: str) -> list[tuple[str, int, dict[str, Any]]]:
    """(event, group index, handler) of each of snapshotd's handlers in a settings text (none if it is not JSON)."""
    return [(event, g, handler) for event, g, _, _, handler in jsonedit.hook_handlers(text) if _is_ours(handler, tool)]


def read_settings(path: Path, project: Path | None) -> str | None:
    """The text of a settings file, read as :func:`plan` reads it (None when there is none)."""
    return _read_settings(path, project)


def wanted_entries(tool: str, events: str) -> dict[str, dict[str, Any]]:
    """Event name -> the matcher group snapshotd adds for it."""
    handler = {"type": "command", "command": hook_command(tool), "timeout": HOOK_TIMEOUT_S}
    native = {**handler, "command": native_command(tool)}
    wanted: dict[str, dict[str, Any]] = {event: {"hooks": [native if event in NATIVE_EVENTS else handler]} for event in TURN_EVENTS[tool]}
    if events == "tools":
        background = {**handler, BACKGROUND: True}
        for event in TOOL_EVENTS[tool]:
            wanted[event] = {"matcher": EDIT_MATCHERS[tool], "hooks": [background]}
        if tool == "claude-code":
            wanted["SubagentStop"] = {"hooks": [background]}
    return wanted


def _project_root(cwd: str) -> str:
    """The root of the worktree holding ``cwd`` (the folder itself outside git)."""
    from snapshotd.store.identity import (
        locate,  # pygit2 comes with it: kept off the hook's start-up path
    )

    return locate(cwd).root


def project_root(cwd: str) -> str:
    """The root of the worktree holding ``cwd``: where a project's settings go."""
    return _project_root(cwd)


MAX_SETTINGS_BYTES = 1 << 20
"""A settings file larger than this (1 MiB) is refused, not read: settings are a few KiB."""


def _read_settings(path: Path, project: Path | None) -> str | None:
    """The text of a settings file (None when there is none), at most :data:`MAX_SETTINGS_BYTES`.

    In a project it is reached only inside the project (:mod:`.projectfiles`);
    either way it is opened without blocking (a FIFO must not hang the command).
    """
    if project is not None:
        return projectfiles.read_file(project, path.parent.relative_to(project).as_posix(), path.name, MAX_SETTINGS_BYTES)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InvalidParams(f"Cannot read {path} ({exc.strerror}).") from exc
    try:
        return projectfiles.read_limited(fd, path, MAX_SETTINGS_BYTES)
    finally:
        os.close(fd)


SCOPES = ("user", "project", "local")
"""Whose settings ``integrate`` edits: yours, the worktree's shared ones, or the worktree's own to you
(Claude Code's ``.claude/settings.local.json``, which it keeps out of git)."""


def settings_path(tool: str, scope: str, cwd: str) -> Path:
    """The file to edit: the project's (at the worktree's root), your local one in it, or the user's."""
    if scope == "local":
        if tool != "claude-code":
            raise InvalidParams("Only Claude Code has local settings (.claude/settings.local.json); use --project or --user.")
        return Path(_project_root(cwd)) / ".claude" / "settings.local.json"
    if scope == "project":
        base = Path(_project_root(cwd)) / (".claude" if tool == "claude-code" else ".codex")
    elif tool == "claude-code":
        base = Path(os.environ.get("CLAUDE_CONFIG_DIR") or Path.home() / ".claude")
    else:
        base = Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")
    return base / ("settings.json" if tool == "claude-code" else "hooks.json")


def _our_positions(root: jsonedit.Node, tool: str) -> list[tuple[str, int, int]]:
    """(event, group index, handler index) of every snapshotd handler, last first."""
    hooks = root.member("hooks") if root.kind == "object" else None
    found: list[tuple[str, int, int]] = []
    if hooks is None or hooks.kind != "object":
        return found
    for event, groups in zip(hooks.keys, hooks.children, strict=True):
        for g, group in enumerate(groups.children if groups.kind == "array" else []):
            handlers = group.member("hooks") if group.kind == "object" else None
            for h, handler in enumerate(handlers.children if handlers and handlers.kind == "array" else []):
                if _is_ours(_to_python(handler), tool):
                    found.append((event, g, h))
    return found[::-1]


def _remove_one(text: str, name: str, event: str, g: int, h: int) -> str:
    """Take out one handler; then the group, event and ``hooks`` object it leaves empty."""
    root = jsonedit.parse(text, name)
    hooks = root.member("hooks")
    assert hooks is not None
    groups = hooks.member(event)
    assert groups is not None
    handlers = groups.children[g].member("hooks")
    assert handlers is not None
    if len(handlers.children) > 1:
        return jsonedit.remove_child(text, handlers, h)
    if len(groups.children) > 1:
        return jsonedit.remove_child(text, groups, g)
    if len(hooks.children) > 1:
        return jsonedit.remove_child(text, hooks, hooks.index_of(groups))
    return jsonedit.remove_child(text, root, root.index_of(hooks))


def _without_ours(text: str, name: str, tool: str, keep: dict[str, dict[str, Any]]) -> str:
    """``text`` without snapshotd's handlers, except those that already match ``keep`` exactly."""
    while True:
        root = jsonedit.parse(text, name)
        for event, g, h in _our_positions(root, tool):
            groups = root.member("hooks").member(event)  # type: ignore[union-attr]
            assert groups is not None  # _our_positions found the event there
            if event in keep and _to_python(groups.children[g]) == keep[event]:
                continue
            text = _remove_one(text, name, event, g, h)
            break
        else:
            return text


def _to_python(node: jsonedit.Node) -> Any:
    """The Python value of a parsed node (to read a handler, or compare a group with ours)."""
    if node.kind == "scalar":
        return node.value
    if node.kind == "array":
        return [_to_python(child) for child in node.children]
    return {key: _to_python(child) for key, child in zip(node.keys, node.children, strict=True)}


def _with_ours(text: str, name: str, tool: str, wanted: dict[str, dict[str, Any]]) -> str:
    """``text`` with each wanted group appended to its event (the event and ``hooks`` created if missing)."""
    for event, group in wanted.items():
        root = jsonedit.parse(text, name)
        if root.kind != "object":
            raise InvalidParams(f"{name} does not hold a JSON object; fix or move it, then try again.")
        unit = jsonedit.indent_unit(text, root)
        present = {e for e, _, _ in _our_positions(root, tool)}
        if event in present:
            continue
        hooks = root.member("hooks")
        if hooks is None:
            text = jsonedit.add_member(text, root, "hooks", {event: [group]}, unit)
        elif hooks.kind != "object":
            raise InvalidParams(f"'hooks' in {name} is not an object; fix it, then try again.")
        elif (groups := hooks.member(event)) is None:
            text = jsonedit.add_member(text, hooks, event, [group], unit)
        elif groups.kind != "array":
            raise InvalidParams(f"'hooks.{event}' in {name} is not a list; fix it, then try again.")
        else:
            text = jsonedit.append_item(text, groups, group, unit)
    return text


def codex_hooks_disabled(project_root: str | None) -> list[str]:
    """Where Codex's ``[features]`` turn hooks off (``hooks = false``, or the older ``codex_hooks``)."""
    files: list[tuple[Path, Path | None]] = [(Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex") / "config.toml", None)]
    if project_root:
        files.append((Path(project_root) / ".codex" / "config.toml", Path(project_root)))
    found = []
    for config, project in files:
        try:
            features = tomllib.loads(_read_settings(config, project) or "").get("features", {})
        except (SnapshotdError, tomllib.TOMLDecodeError):
            continue
        for key in ("hooks", "codex_hooks"):
            if isinstance(features, dict) and features.get(key) is False:
                found.append(
                    f"Codex hooks are turned off by [features] {key} = false in {config}; "
                    "set it to true there, or these hooks will not run."
                )
    return found


def _plan_opencode(scope: str, *, remove: bool, events: str, cwd: str) -> Change:
    """The plug-in file OpenCode loads from its ``plugins`` folder, written or taken away."""
    from snapshotd.agents import opencode

    project = Path(_project_root(cwd)) if scope != "user" else None
    path = opencode.plugin_path(scope, str(project) if project is not None else None)
    old = _read_settings(path, project)
    new = opencode.new_text(old, path, remove=remove, events=events)
    return Change(path, old, new, [] if remove else [events], project=project)


def plan(tool: str, scope: str, *, remove: bool, events: str, cwd: str) -> Change:
    """The change ``integrate`` makes to the settings file of ``tool`` in ``scope``; nothing is written."""
    if tool == "opencode":
        return _plan_opencode(scope, remove=remove, events=events, cwd=cwd)
    if tool not in TOOLS:
        raise InvalidParams(f"Unknown agent tool {tool!r}; use one of: {', '.join(INTEGRATIONS)}.")
    path = settings_path(tool, scope, cwd)
    project = Path(_project_root(cwd)) if scope in ("project", "local") else None
    old = _read_settings(path, project)
    wanted = {} if remove else wanted_entries(tool, events)
    if old is None:
        new = json.dumps({"hooks": {event: [group] for event, group in wanted.items()}}, indent=2) + "\n" if wanted else None
    else:
        new = _with_ours(_without_ours(old, str(path), tool, wanted), str(path), tool, wanted)
    if old is not None and new is not None and "\r\n" in old:
        new = re.sub(r"(?<!\r)\n", "\r\n", new)  # the file's own line endings, in what was added too
    if remove and project is None and new is not None and _is_empty_object(new):
        new = None  # only the object that held snapshotd's entries is left: the file goes
    change = Change(path, old, new, sorted(wanted), project=project)
    if tool == "codex":
        _plan_trust(change)
    if tool == "codex" and not remove:
        change.warnings += codex_hooks_disabled(str(project) if project is not None else None)
    return change


def _plan_trust(change: Change) -> None:
    """Codex runs new hook entries only once trusted: record the trust of exactly ours in its config.toml, as
    Codex's ``/hooks`` does (and forget it for entries removed), or warn with the one step left to the user."""
    from snapshotd.agents import codextrust

    config = Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex") / "config.toml"
    try:
        old: str | None = config.read_bytes().decode("utf-8")  # not read_text: its line endings stay
    except FileNotFoundError:
        old = None
    except (OSError, UnicodeDecodeError):
        change.warnings.append(codextrust.manual_step(change.path))
        return
    before, after = (codextrust.entries(change.path, text or "", lambda h: _is_ours(h, "codex")) for text in (change.old, change.new))
    change.warnings += codextrust.moved_warnings(change.path, change.old, change.new, old or "", lambda h: not _is_ours(h, "codex"))
    new = codextrust.retrusted(old or "", before, after)
    if new is None:
        change.warnings.append(codextrust.manual_step(change.path))
        return
    if new != (old or ""):
        change.trust = Change(config, old, new or None, [])  # emptied: the file snapshotd made goes


def _is_empty_object(text: str) -> bool:
    try:
        value: object = json.loads(text)
    except ValueError:
        return False
    return value == {}


def apply(change: Change) -> None:
    """Write the planned text, atomically, keeping the file's mode (in a project: only inside it, never through a link).

    The user's own settings file may be a link (to a dotfiles repository): the
    file it points to is written, and the link stays. A file planned away
    (``new`` None) is removed, and its folder too when that leaves it empty.
    """
    if change.trust is not None:
        apply(change.trust)
    if not change.changed:
        return
    if change.project is not None:
        folder = change.path.parent.relative_to(change.project).as_posix()
        if change.new is not None:
            projectfiles.write_file(change.project, folder, change.path.name, change.new.encode("utf-8"))
        else:
            projectfiles.remove_file(change.project, folder, change.path.name)
        return
    target = change.path.resolve()
    if change.new is None:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        with contextlib.suppress(OSError):  # not empty: it holds other things of the tool's
            target.parent.rmdir()
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    atomic_write(target, change.new.encode("utf-8"), mode)
