"""Feeding hook payloads to snapshotd's hook as the agent tools do: a real process, JSON on stdin.

:func:`run_hook` runs the command ``integrate`` writes (the light hook program);
``cli=True`` runs the command line's ``snapshotd hook`` instead.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repo_helpers import write

from snapshotd.agents.integrate import hook_command

PAYLOADS = Path(__file__).resolve().parent / "hook_payloads"
RECORDED_CWD = "/home/user/project"
HOOK_TIMEOUT_S = 60


@dataclass
class HookRun:
    code: int
    stdout: str
    stderr: str


def recorded(tool: str) -> list[tuple[str, dict[str, Any]]]:
    """(file name, payload) of the tool's recorded session, in order."""
    return [(p.name, json.loads(p.read_text())) for p in sorted((PAYLOADS / tool).glob("*.json"))]


def placed(payload: dict[str, Any], worktree: Path, **changes: Any) -> bytes:
    """The payload as the tool would send it from ``worktree``, with ``changes`` applied."""
    text = json.dumps({**payload, **changes}).replace(RECORDED_CWD, str(worktree))
    return text.encode()


def run_hook(tool: str, data: bytes, env: dict[str, str], cwd: Path | None = None, *, cli: bool = False) -> HookRun:
    """Run the hook command of ``tool`` with ``data`` on stdin, as the agent would."""
    argv = [sys.executable, "-m", "snapshotd", "hook", tool] if cli else shlex.split(hook_command(tool))
    proc = subprocess.run(
        argv,
        input=data,
        capture_output=True,
        env=env,
        cwd=cwd,
        timeout=HOOK_TIMEOUT_S,
        check=False,
    )
    return HookRun(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))


def claude_hook(repo: Path, env: dict[str, str], name: str, **changes: Any) -> None:
    """Run Claude Code's recorded payload ``name`` in ``repo`` (with ``changes``); it must succeed silently."""
    payload = dict(recorded("claude-code"))[name]
    run = run_hook("claude-code", placed(payload, repo, **changes), env)
    assert (run.code, run.stdout) == (0, ""), run


def recorded_claude_turn(repo: Path, env: dict[str, str]) -> None:
    """Claude Code's recorded turn: CHANGES added by its Bash call and a.txt edited, each followed by its hook."""
    for name, payload in recorded("claude-code"):
        if "post-tool-use-bash" in name:
            subprocess.run(["sh", "-c", payload["tool_input"]["command"]], cwd=repo, check=True)
        elif "post-tool-use-edit" in name:
            write(repo / "a.txt", "hello\n")
        claude_hook(repo, env, name)
