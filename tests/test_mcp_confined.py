"""The MCP server reaches only its own project unless it is started with ``--any-worktree``.

An agent can be steered by what it reads (a README, a web page), so its tools
must not list, show, restore or checkpoint the user's other repositories: a
``path`` outside the project, or a checkpoint of another worktree, is a tool
error, and the other repository is left exactly as it was.
"""

from __future__ import annotations

import sys
from pathlib import Path

from daemon_helpers import Daemon, child_env, cli
from mcp import Client, StdioServerParameters
from repo_helpers import init_repo, write


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content)


async def test_tools_refuse_another_repository_of_the_user(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    env = child_env(sock)
    project = init_repo(tmp_path / "project", ("a.txt", "a\n"))
    other = init_repo(tmp_path / "other", ("secret.txt", "private notes\n"))
    mine = cli("checkpoint", "--json", str(project), env=env).json()["checkpoint"]
    theirs = cli("checkpoint", "--json", str(other), env=env).json()["checkpoint"]
    write(other / "secret.txt", "newer notes\n")
    count_before = len(cli("list", "--json", str(other), env=env).json()["checkpoints"])

    server = StdioServerParameters(command=sys.executable, args=["-m", "snapshotd", "mcp"], env=env, cwd=str(project))
    async with Client(server) as client:
        calls = [
            ("list_checkpoints", {"path": str(other), "all_sessions": True}),
            ("checkpoint", {"path": str(other)}),
            ("show_turn", {"checkpoint": theirs["id"]}),
            ("restore", {"checkpoint": theirs["id"], "confirm": True}),
            ("restore", {"checkpoint": theirs["id"], "path": str(other), "confirm": True}),
            ("revert_turn", {"checkpoint": mine["id"], "to": theirs["id"], "confirm": True}),
        ]
        for name, arguments in calls:
            result = await client.call_tool(name, arguments)
            assert result.is_error, (name, arguments, text_of(result))
            assert "--any-worktree" in text_of(result), text_of(result)
        own = await client.call_tool("list_checkpoints", {"all_sessions": True})
        assert not own.is_error and [cp["id"] for cp in own.structured_content["checkpoints"]] == [mine["id"]]

    assert (other / "secret.txt").read_text() == "newer notes\n"
    assert (project / "a.txt").read_text() == "a\n" and not (project / "secret.txt").exists()
    assert len(cli("list", "--json", str(other), env=env).json()["checkpoints"]) == count_before

    wider = StdioServerParameters(
        command=sys.executable, args=["-m", "snapshotd", "mcp", "--any-worktree"], env=env, cwd=str(project)
    )
    async with Client(wider) as client:
        result = await client.call_tool("list_checkpoints", {"path": str(other), "all_sessions": True})
        assert not result.is_error and [cp["id"] for cp in result.structured_content["checkpoints"]] == [theirs["id"]]
