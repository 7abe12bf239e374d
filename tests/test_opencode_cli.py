"""The real ``opencode`` (1.18) with snapshotd's example plug-in, headless against the local mock model.

OpenCode runs offline here: its updates, model list, LSP downloads and
sharing are switched off, and its model is a provider of Anthropic's kind
whose base URL is the mock (tests/agent_mock.py). The plug-in
(clients/node/examples/opencode-plugin.js) is named in the config by its
file, with its import of the Node client pointed at this checkout. Two turns of one session make real edits (write, bash, edit); each
"before" checkpoint is compared with git's tree at its moment. A daemon that
accepts and never answers costs each hook the plug-in's call limit, and the
turn finishes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from agent_mock import MockModel, Script
from daemon_helpers import Daemon, child_env, cli, wait_until
from oracle import oracle_tree
from repo_helpers import init_repo

CLIS = Path(os.environ.get("SNAPSHOTD_AGENT_CLIS") or Path.home() / ".cache" / "snapshotd-agent-clis")
PACKAGE = "opencode-ai@1.18"
PLUGIN = Path(__file__).resolve().parent.parent / "clients" / "node" / "examples" / "opencode-plugin.js"
CLIENT = PLUGIN.parent.parent / "src" / "index.js"
RUN_TIMEOUT_S = 180

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def opencode() -> Path:
    program = CLIS / "node_modules" / ".bin" / "opencode"
    if not program.exists():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed, so opencode cannot be installed")
        CLIS.mkdir(parents=True, exist_ok=True)
        install = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CLIS), PACKAGE],
                                 capture_output=True, text=True, timeout=600, check=False)
        if install.returncode != 0 or not program.exists():
            pytest.skip(f"npm could not install {PACKAGE}: {install.stderr.strip()[-300:]}")
    return program


def _project(tmp_path: Path) -> Path:
    """The worktree, and the plug-in beside it (named in the config: a .opencode folder would have OpenCode install packages)."""
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "snapshotd.js").write_text(PLUGIN.read_text().replace('from "snapshotd-client"', f"from {json.dumps(str(CLIENT))}"))
    return init_repo(tmp_path / "project", ("a.txt", "alpha\n"))


def _env(tmp_path: Path, repo: Path, sock: Path, mock_url: str, **extra: str) -> dict[str, str]:
    home = tmp_path / "home"
    config = {
        "$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled", "model": "mock/mock-model",
        "permission": {"edit": "allow", "bash": "allow", "external_directory": "allow"},
        "plugin": [(tmp_path / "plugin" / "snapshotd.js").as_uri()],
        "provider": {"mock": {"npm": "@ai-sdk/anthropic", "name": "Mock", "options": {"baseURL": f"{mock_url}/v1", "apiKey": "sk-mock"},
                              "models": {"mock-model": {"name": "Mock", "tool_call": True}}}},
    }
    env = {k: v for k, v in child_env(sock).items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "OPENCODE_"))}
    env.update(
        HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"), XDG_CACHE_HOME=str(CLIS / "opencode-cache"),  # its provider packages, installed once
        XDG_STATE_HOME=str(home / "state"), PWD=str(repo), OPENCODE_CONFIG_CONTENT=json.dumps(config),
        OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_LSP_DOWNLOAD="1",
        OPENCODE_DISABLE_SHARE="1", NO_PROXY="127.0.0.1", **extra,
    )
    return env


def _run(program: Path, args: list[str], repo: Path, env: dict[str, str]) -> None:
    proc = subprocess.run([str(program), "run", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-2000:])


def _checkpoints(repo: Path, env: dict[str, str], count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        found[:] = [cp for cp in cli("list", "--json", str(repo), env=env).json()["checkpoints"][::-1] if cp["session"]]
        return len(found) >= count

    wait_until(enough, 60, f"{count} checkpoints")
    return found


def test_opencode_two_turns_through_the_plugin(opencode: Path, daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = _project(tmp_path)
    turns = {
        "first turn": [("write", {"filePath": str(repo / "notes.txt"), "content": "one\n"}),
                       ("bash", {"command": "echo two > todo.txt", "description": "Write the todo list"})],
        "second turn": [("edit", {"filePath": str(repo / "a.txt"), "oldString": "alpha", "newString": "hello"})],
    }
    script = Script(turns, lambda: oracle_tree(repo))
    with MockModel(script) as mock:
        env = _env(tmp_path, repo, sock, mock.url)
        _run(opencode, ["first turn"], repo, env)
        _run(opencode, ["--continue", "second turn"], repo, env)
    end = oracle_tree(repo)

    checkpoints = _checkpoints(repo, child_env(sock), 10)
    assert len({cp["session"] for cp in checkpoints}) == 1, checkpoints  # --continue keeps the session
    labels = [cp["label"] for cp in checkpoints]
    assert labels == [
        'before: "first turn"', "before write: notes.txt", "after write: notes.txt",  # opencode run quotes the message
        "before bash: echo two > todo.txt", "after bash: echo two > todo.txt", "after turn",
        'before: "second turn"', "before edit: a.txt", "after edit: a.txt", "after turn",
    ], labels
    trees = [cp["tree"] for cp in checkpoints]
    assert (trees[0], trees[3], trees[6], trees[9]) == (
        script.moments["first turn", 0], script.moments["first turn", 1], script.moments["second turn", 0], end,
    )
    assert (repo / "a.txt").read_text() == "hello\n" and (repo / "todo.txt").read_text() == "two\n"


def test_opencode_finishes_its_turn_with_a_daemon_that_never_answers(opencode: Path, tmp_path: Path) -> None:
    repo = _project(tmp_path)
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = folder / "s.sock"
    script = Script({"only turn": [("write", {"filePath": str(repo / "notes.txt"), "content": "one\n"})]}, lambda: "")
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        listener.bind(str(path))
        listener.listen(64)  # accepts connections, never answers
        mock = stack.enter_context(MockModel(script))
        _run(opencode, ["only turn"], repo, _env(tmp_path, repo, path, mock.url, SNAPSHOTD_CALL_TIMEOUT="1"))
    assert (repo / "notes.txt").read_text() == "one\n"
