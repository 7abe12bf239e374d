"""``snapshotd doctor``: the whole chain from an agent's hook to a recorded checkpoint, checked for one worktree.

Each :class:`Check` says what was found and, when it is a problem, the one
thing to do about it: the daemon answers; the tool's settings (the user's and
the worktree's) run snapshotd's hook by an absolute command, with a timeout the
"before" budget fits in; Codex trusts those entries (:mod:`.codextrust`);
OpenCode's plug-in folder holds snapshotd's plug-in, whose imports are there;
and the last hook run of the tool recorded its checkpoint (:mod:`.hookstate`;
the OpenCode plug-in keeps its last outcome in the same place).
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapshotd.agents import codextrust, hookstate, integrate, jsonedit
from snapshotd.agents.hooks import TOOLS
from snapshotd.agents.hookserve import NATIVE_PROGRAM
from snapshotd.errors import InvalidParams, SnapshotdError
from snapshotd.settings import HOOK_TIMEOUT_S


@dataclass
class Check:
    """One link of the chain: what was found, and what to do when it is a problem."""

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix}


@dataclass
class Installed:
    """snapshotd's handlers in one settings file."""

    path: Path
    text: str
    handlers: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (event, handler)
    unreadable: str | None = None  # why the file is not JSON: the agent ignores it, and integrate will not edit it


def check_daemon(ping: Callable[[], dict[str, Any]], socket_path: str) -> Check:
    """Whether a daemon answers a ping on ``socket_path`` (none running is fine: a hook starts one)."""
    try:
        answer = ping()
    except FileNotFoundError:
        return Check("daemon", True, f"no daemon runs on {socket_path}; the first hook starts one")
    except (OSError, SnapshotdError) as exc:
        message = exc.message if isinstance(exc, SnapshotdError) else str(exc)
        return Check("daemon", False, f"the daemon on {socket_path} does not answer ({message})", "run `snapshotd stop`, then `snapshotd status` to start a new one")
    return Check("daemon", True, f"daemon {answer.get('version')} (pid {answer.get('pid')}) answers on {socket_path}")


def _installed(tool: str, cwd: str) -> list[Installed]:
    """The settings files of ``tool`` (the user's, then the worktree's, then the local one) that hold snapshotd's handlers."""
    found = []
    for scope in integrate.SCOPES:
        try:
            path = integrate.settings_path(tool, scope, cwd)
            project = path.parent.parent if scope != "user" else None
            text = integrate.read_settings(path, project)
        except (SnapshotdError, OSError):
            continue
        if text is None:
            continue
        entry = Installed(path, text)
        try:
            jsonedit.parse(text, str(path))
        except InvalidParams as exc:
            entry.unreadable = exc.message
            found.append(entry)
            continue
        for event, _group, handler in integrate.our_handlers(text, tool):
            entry.handlers.append((event, handler))
        if entry.handlers:
            found.append(entry)
    return found


def _command_problem(command: str) -> str | None:
    """What is wrong with a hook command, if anything: it must start with an absolute, executable program."""
    try:
        program = shlex.split(command)[0]
    except (ValueError, IndexError):
        return f"the command {command!r} does not parse"
    if not os.path.isabs(program):
        return f"the command starts with {program!r}, found only through PATH (the agent's shell may not have it)"
    if not os.access(program, os.X_OK):
        return f"{program} is not an executable program"
    if os.path.basename(integrate.HOOK_PROGRAM) not in command:
        return "it runs the command line's `snapshotd hook`, which costs the agent about 100 ms more per event than the hook program"
    return None


def _is_native(command: str) -> bool:
    """Whether a hook command runs the native hook entry (:mod:`.hookserve`), the Python one after it."""
    try:
        return os.path.basename(shlex.split(command)[0]) == os.path.basename(NATIVE_PROGRAM)
    except (ValueError, IndexError):
        return False


def check_hooks(tool: str, files: list[Installed]) -> list[Check]:
    """Whether ``tool``'s settings run snapshotd's hook, by an absolute command, with a long enough timeout."""
    fix = f"run `snapshotd integrate {tool}` (add `--project` for the worktree's settings)"
    if not files:
        return [Check(f"{tool} hooks", False, f"no settings of {tool} run snapshotd's hook", fix)]
    checks = []
    for entry in files:
        if entry.unreadable is not None:
            checks.append(Check(f"{tool} hooks", False, entry.unreadable.split("; fix or move it")[0],
                                "fix it or move it away, then run `snapshotd doctor` again"))
            continue
        events = sorted({event for event, _ in entry.handlers})
        problems = sorted({p for _, handler in entry.handlers if (p := _command_problem(str(handler.get("command", ""))))})
        short = sorted({event for event, h in entry.handlers if isinstance(h.get("timeout"), int) and h["timeout"] < HOOK_TIMEOUT_S})
        if short:
            problems.append(f"the timeout of {', '.join(short)} is under {HOOK_TIMEOUT_S} s, so a long 'before' checkpoint is cut off")
        native = sorted({event for event, h in entry.handlers if _is_native(str(h.get("command", "")))})
        which = f"the native entry for {', '.join(native)}, the Python one for the rest" if native else "the Python entry"
        detail = f"{entry.path}: {', '.join(events)} ({which})" + (f"; {'; '.join(problems)}" if problems else "")
        checks.append(Check(f"{tool} hooks", not problems, detail, f"run `snapshotd integrate {tool}` again" if problems else ""))
    return checks


def _codex_config() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex") / "config.toml"


def check_codex_trust(files: list[Installed]) -> list[Check]:
    """Whether Codex trusts each of snapshotd's entries (it skips the others without a word)."""
    config = _codex_config()
    try:
        config_text = config.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        config_text = ""
    checks = []
    for entry in files:
        found = codextrust.entries(entry.path, entry.text, lambda h: integrate.is_ours(h, "codex"))
        states = codextrust.status(found, config_text)
        bad = sorted(f"{e.event} ({states[e.key]})" for e in found if states[e.key] != "trusted")
        if bad:
            checks.append(Check("codex trust", False, f"Codex skips {', '.join(bad)} of {entry.path}", codextrust.manual_step(entry.path)))
        else:
            checks.append(Check("codex trust", True, f"Codex trusts every snapshotd entry of {entry.path} ({config})"))
    for warning in integrate.codex_hooks_disabled(None):
        checks.append(Check("codex trust", False, warning, "set it to true"))
    return checks


def check_last_run(tool: str, now: float | None = None) -> Check:
    """What the tool's last hook run left: recorded, or the reason it was not."""
    last = hookstate.last_result(tool)
    if last is None:
        return Check(f"{tool} last hook", True, "no hook of this tool has run yet")
    ago = round((time.time() if now is None else now) - float(last.get("time", 0)))
    what = f"{last.get('event') or 'a hook'} {ago} s ago in {last.get('cwd')}"
    if last.get("ok"):
        return Check(f"{tool} last hook", True, f"{what}: recorded")
    return Check(f"{tool} last hook", False, f"{what}: not recorded: {last.get('note')}", "fix what the note says; the next hook tells whether it worked")


MCP_FIX = (
    "pass the socket's variables to the MCP server: for Codex, env_vars = [\"SNAPSHOTD_SOCKET\", \"XDG_RUNTIME_DIR\", "
    "\"SNAPSHOTD_HOME\"] in its [mcp_servers.snapshotd] table; for Claude Code, claude mcp add -e SNAPSHOTD_SOCKET=..."
)


def check_mcp(socket_path: str, now: float | None = None) -> Check:
    """Whether the last ``snapshotd mcp`` that started used this socket (an agent may not pass the variables on)."""
    try:
        with open(os.path.join(hookstate.hooks_folder(), "mcp.json"), encoding="utf-8") as handle:
            last = json.loads(handle.read())
    except (OSError, ValueError, SnapshotdError):
        return Check("mcp server", True, "no snapshotd MCP server has started yet")
    ago = round((time.time() if now is None else now) - float(last.get("time", 0)))
    if last.get("socket") != socket_path:
        return Check("mcp server", False, f"the MCP server started {ago} s ago in {last.get('cwd')} used the socket {last.get('socket')}, not {socket_path}", MCP_FIX)
    return Check("mcp server", True, f"the MCP server started {ago} s ago in {last.get('cwd')} uses {socket_path}")


def _opencode_plugins(cwd: str) -> list[tuple[Path, str]]:
    """(path, text) of each OpenCode plug-in file named as snapshotd's, the user's then the worktree's."""
    from snapshotd.agents import opencode

    found = []
    for scope in ("user", "project"):
        try:
            project = integrate.project_root(cwd) if scope == "project" else None
            path = opencode.plugin_path(scope, project)
            text = integrate.read_settings(path, Path(project) if project else None)
        except (SnapshotdError, OSError):
            continue
        if text is not None:
            found.append((path, text))
    return found


def check_opencode(cwd: str) -> list[Check]:
    """Whether OpenCode loads snapshotd's plug-in, and everything it imports and starts is there."""
    from snapshotd.agents import opencode

    files = _opencode_plugins(cwd)
    if not files:
        fix = "run `snapshotd integrate opencode --events tools` (add `--project` for the worktree's .opencode/plugins/)"
        return [Check("opencode plug-in", False, "no OpenCode plug-in folder holds snapshotd.js", fix)]
    checks = []
    for path, text in files:
        if not opencode.is_ours(text):
            checks.append(Check("opencode plug-in", False, f"{path} is not snapshotd's plug-in", "move it away, then run `snapshotd integrate opencode`"))
            continue
        missing = [file for file in opencode.imports_of(text) if not os.path.exists(file)]
        detail = f"{path}: --events {opencode.events_of(text)}"
        if missing:
            checks.append(Check("opencode plug-in", False, f"{detail}; {', '.join(missing)} no longer exists", "run `snapshotd integrate opencode` again"))
        else:
            checks.append(Check("opencode plug-in", True, detail))
    return checks


def run_checks(tool: str | None, cwd: str, ping: Callable[[], dict[str, Any]], socket_path: str) -> list[Check]:
    """Every check for ``tool`` (or each tool whose settings hold snapshotd's hooks; both when none does)."""
    checks = [check_daemon(ping, socket_path)]
    installed = {name: _installed(name, cwd) for name in TOOLS}
    with_opencode = ["opencode"] if tool is None and _opencode_plugins(cwd) else []
    tools = [tool] if tool else [name for name in TOOLS if installed[name]] + with_opencode or list(TOOLS)
    for name in tools:
        if name == "opencode":
            checks += [*check_opencode(cwd), check_last_run(name)]
            continue
        checks += check_hooks(name, installed[name])
        readable = [entry for entry in installed[name] if entry.unreadable is None]
        if name == "codex" and readable:
            checks += check_codex_trust(readable)
        checks.append(check_last_run(name))
    checks.append(check_mcp(socket_path))
    return checks
