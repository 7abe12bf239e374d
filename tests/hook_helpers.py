"""Feeding hook payloads to ``snapshotd hook`` as the agent tools do: a real process, JSON on stdin."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def run_hook(tool: str, data: bytes, env: dict[str, str], cwd: Path | None = None) -> HookRun:
    """Run ``python -m snapshotd hook TOOL`` with ``data`` on stdin, as the agent would."""
    proc = subprocess.run(
        [sys.executable, "-m", "snapshotd", "hook", tool],
        input=data,
        capture_output=True,
        env=env,
        cwd=cwd,
        timeout=HOOK_TIMEOUT_S,
        check=False,
    )
    return HookRun(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))
