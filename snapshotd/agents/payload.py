"""What one hook payload of Claude Code or Codex asks to record: where, in which session, under which label.

Both tools run a command at each lifecycle event with one JSON object on
stdin (``session_id``, ``cwd``, ``hook_event_name``; ``prompt`` on
``UserPromptSubmit``; ``tool_name`` and ``tool_input`` around tools; Codex adds
``turn_id``). :func:`describe` reads it into a :class:`HookEvent` (the
worktree, the agent's session, a label such as ``before: fix the parser``).
Every hook imports this module, so it stays on light modules (see
:mod:`snapshotd.jsonlite`).
"""

from __future__ import annotations

import os
import select
import time

from snapshotd.contract.trailers import value_fits
from snapshotd.errors import InvalidParams
from snapshotd.jsonlite import loads
from snapshotd.settings import getenv

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

TOOLS = ("claude-code", "codex")
"""The agent tools whose hook payloads :func:`describe` reads."""

INTEGRATIONS = (*TOOLS, "opencode")
"""What ``integrate`` and ``doctor`` know: the hook tools, and OpenCode, whose plug-in checkpoints through
the Node client (:mod:`snapshotd.agents.opencode`)."""

EVENT_SETS = ("turns", "tools")
"""Which events ``integrate`` hooks: ``turns``, at the session's start, before each prompt and after
each turn; ``tools``, also after each edit or shell tool."""

BEFORE_PROMPT = "before: "
"""Label prefix of the checkpoint taken as a prompt is submitted: a turn starts there."""

AFTER_TURN = "after turn"
"""Label of the checkpoint taken when the agent stops at the end of a turn."""

INTERRUPTED = AFTER_TURN + " (interrupted)"
"""Label of the checkpoint that closes a turn no ``Stop`` ended (the user pressed Esc, the agent was
killed), taken at the session's next prompt or resumed start: the turn's work ends there."""

FAILED_TURN = AFTER_TURN + " (failed)"
"""Label of the checkpoint taken when a turn ends on an error of the model's API (``StopFailure``)."""

OPENS_TURN = ("UserPromptSubmit", "SessionStart")
"""Events before which a turn of the session still open is closed (:data:`INTERRUPTED`)."""

LABEL_DETAIL_CHARS = 72
"""The part of a label quoted from a prompt or a command is cut to this many characters."""

STDIN_WAIT_S = 5
"""The payload must arrive on stdin within this long."""

BEFORE_EVENTS = ("UserPromptSubmit", "PreToolUse")
"""Events after which the agent acts: their hook returns only once the checkpoint is recorded."""

AGENT_IDS = {
    "session_id": "session",
    "prompt_id": "prompt",
    "turn_id": "turn",
    "tool_use_id": "tool_use",
    "agent_id": "subagent",
    "transcript_path": "transcript",
    "model": "model",
}
"""Payload field -> the key of the checkpoint's ``agent`` ids (``Snapshotd-Agent-*`` trailers): Claude Code's
``prompt_id`` and Codex's ``turn_id`` tie a checkpoint to its turn, ``tool_use_id`` to its tool call,
``agent_id`` to the subagent that ran it (the model is in Codex's every payload, Claude Code's first)."""

TURN_IDS = ("prompt", "turn", "tool_use", "subagent")
"""Ids of one turn or call, left out of the checkpoint that closes an earlier turn (:data:`INTERRUPTED`)."""

_EDIT_TOOLS_PATH_KEYS = ("file_path", "notebook_path", "path")
_PATCH_FILE_MARKERS = ("*** Add File: ", "*** Update File: ", "*** Delete File: ", "*** Move to: ")


class HookEvent:
    """What a hook payload asks to record: where, in which session, and under which label."""

    __slots__ = ("agent", "cwd", "event", "label", "session", "starts")

    def __init__(
        self, event: str, cwd: str, session: str | None, label: str, agent: dict[str, str] | None = None, starts: bool = False
    ) -> None:
        self.event, self.cwd, self.session, self.label = event, cwd, session, label
        self.agent = agent or {}
        self.starts = starts  # the session starts or resumes here: its folder is taken anew (.sessionstate)

    def __repr__(self) -> str:
        return f"HookEvent(event={self.event!r}, cwd={self.cwd!r}, session={self.session!r}, label={self.label!r})"

    def params(self, label: str | None = None) -> dict[str, Any]:
        """The params of the ``checkpoint`` call for this event, or of one labelled ``label`` that closes the
        session's earlier turn (without this turn's ids)."""
        params: dict[str, Any]
        if label is None:
            params = {"path": self.cwd, "session": self.session, "label": self.label}
            agent = self.agent
        else:
            params = {"path": self.cwd, "session": self.session, "label": label}
            agent = {key: value for key, value in self.agent.items() if key not in TURN_IDS}
        if agent:
            params["agent"] = agent
        return params


def _shorten(text: str) -> str:
    """The first non-empty line of ``text``, cut to :data:`LABEL_DETAIL_CHARS`; a NUL, which no label may hold
    (a commit message ends there), becomes U+FFFD."""
    line = next((part.strip() for part in text.replace("\0", "\ufffd").splitlines() if part.strip()), "")
    if len(line) > LABEL_DETAIL_CHARS:
        line = line[: LABEL_DETAIL_CHARS - 1].rstrip() + "…"
    return line


def _relative(path: str, cwd: str) -> str:
    """``path`` relative to the agent's folder when it lies inside it, else as given."""
    if os.path.isabs(path):
        rel = os.path.relpath(path, cwd)
        if not rel.startswith(".."):
            return rel
    return path


def _patch_files(patch: str) -> list[str]:
    """The files an ``apply_patch`` body (Codex's edit tool) adds, updates, deletes or moves to."""
    files = []
    for line in patch.splitlines():
        for marker in _PATCH_FILE_MARKERS:
            if line.startswith(marker) and line[len(marker) :].strip() not in files:
                files.append(line[len(marker) :].strip())
    return files


def _tool_detail(tool_name: str, tool_input: Any, cwd: str) -> str:
    """What a tool call did, in a few words: the command of a shell, the files of an edit."""
    if not isinstance(tool_input, dict):
        return ""
    command = tool_input.get("command")
    if tool_name == "apply_patch" and isinstance(command, str):
        return ", ".join(_patch_files(command))
    if isinstance(command, list) and all(isinstance(part, str) for part in command):
        import shlex  # here: most commands are strings, and every hook imports this module

        command = shlex.join(command)
    if isinstance(command, str):
        return command
    for key in _EDIT_TOOLS_PATH_KEYS:
        if isinstance(tool_input.get(key), str):
            return _relative(tool_input[key], cwd)
    return ""


def _label(payload: dict[str, Any], event: str, cwd: str) -> str:
    """The checkpoint's label for one event, so that ``list --session`` reads as the turns."""
    if event == "UserPromptSubmit":
        prompt = payload.get("prompt")
        return BEFORE_PROMPT + _shorten(prompt if isinstance(prompt, str) else "")
    if event == "Stop":
        return AFTER_TURN
    if event == "StopFailure":
        return FAILED_TURN
    if event in ("PreToolUse", "PostToolUse", "PostToolUseFailure"):
        named = payload.get("tool_name")
        tool_name = named if isinstance(named, str) else "tool"
        detail = _shorten(_tool_detail(tool_name, payload.get("tool_input"), cwd))
        when = {"PreToolUse": "before", "PostToolUse": "after"}.get(event, "after failed")
        return f"{when} {tool_name}: {detail}" if detail else f"{when} {tool_name}"
    if event == "SubagentStop":
        return "after subagent"
    if event == "SessionStart":
        source = payload.get("source")
        return f"session start ({source})" if isinstance(source, str) and source else "session start"
    return event


def ends_turn(label: str) -> bool:
    """Whether a checkpoint labelled ``label`` ends its turn (:data:`AFTER_TURN`, interrupted or failed)."""
    return label == AFTER_TURN or label.startswith(AFTER_TURN + " (")


def turn_open(label: str) -> bool:
    """Whether a session whose newest checkpoint is labelled ``label`` is inside a turn that did not end."""
    return not ends_turn(label) and not label.startswith("session start")


def describe(tool: str, data: bytes, getcwd: Callable[[], str] = os.getcwd) -> HookEvent:
    """Read one hook payload of ``tool`` (``claude-code`` or ``codex``) into a :class:`HookEvent`.

    Raises :class:`~snapshotd.errors.InvalidParams` with one sentence when the
    tool is unknown or the payload is not a hook object.
    """
    if tool not in TOOLS:
        raise InvalidParams(f"Unknown agent tool {tool!r}; use one of: {', '.join(TOOLS)}.")
    try:
        payload = loads(data.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError is one
        raise InvalidParams(f"The hook payload on stdin is not JSON ({exc}).") from exc
    if not isinstance(payload, dict):
        raise InvalidParams("The hook payload on stdin is not a JSON object.")
    event = payload.get("hook_event_name")
    if not isinstance(event, str) or not event:
        raise InvalidParams("The hook payload has no 'hook_event_name'; is this command run by the agent's hooks?")
    cwd = payload.get("cwd")
    project = getenv("CLAUDE_PROJECT_DIR") if tool == "claude-code" else None
    if project and os.path.isabs(project):
        cwd = project  # the session stays where it started: the payload's cwd follows the agent's cd
    elif not isinstance(cwd, str) or not os.path.isabs(cwd):
        cwd = getcwd()
    session = payload.get("session_id")
    session = session if isinstance(session, str) and session else None
    agent = {"tool": tool}
    agent.update((key, payload[field]) for field, key in AGENT_IDS.items() if value_fits(payload.get(field)))
    starts = event == "SessionStart" and payload.get("source") in (None, "startup", "resume")
    return HookEvent(event, cwd, session, _label(payload, event, cwd), agent, starts)


NOT_PIPED = "This command reads one hook payload on stdin; the agent's hooks run it."
LATE = "The hook payload did not arrive on stdin in time."


def read_stdin(deadline: float) -> bytes:
    """All of stdin, or what came before ``deadline`` (a ``time.monotonic()`` moment)."""
    fd = 0
    if os.isatty(fd):
        raise InvalidParams(NOT_PIPED)
    chunks: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise InvalidParams(LATE)
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
