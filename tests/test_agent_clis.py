"""The real ``claude`` (2.1) and ``codex`` (0.171) programs, driven headless against a local mock model.

Each test installs snapshotd's hooks with ``snapshotd integrate`` (Codex's trust
included), then runs two turns of one session in which the mock model
(tests/agent_mock.py) asks for real edits: Write, Bash, Read and Edit for
Claude Code; a shell command and an ``apply_patch`` through the shell tool for
Codex (the freeform ``apply_patch`` tool is offered only to models whose
metadata Codex knows, which a mock model's is not). Every checkpoint
of the session is compared with the oracle's tree at its hook's moment, which
the mock records as each request arrives (the hooks ran just before it).

The programs come from npm, installed once into ``$SNAPSHOTD_AGENT_CLIS``
(default ``~/.cache/snapshotd-agent-clis``); nothing but 127.0.0.1 is reached:
telemetry, updates and error reports are switched off.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from agent_mock import MockModel, Script
from daemon_helpers import Daemon, answers, child_env, cli, wait_until
from oracle import oracle_tree
from repo_helpers import init_repo

CLIS = Path(os.environ.get("SNAPSHOTD_AGENT_CLIS") or Path.home() / ".cache" / "snapshotd-agent-clis")
PACKAGES = ("@anthropic-ai/claude-code@2.1", "@openai/codex@0.171")
RUN_TIMEOUT_S = 120

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    """The folder of the installed ``claude`` and ``codex`` (installed here on first use)."""
    folder = CLIS / "node_modules" / ".bin"
    if not ((folder / "claude").exists() and (folder / "codex").exists()):
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed, so the agent programs cannot be installed")
        CLIS.mkdir(parents=True, exist_ok=True)
        install = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CLIS), *PACKAGES],
            capture_output=True, text=True, timeout=600, check=False,
        )
        if install.returncode != 0:
            pytest.skip(f"npm could not install {', '.join(PACKAGES)}: {install.stderr.strip()[-300:]}")
    return folder


def _checkpoints(repo: Path, env: dict[str, str], session: str, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        found[:] = cli("list", "--json", "--session", session, str(repo), env=env).json()["checkpoints"][::-1]
        return len(found) >= count

    try:
        wait_until(enough, 60, f"{count} checkpoints")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; found {[cp['label'] for cp in found]}") from None
    return found


def _turn_ids(repo: Path, checkpoints: list[dict[str, Any]], tool: str, session: str, turn_key: str) -> list[str | None]:
    """Each checkpoint's turn id (Claude Code's prompt id, Codex's turn id), once every checkpoint is checked to
    carry the agent's tool and session, and each after-tool one its tool call, as git trailers of its commit."""
    for cp in checkpoints:
        message = subprocess.run(["git", "log", "-1", "--format=%B", cp["id"]], cwd=repo, capture_output=True, text=True, check=True).stdout
        parsed = subprocess.run(["git", "interpret-trailers", "--parse"], input=message, capture_output=True, text=True, check=True).stdout
        assert f"Snapshotd-Agent-Tool: {tool}\nSnapshotd-Agent-Session: {session}\n" in parsed, (cp["label"], parsed)
        assert cp["label"].startswith("after ") == ("tool_use" in cp["agent"]) or cp["label"].startswith("after turn"), cp
    return [cp["agent"].get(turn_key) for cp in checkpoints]


def _run(argv: list[str], repo: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-2000:])


def _quiet(env: dict[str, str]) -> dict[str, str]:
    """No telemetry, updates or error reports: nothing leaves the machine."""
    return {
        **{k: v for k, v in env.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE_"))},
        "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "NO_PROXY": "127.0.0.1",
    }


def test_claude_code_two_turns(bin_dir: Path, daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    config = tmp_path / "claude-config"
    turns = {
        "first turn": [
            ("Write", {"file_path": str(repo / "notes.txt"), "content": "one\n"}),
            ("Bash", {"command": "echo two > todo.txt", "description": "Write the todo list"}),
        ],
        "second turn": [
            ("Read", {"file_path": str(repo / "a.txt")}),
            ("Edit", {"file_path": str(repo / "a.txt"), "old_string": "alpha", "new_string": "hello"}),
        ],
    }
    script = Script(turns, lambda: oracle_tree(repo))
    start = oracle_tree(repo)
    env = _quiet(child_env(sock))
    cli("integrate", "claude-code", "--events", "tools", env={"CLAUDE_CONFIG_DIR": str(config)})
    session = str(uuid.uuid4())
    with MockModel(script) as mock:
        env.update(CLAUDE_CONFIG_DIR=str(config), ANTHROPIC_BASE_URL=mock.url, ANTHROPIC_API_KEY="sk-mock")
        base = [str(bin_dir / "claude"), "--output-format", "json", "--permission-mode", "acceptEdits", "--allowedTools", "Bash,Write,Edit,Read"]
        _run([*base, "--session-id", session, "-p", "first turn"], repo, env)
        _run([*base, "--resume", session, "-p", "second turn"], repo, env)
    end = oracle_tree(repo)

    moment = script.moments
    expected = [
        ("session start (startup)", start),
        ("before: first turn", moment["first turn", 0]),
        ("after Write: notes.txt", moment["first turn", 1]),
        ("after Bash: echo two > todo.txt", moment["first turn", 2]),
        ("after turn", moment["first turn", 2]),
        ("session start (resume)", moment["first turn", 2]),
        ("before: second turn", moment["second turn", 0]),
        ("after Edit: a.txt", moment["second turn", 2]),
        ("after turn", end),
    ]
    checkpoints = _checkpoints(repo, env, session, len(expected))
    assert [(cp["label"], cp["tree"]) for cp in checkpoints] == expected
    assert (repo / "a.txt").read_text() == "hello\n" and (repo / "todo.txt").read_text() == "two\n"
    prompts = _turn_ids(repo, checkpoints, "claude-code", session, "prompt")
    first, second = prompts[1], prompts[6]  # every event of a turn carries its prompt's id, the session's start none
    assert prompts == [None, first, first, first, first, None, second, second, second] and first and second and first != second


def test_codex_two_turns(bin_dir: Path, daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    home = tmp_path / "codex-home"
    home.mkdir()
    patch = "*** Begin Patch\n*** Update File: a.txt\n@@\n-alpha\n+hello\n*** End Patch\n"
    turns = {
        "first turn": [("exec_command", {"cmd": "printf 'v1\\n' > CHANGES"})],
        "second turn": [("exec_command", {"cmd": f"apply_patch <<'EOF'\n{patch}EOF\n"})],
    }
    script = Script(turns, lambda: oracle_tree(repo))
    start = oracle_tree(repo)
    env = _quiet(child_env(sock, CODEX_HOME=str(home), MOCK_API_KEY="sk-mock"))
    with MockModel(script) as mock:
        (home / "config.toml").write_text(
            'model = "gpt-5-codex"\nmodel_provider = "mock"\ncheck_for_update_on_startup = false\n\n'
            f'[model_providers.mock]\nname = "mock"\nbase_url = "{mock.url}/v1"\nwire_api = "responses"\nenv_key = "MOCK_API_KEY"\n\n'
            "[analytics]\nenabled = false\n"
        )
        integrated = cli("integrate", "codex", "--events", "tools", env={"CODEX_HOME": str(home)})
        assert "recorded Codex's trust" in integrated.stdout, integrated
        base = [str(bin_dir / "codex"), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--json"]
        _run([*base, "first turn"], repo, env)
        _run([*base, "resume", "--last", "second turn"], repo, env)
    end = oracle_tree(repo)

    sessions = {cp["session"] for cp in cli("list", "--json", str(repo), env=env).json()["checkpoints"]}
    assert len(sessions) == 1, sessions  # the resumed thread keeps its session
    [session] = sessions
    moment = script.moments
    expected = [
        ("session start (startup)", start),
        ("before: first turn", moment["first turn", 0]),
        ("after Bash: printf 'v1\\n' > CHANGES", moment["first turn", 1]),
        ("after turn", moment["first turn", 1]),
        ("session start (resume)", moment["first turn", 1]),
        ("before: second turn", moment["second turn", 0]),
        # Codex 0.171 runs no PostToolUse for a patch applied through its shell tool: the turn's end holds it.
        ("after turn", end),
    ]
    checkpoints = _checkpoints(repo, env, session, len(expected))
    assert [(cp["label"], cp["tree"]) for cp in checkpoints] == expected
    assert (repo / "a.txt").read_text() == "hello\n" and (repo / "CHANGES").read_text() == "v1\n"
    turns = _turn_ids(repo, checkpoints, "codex", session, "turn")
    first, second = turns[1], turns[5]  # every event of a turn carries its id, the session's start none
    assert turns == [None, first, first, first, None, second, second] and first and second and first != second
    assert {cp["agent"].get("model") for cp in checkpoints} == {"gpt-5-codex"}


@pytest.mark.parametrize("trouble", ["hung", "unstartable"])
def test_claude_code_finishes_its_turn_whatever_the_daemon_does(bin_dir: Path, tmp_path: Path, trouble: str) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    config = tmp_path / "claude-config"
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = folder / "s.sock"
    script = Script({"only turn": [("Write", {"file_path": str(repo / "notes.txt"), "content": "one\n"})]}, lambda: "")
    cli("integrate", "claude-code", "--events", "tools", env={"CLAUDE_CONFIG_DIR": str(config)})
    with contextlib.ExitStack() as stack:
        if trouble == "hung":  # accepts connections, never answers
            listener = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            listener.bind(str(path))
            listener.listen(64)
        else:  # a file in the socket's place: no daemon can start
            path.write_text("not a socket")
        mock = stack.enter_context(MockModel(script))
        env = _quiet(child_env(path))
        env.update(CLAUDE_CONFIG_DIR=str(config), ANTHROPIC_BASE_URL=mock.url, ANTHROPIC_API_KEY="sk-mock")
        env["SNAPSHOTD_HOOK_BEFORE_BUDGET"] = "3"  # the "before" waits this long for its checkpoint (55 s by default)
        argv = [str(bin_dir / "claude"), "--output-format", "json", "--permission-mode", "acceptEdits", "--allowedTools", "Write", "-p", "only turn"]
        _run(argv, repo, env)
    # The hooks' background children end once the listener is gone; one may start a daemon then.
    order = Path(os.environ["SNAPSHOTD_HOME"]) / "hooks" / "order"
    wait_until(lambda: not any(order.glob("*/*")), 60, "the hooks' background checkpoints to end")
    if answers(path):
        cli("stop", env=env)
    assert (repo / "notes.txt").read_text() == "one\n"
    assert ("only turn", 1) in script.moments  # the tool ran and the turn went on


def _transcript_holds(config: Path, session: str, text: str) -> bool:
    """Whether Claude Code's transcript of ``session`` (under its config folder's projects/) holds ``text``."""
    return any(text in path.read_text(errors="replace") for path in config.glob(f"projects/*/{session}.jsonl"))


def test_claude_code_turn_killed_mid_tool_is_closed_when_the_session_resumes(bin_dir: Path, daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    config = tmp_path / "claude-config"
    turns = {
        "first turn": [("Bash", {"command": "echo started > started.txt && sleep 60", "description": "Start a long job"})],
        "second turn": [("Write", {"file_path": str(repo / "notes.txt"), "content": "one\n"})],
    }
    script = Script(turns, lambda: oracle_tree(repo))
    env = _quiet(child_env(sock))
    cli("integrate", "claude-code", "--events", "tools", env={"CLAUDE_CONFIG_DIR": str(config)})
    session = str(uuid.uuid4())
    with MockModel(script) as mock:
        env.update(CLAUDE_CONFIG_DIR=str(config), ANTHROPIC_BASE_URL=mock.url, ANTHROPIC_API_KEY="sk-mock")
        base = [str(bin_dir / "claude"), "--output-format", "json", "--permission-mode", "acceptEdits", "--allowedTools", "Bash,Write"]
        agent = subprocess.Popen([*base, "--session-id", session, "-p", "first turn"], cwd=repo, env=env, start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # Killed once the tool runs and Claude Code has written the turn down, so that --resume finds it.
            wait_until(
                lambda: (repo / "started.txt").exists() and _transcript_holds(config, session, "Start a long job"),
                RUN_TIMEOUT_S, "the long tool to start and the transcript to hold it",
            )
        finally:
            os.killpg(agent.pid, signal.SIGKILL)  # the agent dies mid-tool: no PostToolUse, no Stop
            agent.wait()
        killed = oracle_tree(repo)
        _run([*base, "--resume", session, "-p", "second turn"], repo, env)

    labels = [(cp["label"], cp["tree"]) for cp in _checkpoints(repo, env, session, 7)]
    assert labels[:4] == [
        ("session start (startup)", script.moments["first turn", 0]),
        ("before: first turn", script.moments["first turn", 0]),
        ("after turn (interrupted)", killed),  # the killed turn's work ends where the session went on
        ("session start (resume)", killed),
    ]
    assert [label for label, _ in labels[4:]] == ["before: second turn", "after Write: notes.txt", "after turn"]


def test_claude_code_mcp_tools_act_in_the_calling_agents_session(bin_dir: Path, daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    config = tmp_path / "claude-config"
    # Another agent checkpoints in its own session during the turn, so that its checkpoint is the newest
    # when the model asks (claude -p connects its MCP servers while the turn starts: the call waits a little).
    elsewhere = f"{shlex.quote(sys.executable)} -m snapshotd checkpoint --session another-agent --label elsewhere . && sleep 4"
    turns = {
        "first turn": [("Write", {"file_path": str(repo / "notes.txt"), "content": "one\n"})],
        "second turn": [("Bash", {"command": elsewhere, "description": "Wait"}), ("mcp__snapshotd__list_checkpoints", {}),
                        ("mcp__snapshotd__checkpoint", {"label": "by the model"})],
    }
    script = Script(turns, lambda: oracle_tree(repo))
    env = _quiet(child_env(sock))
    cli("integrate", "claude-code", env={"CLAUDE_CONFIG_DIR": str(config)})  # turns only: nothing after the Bash tool
    servers = {"mcpServers": {"snapshotd": {"command": sys.executable, "args": ["-m", "snapshotd", "mcp"], "env": child_env(sock)}}}
    (tmp_path / "mcp.json").write_text(json.dumps(servers))
    session = str(uuid.uuid4())
    with MockModel(script) as mock:
        env.update(CLAUDE_CONFIG_DIR=str(config), ANTHROPIC_BASE_URL=mock.url, ANTHROPIC_API_KEY="sk-mock")
        base = [str(bin_dir / "claude"), "--output-format", "json", "--permission-mode", "acceptEdits", "--mcp-config", str(tmp_path / "mcp.json"),
                "--allowedTools", "Write,Bash,mcp__snapshotd__list_checkpoints,mcp__snapshotd__checkpoint"]
        _run([*base, "--session-id", session, "-p", "first turn"], repo, env)
        _run([*base, "--resume", session, "-p", "second turn"], repo, env)

    results = [part for request in script.requests for message in request["body"].get("messages", []) if message.get("role") == "user"
               for part in (message["content"] if isinstance(message["content"], list) else []) if part.get("type") == "tool_result"]
    # Claude Code hands the model the structured content, as JSON text.
    listed = next((json.loads(part["content"]) for part in results if '"checkpoints"' in str(part["content"])), results)
    assert isinstance(listed, dict) and listed["session"] == session, listed
    assert "before: first turn" in [cp["label"] for cp in listed["checkpoints"]], listed
    assert cli("list", "--json", str(repo), env=env).json()["checkpoints"][2]["session"] == "another-agent"  # newest when asked
    labels = [cp["label"] for cp in _checkpoints(repo, env, session, 7)]
    assert "by the model" in labels, labels  # the model's checkpoint went to its own session


def test_codex_turn_killed_mid_tool_is_closed_when_the_thread_resumes(bin_dir: Path, daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    home = tmp_path / "codex-home"
    home.mkdir()
    turns = {
        "first turn": [("exec_command", {"cmd": "echo started > started.txt && sleep 60"})],
        "second turn": [("exec_command", {"cmd": "printf 'v1\\n' > CHANGES"})],
    }
    script = Script(turns, lambda: oracle_tree(repo))
    env = _quiet(child_env(sock, CODEX_HOME=str(home), MOCK_API_KEY="sk-mock"))
    with MockModel(script) as mock:
        (home / "config.toml").write_text(
            'model = "gpt-5-codex"\nmodel_provider = "mock"\ncheck_for_update_on_startup = false\n\n'
            f'[model_providers.mock]\nname = "mock"\nbase_url = "{mock.url}/v1"\nwire_api = "responses"\nenv_key = "MOCK_API_KEY"\n\n'
            "[analytics]\nenabled = false\n"
        )
        cli("integrate", "codex", env={"CODEX_HOME": str(home)})
        base = [str(bin_dir / "codex"), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--json"]
        agent = subprocess.Popen([*base, "first turn"], cwd=repo, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: (repo / "started.txt").exists(), RUN_TIMEOUT_S, "the long command to start")
        finally:
            os.killpg(agent.pid, signal.SIGKILL)  # the agent dies mid-command: no Stop
            agent.wait()
        killed = oracle_tree(repo)
        _run([*base, "resume", "--last", "second turn"], repo, env)

    [session] = {cp["session"] for cp in cli("list", "--json", str(repo), env=env).json()["checkpoints"]}
    labels = [(cp["label"], cp["tree"]) for cp in _checkpoints(repo, env, session, 6)]
    assert labels[:4] == [
        ("session start (startup)", script.moments["first turn", 0]),
        ("before: first turn", script.moments["first turn", 0]),
        ("after turn (interrupted)", killed),
        ("session start (resume)", killed),
    ], labels
    assert [label for label, _ in labels[4:]] == ["before: second turn", "after turn"]
