"""The real ``opencode`` (1.18) with the plug-in ``snapshotd integrate opencode`` installs, headless against the mock model.

OpenCode runs offline here: its updates, model list, LSP downloads, sharing
and default plug-ins are off, and its config folder already lists the
package it would install there (``@opencode-ai/plugin``), so it installs
nothing (npm's registry points at a closed port, to be sure). Its model is a
provider of Anthropic's kind whose base URL is the mock (tests/agent_mock.py);
a model named ``gpt-…`` gets OpenCode's ``apply_patch`` tool instead of
``edit`` and ``write``. One ``opencode serve`` runs the session, and each
turn is an ``opencode run --attach`` to it (the server's start is paid once).

The session's turns make real edits (``apply_patch``, ``bash``, ``edit``, and
a subagent's ``write`` through the ``task`` tool); every checkpoint whose
moment the mock sees is compared with git's tree then (tests/oracle.py). A
daemon that accepts and never answers costs the turn one budget, and the
turn finishes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_mock import MockModel, Script
from daemon_helpers import Daemon, child_env, cli, wait_until
from oracle import oracle_tree
from repo_helpers import init_repo

CLIS = Path(os.environ.get("SNAPSHOTD_AGENT_CLIS") or Path.home() / ".cache" / "snapshotd-agent-clis")
PACKAGE = "opencode-ai@1.18"
RUN_TIMEOUT_S = 120
SERVE_WAIT_S = 90

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


def _version(program: Path) -> str:
    return json.loads((program.resolve().parent.parent / "package.json").read_text())["version"]


def _env(tmp_path: Path, repo: Path, sock: Path, mock_url: str, **extra: str) -> dict[str, str]:
    """OpenCode's environment: a home of its own, offline, the mock as its provider."""
    home = tmp_path / "home"
    models = {name: {"name": name, "tool_call": True} for name in ("mock-model", "gpt-5-mock")}
    config = {
        "$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled", "model": "mock/mock-model",
        "permission": {"edit": "allow", "bash": "allow", "external_directory": "allow"},
        "provider": {"mock": {"npm": "@ai-sdk/anthropic", "name": "Mock", "options": {"baseURL": f"{mock_url}/v1", "apiKey": "sk-mock"}, "models": models}},
    }
    env = {k: v for k, v in child_env(sock).items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "OPENCODE_", "NPM_CONFIG_"))}
    env.update(
        HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"), XDG_CACHE_HOME=str(CLIS / "opencode-cache"),  # its provider packages, installed once
        XDG_STATE_HOME=str(home / "state"), PWD=str(repo), OPENCODE_CONFIG_CONTENT=json.dumps(config),
        OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_LSP_DOWNLOAD="1",
        OPENCODE_DISABLE_SHARE="1", OPENCODE_DISABLE_DEFAULT_PLUGINS="1", OPENCODE_DISABLE_CLAUDE_CODE="1",
        OPENCODE_DISABLE_AUTOCOMPACT="1", NPM_CONFIG_REGISTRY="http://127.0.0.1:9/", NO_PROXY="127.0.0.1", **extra,
    )
    return env


def _installed(program: Path, tmp_path: Path, env: dict[str, str]) -> Path:
    """``snapshotd integrate opencode --events tools`` into the user's config folder, made as OpenCode leaves it
    once it has installed its plug-in package there (so it installs nothing)."""
    folder = Path(env["XDG_CONFIG_HOME"]) / "opencode"
    (folder / "node_modules").mkdir(parents=True)
    dependency = {"@opencode-ai/plugin": _version(program)}
    (folder / "package.json").write_text(json.dumps({"dependencies": dependency}))
    (folder / "package-lock.json").write_text(json.dumps({"lockfileVersion": 3, "packages": {"": {"dependencies": dependency}}}))
    said = cli("integrate", "opencode", "--events", "tools", env=env, cwd=tmp_path).stdout
    assert "installed snapshotd's OpenCode plug-in at" in said, said
    return folder / "plugins" / "snapshotd.js"


@contextlib.contextmanager
def _server(program: Path, repo: Path, env: dict[str, str]) -> Iterator[str]:
    """``opencode serve`` on a free port of 127.0.0.1, until it answers; its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = open(repo.parent / "serve.log", "w+b")  # noqa: SIM115 - read back on failure
    proc = subprocess.Popen([str(program), "serve", "--hostname", "127.0.0.1", "--port", str(port)], cwd=repo, env=env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVE_WAIT_S
        while b"listening" not in (repo.parent / "serve.log").read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, (repo.parent / "serve.log").read_text()[-2000:]
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _run(program: Path, args: list[str], repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(program), "run", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc


def _checkpoints(repo: Path, env: dict[str, str], last: str, count: int) -> list[dict[str, Any]]:
    """The sessions' checkpoints, oldest first, once there are ``count`` and the newest is labelled ``last``."""
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        found[:] = [cp for cp in cli("list", "--json", str(repo), env=env).json()["checkpoints"][::-1] if cp["session"]]
        return len(found) >= count and found[-1]["label"] == last

    try:
        wait_until(enough, 60, f"{count} checkpoints ending with {last!r}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; found {[cp['label'] for cp in found]}") from None
    return found


def test_opencode_two_turns_with_a_subagent_through_the_installed_plugin(opencode: Path, daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    patch = "*** Begin Patch\n*** Add File: notes.txt\n+one\n*** End Patch"
    turns = {
        "first turn": [("apply_patch", {"patchText": patch}),
                       ("bash", {"command": "echo two > todo.txt", "description": "Write the todo list"})],
        "second turn": [("edit", {"filePath": str(repo / "a.txt"), "oldString": "alpha", "newString": "hello"}),
                        ("task", {"description": "Write sub", "prompt": "subagent work", "subagent_type": "general"})],
        "subagent work": [("write", {"filePath": str(repo / "src" / "sub.txt"), "content": "sub\n"})],
    }
    script = Script(turns, lambda: oracle_tree(repo))
    with MockModel(script) as mock:
        env = _env(tmp_path, repo, sock, mock.url)
        plugin = _installed(opencode, tmp_path, env)
        with _server(opencode, repo, env) as url:
            _run(opencode, ["--attach", url, "--dir", str(repo), "-m", "mock/gpt-5-mock", "first turn"], repo, env)
            first = _checkpoints(repo, child_env(sock), "after turn", 6)
            _run(opencode, ["--attach", url, "--dir", str(repo), "--continue", "-m", "mock/mock-model", "second turn"], repo, env)
            checkpoints = _checkpoints(repo, child_env(sock), "after turn", 14)
    end = oracle_tree(repo)

    tools = {tool["name"] for request in script.requests for tool in request["body"].get("tools", [])}
    assert {"apply_patch", "bash", "edit", "write", "task"} <= tools and not {"patch", "multiedit"} & tools, tools
    assert len({cp["session"] for cp in checkpoints}) == 1, checkpoints  # the subagent's are in its parent's session
    labels = [cp["label"] for cp in checkpoints]
    assert labels == [
        'before: "first turn"', "before apply_patch: notes.txt", "after apply_patch: notes.txt",  # opencode run quotes the message
        "before bash: echo two > todo.txt", "after bash: echo two > todo.txt", "after turn",
        'before: "second turn"', "before edit: a.txt", "after edit: a.txt",
        "before subagent: subagent work", "before write: src/sub.txt", "after write: src/sub.txt", "after subagent",
        "after turn",
    ], labels
    assert labels[:6] == [cp["label"] for cp in first]
    session = checkpoints[0]["session"]
    agents = {cp["label"]: cp.get("agent") or {} for cp in checkpoints}
    assert all(agent["tool"] == "opencode" and agent["session"] == session for agent in agents.values()), agents
    assert agents["before edit: a.txt"]["tool_use"] == agents["after edit: a.txt"]["tool_use"] != agents["before bash: echo two > todo.txt"]["tool_use"]
    child = agents["before write: src/sub.txt"]["subagent"]
    assert child != session and agents["after subagent"]["subagent"] == child and "subagent" not in agents["after turn"], agents
    assert agents['before: "second turn"'].get("model", "mock/mock-model") == "mock/mock-model"
    trees = {cp["label"]: cp["tree"] for cp in checkpoints}
    moments = script.moments
    assert trees['before: "first turn"'] == trees["before apply_patch: notes.txt"] == moments["first turn", 0]
    assert trees["after apply_patch: notes.txt"] == trees["before bash: echo two > todo.txt"] == moments["first turn", 1]
    assert trees["after bash: echo two > todo.txt"] == checkpoints[5]["tree"] == moments["first turn", 2]
    assert trees['before: "second turn"'] == trees["before edit: a.txt"] == moments["second turn", 0]
    assert trees["after edit: a.txt"] == trees["before subagent: subagent work"] == moments["second turn", 1]
    assert trees["before write: src/sub.txt"] == moments["subagent work", 0]
    assert trees["after write: src/sub.txt"] == trees["after subagent"] == moments["subagent work", 1] == moments["second turn", 2]
    assert checkpoints[-1]["tree"] == end
    assert (repo / "notes.txt").read_text() == "one\n" and (repo / "a.txt").read_text() == "hello\n"
    assert (repo / "src" / "sub.txt").read_text() == "sub\n"

    said = cli("doctor", "opencode", "--json", env={**child_env(sock), "XDG_CONFIG_HOME": env["XDG_CONFIG_HOME"]}, cwd=repo, code=None).json()
    found = {check["check"]: check for check in said["checks"]}
    assert found["opencode plug-in"]["ok"] and str(plugin) in found["opencode plug-in"]["detail"], said
    assert found["opencode last hook"]["ok"] and "recorded" in found["opencode last hook"]["detail"], said
    removed = cli("integrate", "opencode", "--remove", env=env, cwd=tmp_path).stdout
    assert removed.startswith("removed snapshotd's OpenCode plug-in") and not plugin.parent.exists(), removed
    assert (plugin.parent.parent / "package.json").exists()  # OpenCode's own files stay


def test_opencode_finishes_its_turn_with_a_daemon_that_never_answers(opencode: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = folder / "s.sock"
    script = Script({"only turn": [("write", {"filePath": str(repo / "notes.txt"), "content": "one\n"}),
                                   ("bash", {"command": "echo two > todo.txt", "description": "Write"})]}, lambda: "")
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        listener.bind(str(path))
        listener.listen(64)  # accepts connections, never answers
        mock = stack.enter_context(MockModel(script))
        env = _env(tmp_path, repo, path, mock.url, SNAPSHOTD_HOOK_BEFORE_BUDGET="3")
        _installed(opencode, tmp_path, env)
        proc = _run(opencode, ["only turn"], repo, env)
    assert (repo / "notes.txt").read_text() == "one\n" and (repo / "todo.txt").read_text() == "two\n"
    told = [line for line in proc.stderr.splitlines() if line.startswith("snapshotd:")]
    assert len(told) == 1 and "did not answer" in told[0] and "snapshotd doctor opencode" in told[0], proc.stderr[-2000:]
    last = json.loads((Path(env["SNAPSHOTD_HOME"]) / "hooks" / "last-opencode.json").read_text())
    assert last["ok"] is False and "skipped" in last["note"], last
