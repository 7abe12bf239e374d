"""``snapshotd mcp`` driven by the MCP SDK's own client over stdio, against a real daemon.

Two turns of an agent are recorded through the hooks; the tools then list
them, show one turn's diff, take a checkpoint, and preview then apply a
revert of one turn and a restore.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import Daemon, child_env, cli
from hook_helpers import placed, recorded, run_hook
from mcp import Client, StdioServerParameters
from oracle import oracle_tree
from repo_helpers import init_repo, write

from snapshotd.agents.integrate import hook_command

SESSION = "mcp-session"
TOOLS = {"list_checkpoints", "show_turn", "checkpoint", "restore", "revert_turn"}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(tmp_path / "project", ("a.txt", "alpha\n"))


def two_turns(repo: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """Turn 1 adds notes.txt and changes a.txt; turn 2 adds todo.txt. Checkpoints oldest first."""
    shapes = dict(recorded("claude-code"))
    for prompt, edits in (("Write notes", {"notes.txt": "one\n", "a.txt": "changed\n"}), ("Add a todo", {"todo.txt": "two\n"})):
        for name, changes in (("1-user-prompt-submit.json", {"prompt": prompt}), ("5-stop.json", {})):
            run = run_hook("claude-code", placed(shapes[name], repo, session_id=SESSION, **changes), env)
            assert (run.code, run.stderr) == (0, ""), run
            if changes:
                for path, text in edits.items():
                    write(repo / path, text)
    return cli("list", "--json", "--session", SESSION, str(repo), env=env).json()["checkpoints"][::-1]


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content)


@pytest.mark.needs("proc")  # the agent's session is found through /proc
async def test_every_tool_over_stdio(daemon: Daemon, sock: Path, repo: Path) -> None:
    env = child_env(sock, SNAPSHOTD_HOOK_BUDGET="60")
    turn1, end1, turn2, end2 = two_turns(repo, env)
    assert (turn1["label"], end1["label"], turn2["label"]) == ("before: Write notes", "after turn", "before: Add a todo")
    server = StdioServerParameters(command=sys.executable, args=["-m", "snapshotd", "mcp"], env=env, cwd=str(repo))
    async with Client(server) as client:
        listed = await client.list_tools()
        assert {tool.name for tool in listed.tools} == TOOLS
        for tool in listed.tools:
            assert tool.description and tool.input_schema["type"] == "object"

        # The session is the one the hooks used, found from the newest checkpoint.
        result = await client.call_tool("list_checkpoints", {})
        assert not result.is_error
        assert result.structured_content["session"] == SESSION
        assert [cp["id"] for cp in result.structured_content["checkpoints"]] == [end2["id"], turn2["id"], end1["id"], turn1["id"]]
        assert "before: Write notes" in text_of(result) and f"session {SESSION}" in text_of(result)
        assert text_of(result).startswith(f"4 checkpoints of {repo}, session {SESSION}, newest first:")
        one = await client.call_tool("list_checkpoints", {"limit": 1})
        assert text_of(one).startswith(f"1 checkpoint of {repo}, session {SESSION}, newest first:")

        # One turn's diff: only that turn's files; the patch is bounded.
        result = await client.call_tool("show_turn", {"checkpoint": turn1["id"]})
        assert {f["path"]: f["status"] for f in result.structured_content["files"]} == {"a.txt": "modified", "notes.txt": "added"}
        assert result.structured_content["to"]["id"] == end1["id"]
        assert "notes.txt" in text_of(result) and "+1 -0" in text_of(result)
        result = await client.call_tool("show_turn", {"checkpoint": turn1["id"], "patch": True, "max_patch_chars": 40})
        assert result.structured_content["truncated"] and len(result.structured_content["patch"]) == 40
        assert "patch cut at 40" in text_of(result)

        # References count in the agent's session: '#1' is turn 1's start, '@' the newest.
        result = await client.call_tool("show_turn", {"checkpoint": "#1"})
        assert result.structured_content["from"]["id"] == turn1["id"], text_of(result)
        result = await client.call_tool("show_turn", {"checkpoint": "@~1", "to": "@"})
        assert (result.structured_content["from"]["id"], result.structured_content["to"]["id"]) == (turn2["id"], end2["id"])

        result = await client.call_tool("checkpoint", {"label": "by the model", "session": SESSION})
        newest = result.structured_content["checkpoint"]
        assert newest["label"] == "by the model"
        assert result.structured_content["checkpoint"]["tree"] == oracle_tree(repo)

        # Revert turn 1: a preview first, that changes nothing; then applied with confirm.
        result = await client.call_tool("revert_turn", {"checkpoint": turn1["id"]})
        assert not result.is_error and not result.structured_content["applied"]
        assert (result.structured_content["written"], result.structured_content["deleted"]) == (["a.txt"], ["notes.txt"])
        assert "confirm: true" in text_of(result)
        assert (repo / "notes.txt").exists() and (repo / "a.txt").read_text() == "changed\n"
        result = await client.call_tool("revert_turn", {"checkpoint": turn1["id"], "confirm": True})
        assert result.structured_content["applied"] and result.structured_content["safety_checkpoint"]
        assert not (repo / "notes.txt").exists() and (repo / "a.txt").read_text() == "alpha\n"
        assert (repo / "todo.txt").read_text() == "two\n"  # turn 2 is left alone

        # Restore the end of turn 2: preview, then apply.
        result = await client.call_tool("restore", {"checkpoint": end2["id"]})
        assert result.structured_content["written"] == ["a.txt", "notes.txt"] and not result.structured_content["applied"]
        assert not (repo / "notes.txt").exists()
        result = await client.call_tool("restore", {"checkpoint": end2["id"], "confirm": True})
        assert oracle_tree(repo) == end2["tree"]
        assert "undo with" in text_of(result)

        # Errors are tool errors carrying the daemon's sentence and kind.
        result = await client.call_tool("show_turn", {"checkpoint": "0000000"})
        assert result.is_error
        assert text_of(result).startswith("No checkpoint matches '0000000';")
        assert result.structured_content["error"]["data"]["kind"] == "not_found"
        result = await client.call_tool("revert_turn", {"checkpoint": newest["id"]})
        assert result.is_error and "nothing to revert" in text_of(result)


@pytest.mark.needs("proc")  # the agent's session is found through /proc
async def test_the_session_is_the_calling_agents_and_the_schemas_say_everything(daemon: Daemon, sock: Path, repo: Path) -> None:
    env = child_env(sock, SNAPSHOTD_HOOK_BUDGET="60")
    two_turns(repo, env)  # this test process is the agent whose hooks ran, and it starts the server below
    # Another agent (another process) checkpoints last, in its own session.
    [(_, prompt)] = [item for item in recorded("claude-code") if "user-prompt" in item[0]]
    other = placed(prompt, repo, session_id="other-agent", prompt="elsewhere")
    hook = f"import subprocess, sys; subprocess.run({shlex.split(hook_command('claude-code'))!r}, input=sys.stdin.buffer.read(), check=True)"
    subprocess.run([sys.executable, "-c", hook], input=other, env=env, check=True)
    assert cli("list", "--json", "--limit", "1", str(repo), env=env).json()["checkpoints"][0]["session"] == "other-agent"

    server = StdioServerParameters(command=sys.executable, args=["-m", "snapshotd", "mcp"], env=env, cwd=str(repo))
    async with Client(server) as client:
        for tool in (await client.list_tools()).tools:
            described = {name: bool(spec.get("description")) for name, spec in tool.input_schema["properties"].items()}
            assert all(described.values()), (tool.name, described)
            assert tool.output_schema and tool.output_schema["type"] == "object", tool.name

        result = await client.call_tool("list_checkpoints", {})
        assert result.structured_content["session"] == SESSION, text_of(result)  # its own agent's, not the newest
        result = await client.call_tool("checkpoint", {"label": "by the model"})
        assert result.structured_content["checkpoint"]["session"] == SESSION  # checkpoint keeps the session
        result = await client.call_tool("checkpoint", {"label": "red\x1b[31m\nsecond line"})
        assert text_of(result).endswith("  red\\x1b[31m\\nsecond line (unchanged)")  # one line, controls as escapes
        assert result.structured_content["checkpoint"]["label"] == "red\x1b[31m\nsecond line"  # the data as given

        result = await client.call_tool("list_checkpoints", {"limit": "ten"})
        assert result.is_error and len(text_of(result).splitlines()) == 1, text_of(result)
        assert text_of(result).startswith("The arguments of list_checkpoints are wrong: 'limit' input should be a valid integer")
        before = (repo / "a.txt").read_bytes()
        for wrong, said in [
            ({"confirm": "yes"}, "'confirm' input should be a valid boolean"),  # an apply is asked for by true alone
            ({"confrm": True}, "'confrm' is not one of them (checkpoint, paths, confirm, path)"),  # not dropped
        ]:
            result = await client.call_tool("restore", {"checkpoint": "@~1", **wrong})
            assert result.is_error and len(text_of(result).splitlines()) == 1, text_of(result)
            assert text_of(result).startswith("The arguments of restore are wrong: " + said), text_of(result)
        assert (repo / "a.txt").read_bytes() == before


async def test_a_reference_that_names_its_session_needs_no_agent(daemon: Daemon, sock: Path, repo: Path) -> None:
    env = child_env(sock)
    first = cli("checkpoint", "--json", "--session", "t", str(repo), env=env).json()["checkpoint"]
    write(repo / "a.txt", "changed\n")
    second = cli("checkpoint", "--json", "--session", "t", str(repo), env=env).json()["checkpoint"]
    server = StdioServerParameters(command=sys.executable, args=["-m", "snapshotd", "mcp"], env=env, cwd=str(repo))
    async with Client(server) as client:  # no hook ran: the server knows no agent's session
        result = await client.call_tool("show_turn", {"checkpoint": "t@~1"})
        assert not result.is_error, text_of(result)
        assert (result.structured_content["from"]["id"], result.structured_content["to"]["id"]) == (first["id"], second["id"])
        result = await client.call_tool("restore", {"checkpoint": "t@~1", "confirm": True})
        assert not result.is_error, text_of(result)
        assert (repo / "a.txt").read_text() == "alpha\n"
        result = await client.call_tool("show_turn", {"checkpoint": "@~1"})
        assert result.is_error and "counts in the agent's session" in text_of(result)
        write(repo / "a.txt", "changed again\n")
    (repo / "sub").mkdir()
    below = StdioServerParameters(command=sys.executable, args=["-m", "snapshotd", "mcp"], env=env, cwd=str(repo / "sub"))
    async with Client(below) as client:  # started in a subfolder: paths are still the worktree's own
        result = await client.call_tool("restore", {"checkpoint": first["id"], "paths": ["a.txt"], "confirm": True})
        assert not result.is_error and result.structured_content["written"] == ["a.txt"], text_of(result)
        assert (repo / "a.txt").read_text() == "alpha\n"
        listed = text_of(await client.call_tool("list_checkpoints", {"all_sessions": True})).splitlines()
        assert listed[0].endswith(", every session, newest first:")
        # Each seq counts in its own session: the line says which (the safety checkpoint is #1 too).
        assert [line.split()[1:3] for line in listed[1:]] == [
            ["snapshotd:safety", "#2"], ["snapshotd:safety", "#1"], ["t", "#2"], ["t", "#1"]
        ]


def test_doctor_says_when_the_mcp_server_used_another_socket(daemon: Daemon, sock: Path, repo: Path, tmp_path: Path) -> None:
    def start_mcp(socket_path: Path) -> None:  # the server notes its socket at start, then ends with its stdin
        subprocess.run([sys.executable, "-m", "snapshotd", "mcp"], cwd=repo, env=child_env(socket_path), input=b"", capture_output=True, timeout=60, check=False)

    start_mcp(tmp_path / "elsewhere" / "s.sock")  # as under Codex, which passes only a few variables on
    checks = {c["check"]: c for c in cli("doctor", "--json", cwd=repo, env=child_env(sock), code=1).json()["checks"]}
    assert not checks["mcp server"]["ok"] and str(tmp_path / "elsewhere") in checks["mcp server"]["detail"], checks
    assert "env_vars" in checks["mcp server"]["fix"]
    start_mcp(sock)
    checks = {c["check"]: c for c in cli("doctor", "--json", cwd=repo, env=child_env(sock), code=None).json()["checks"]}
    assert checks["mcp server"]["ok"], checks


def test_calls_piped_in_are_answered_before_the_server_ends_with_its_stdin(daemon: Daemon, sock: Path, repo: Path) -> None:
    """A scripted client writes its requests and closes stdin at once: each is answered, then the server exits 0."""
    write(repo / "a.txt", "piped\n")
    frames = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "pipe", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "checkpoint", "arguments": {"label": "piped"}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list_checkpoints", "arguments": {"all_sessions": True}}},
    ]
    piped = "".join(json.dumps(frame) + "\n" for frame in frames).encode()
    env = child_env(sock, SNAPSHOTD_SESSION="piped-session")
    run = subprocess.run([sys.executable, "-m", "snapshotd", "mcp"], input=piped, cwd=repo, env=env, capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    answers = {answer["id"]: answer for answer in map(json.loads, run.stdout.decode().splitlines())}
    assert set(answers) == {1, 2, 3}, run.stdout.decode()
    taken = answers[2]["result"]["structuredContent"]["checkpoint"]
    assert (taken["label"], taken["tree"]) == ("piped", oracle_tree(repo))
    assert cli("list", "--json", "--limit", "1", str(repo), env=env).json()["checkpoints"][0]["id"] == taken["id"]
    assert not answers[3]["result"]["isError"], answers[3]
