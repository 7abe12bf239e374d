"""The agent's ids as git trailers of each checkpoint the hooks record (``Snapshotd-Agent-*``).

Recorded Claude Code and Codex payloads go through the real hook program
against a real daemon; each checkpoint commit's message is read back with
``git interpret-trailers --parse``, as any git tool would read it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import Daemon, call, child_env, cli
from hook_helpers import placed, recorded, run_hook
from repo_helpers import init_repo, write

from snapshotd.client.rpc import Client
from snapshotd.errors import InvalidParams

PROMPT_ID = "5b0e2a5c-1f7d-4e8a-9c3b-2d6f8a1e4c70"  # Claude Code 2.1 adds prompt_id to every event of a turn


@pytest.fixture
def env(sock: Path) -> dict[str, str]:
    return child_env(sock, SNAPSHOTD_HOOK_BUDGET="60")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(tmp_path / "project", ("a.txt", "alpha\n"))


def trailers(repo: Path, checkpoint: str) -> list[tuple[str, str]]:
    """(name, value) of each trailer of the checkpoint commit, as ``git interpret-trailers --parse`` reads them."""
    message = subprocess.run(["git", "log", "-1", "--format=%B", checkpoint], cwd=repo, capture_output=True, text=True, check=True).stdout
    parsed = subprocess.run(["git", "interpret-trailers", "--parse"], input=message, capture_output=True, text=True, check=True).stdout
    return [tuple(line.split(": ", 1)) for line in parsed.splitlines()]  # type: ignore[misc]


def agent_trailers(repo: Path, checkpoint: str) -> dict[str, str]:
    return {name: value for name, value in trailers(repo, checkpoint) if name.startswith("Snapshotd-Agent-")}


def run_session(tool: str, repo: Path, env: dict[str, str], **changes: Any) -> list[dict[str, Any]]:
    """Every recorded payload of ``tool`` through the hook program, an edit before each; the checkpoints, oldest first."""
    session = ""
    for n, (_, payload) in enumerate(recorded(tool)):
        write(repo / "a.txt", f"edit {n}\n")
        session = payload["session_id"]
        run = run_hook(tool, placed(payload, repo, **changes), env)
        assert (run.code, run.stdout, run.stderr) == (0, "", ""), run
    return cli("list", "--json", "--session", session, str(repo), env=env).json()["checkpoints"][::-1]


def test_claude_code_checkpoints_carry_the_session_prompt_and_tool_call(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    checkpoints = run_session("claude-code", repo, env, prompt_id=PROMPT_ID)
    payloads = [payload for _, payload in recorded("claude-code")]
    assert len(checkpoints) == len(payloads)
    for cp, payload in zip(checkpoints, payloads, strict=True):
        expected = {
            "Snapshotd-Agent-Tool": "claude-code",
            "Snapshotd-Agent-Session": payload["session_id"],
            "Snapshotd-Agent-Prompt": PROMPT_ID,
            "Snapshotd-Agent-Transcript": payload["transcript_path"],
        }
        if "tool_use_id" in payload:
            expected["Snapshotd-Agent-Tool-Use"] = payload["tool_use_id"]
        assert agent_trailers(repo, cp["id"]) == expected, cp["label"]
        # The store reads the same ids back; the trailers it always wrote are still there, first.
        assert cp["agent"] == {name.removeprefix("Snapshotd-Agent-").lower().replace("-", "_"): v for name, v in expected.items()}
        names = [name for name, _ in trailers(repo, cp["id"])]
        assert names[:8] == [f"Snapshotd-{n}" for n in ("Worktree", "Session", "Label", "Seq", "Previous", "Base", "Created", "Changed")]


def test_codex_checkpoints_carry_the_turn_tool_call_and_model(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    checkpoints = run_session("codex", repo, env)
    after_patch = next(cp for cp in checkpoints if cp["label"] == "after apply_patch: a.txt")
    [(_, payload)] = [item for item in recorded("codex") if "apply-patch" in item[0]]
    assert agent_trailers(repo, after_patch["id"]) == {
        "Snapshotd-Agent-Tool": "codex",
        "Snapshotd-Agent-Session": payload["session_id"],
        "Snapshotd-Agent-Turn": payload["turn_id"],
        "Snapshotd-Agent-Tool-Use": payload["tool_use_id"],
        "Snapshotd-Agent-Transcript": payload["transcript_path"],
        "Snapshotd-Agent-Model": payload["model"],
    }
    assert {cp["agent"]["turn"] for cp in checkpoints} == {payload["turn_id"]}
    shown = cli("show", after_patch["id"], cwd=repo, env=env).stdout
    assert f"Agent:     tool codex\n           session {payload['session_id']}\n" in shown
    assert f"           tool_use {payload['tool_use_id']}\n" in shown


def test_an_interrupted_turn_is_closed_without_the_new_turns_ids(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    [(_, prompt)] = [item for item in recorded("codex") if "user-prompt" in item[0]]
    for turn in ("turn-1", "turn-2"):  # no Stop between them: the first turn was interrupted
        write(repo / "a.txt", f"{turn}\n")
        assert run_hook("codex", placed(prompt, repo, turn_id=turn), env).code == 0
    checkpoints = cli("list", "--json", "--session", prompt["session_id"], str(repo), env=env).json()["checkpoints"][::-1]
    assert [(cp["label"], cp["agent"].get("turn")) for cp in checkpoints] == [
        ("before: Add a CHANGES file and fix the greeting in a.txt", "turn-1"),
        ("after turn (interrupted)", None),
        ("before: Add a CHANGES file and fix the greeting in a.txt", "turn-2"),
    ]
    assert checkpoints[1]["agent"]["session"] == prompt["session_id"]


def test_ids_that_git_would_not_keep_are_left_out_of_the_hooks_checkpoint(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    [(_, stop)] = [item for item in recorded("codex") if "stop" in item[0]]
    run = run_hook("codex", placed(stop, repo, turn_id="two\nlines", model=" padded", transcript_path=7), env)
    assert (run.code, run.stdout, run.stderr) == (0, "", ""), run
    [cp] = cli("list", "--json", "--session", stop["session_id"], str(repo), env=env).json()["checkpoints"]
    assert cp["agent"] == {"tool": "codex", "session": stop["session_id"]}


@pytest.mark.parametrize(
    ("agent", "fragment"),
    [
        ("codex", "must be an object"),
        ({"Tool": "codex"}, "lower-case words"),
        ({"tool__use": "x"}, "lower-case words"),
        ({"turn": "a\nSnapshotd-Seq: 99"}, "one line of text"),
        ({"turn": " x"}, "no blanks around it"),
        ({"turn": ""}, "1 to 1024 characters"),
        ({f"k{n}": "v" for n in range(17)}, "at most 16"),
    ],
)
def test_the_daemon_refuses_ids_that_do_not_fit_and_records_nothing(daemon: Daemon, sock: Path, repo: Path, agent: Any, fragment: str) -> None:
    with Client(str(sock)) as client, pytest.raises(InvalidParams) as refused:
        client.call("checkpoint", {"path": str(repo), "session": "s", "agent": agent})
    assert fragment in refused.value.message and refused.value.message.count(".") <= 2, refused.value.message
    assert call(sock, "list", {"path": str(repo), "session": "s"})["checkpoints"] == []
