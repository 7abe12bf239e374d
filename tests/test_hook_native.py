"""The native hook entry (``native/hook.c``): the daemon's ``hook`` method runs the Python hook's rules for it.

Every run is the real program ``integrate`` writes for the events the agent waits for, fed a recorded
payload, against a real daemon; each is compared with the Python entry's run of the same payload on a
copy of the worktree: the same checkpoints (labels, trees, trailers) and the same stdout and stderr.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import Daemon, call, child_env, cli, wait_until
from hook_helpers import HookRun, placed, recorded
from oracle import oracle_tree
from repo_helpers import init_repo, write

from snapshotd.agents.hooks import BEFORE_EVENTS
from snapshotd.agents.hookserve import NATIVE_PROGRAM, native_entry
from snapshotd.agents.hookstate import key_name
from snapshotd.agents.integrate import hook_command, native_command, wanted_entries
from snapshotd.settings import HOOK_ENVIRONMENT

pytestmark = pytest.mark.skipif(native_entry() is None, reason="the native hook entry was not built (no C compiler)")

HOOK_TIMEOUT_S = 60
SOURCE = Path(__file__).resolve().parent.parent / "native" / "hook.c"


def run(command: str, data: bytes, env: dict[str, str]) -> HookRun:
    proc = subprocess.run(shlex.split(command), input=data, capture_output=True, env=env, timeout=HOOK_TIMEOUT_S, check=False)
    return HookRun(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))


def checkpoints(repo: Path, env: dict[str, str], session: str) -> list[dict[str, Any]]:
    return cli("list", "--json", "--session", session, str(repo), env=env).json()["checkpoints"][::-1]


def hook_calls(sock: Path) -> int:
    return int(call(sock, "status")["counters"].get("calls.hook", 0))


def act(repo: Path, name: str, payload: dict[str, Any]) -> None:
    if "post-tool-use-bash" in name:
        subprocess.run(["sh", "-c", payload["tool_input"]["command"]], cwd=repo, check=True)
    elif "post-tool-use" in name:
        write(repo / "a.txt", "hello\n")


def test_the_native_entry_lists_the_variables_the_hook_reads() -> None:
    source = SOURCE.read_text()
    listed = source[source.index("ENVIRONMENT[] = {") : source.index("NULL,")]
    assert [part.strip().strip('"') for part in listed.split("{", 1)[1].split(",") if part.strip()] == list(HOOK_ENVIRONMENT)
    assert f"#define ANSWER_WAIT_MS {(HOOK_TIMEOUT_S - 1) * 1000}" in source


@pytest.mark.parametrize("tool", ["claude-code", "codex"])
def test_a_recorded_session_through_the_native_entry_records_what_the_python_entry_records(
    tool: str, daemon: Daemon, sock: Path, tmp_path: Path
) -> None:
    repos = {kind: init_repo(tmp_path / kind, ("a.txt", "alpha\n"), ("src/b.py", "print('b')\n")) for kind in ("native", "python")}
    env = child_env(sock, SNAPSHOTD_HOOK_BUDGET="60")
    before = hook_calls(sock)
    runs: dict[str, list[tuple[int, str, str]]] = {"native": [], "python": []}
    for name, payload in recorded(tool):
        for kind, repo in repos.items():
            act(repo, name, payload)
            event = payload["hook_event_name"]
            command = native_command(tool) if kind == "native" and event in BEFORE_EVENTS else hook_command(tool)
            got = run(command, placed(payload, repo, session_id=f"{kind}-session"), env)
            runs[kind].append((got.code, got.stdout, got.stderr))
    assert runs["native"] == runs["python"] == [(0, "", "")] * len(runs["python"])
    assert hook_calls(sock) - before == sum(p["hook_event_name"] in BEFORE_EVENTS for _, p in recorded(tool)) == 2
    found = {kind: checkpoints(repo, env, f"{kind}-session") for kind, repo in repos.items()}
    assert [cp["label"] for cp in found["native"]] == [cp["label"] for cp in found["python"]]
    assert len(found["native"]) == 5
    for kind, repo in repos.items():
        assert found[kind][-1]["tree"] == oracle_tree(repo)
    assert [cp["tree"] for cp in found["native"]] == [cp["tree"] for cp in found["python"]]  # the same content, file for file
    strip = ("session",)
    agents = {kind: [{k: v for k, v in (cp.get("agent") or {}).items() if k not in strip} for cp in cps] for kind, cps in found.items()}
    assert agents["native"] == agents["python"]


@pytest.mark.parametrize(
    ("data", "fails"),
    [
        (b"not json", True),
        (b'{"cwd": "/tmp"}', True),
        (b"\xff\xfe", True),
        (b'{"hook_event_name": "UserPromptSubmit", "prompt": "x", "cwd": 3}', False),  # recorded in the hook's folder
    ],
)
def test_what_the_native_entry_says_is_what_the_python_entry_says(
    daemon: Daemon, sock: Path, tmp_path: Path, data: bytes, fails: bool
) -> None:
    outputs = []
    for kind in ("native", "python"):
        home = tmp_path / f"home-{kind}"  # its own hooks folder: each is told its failure once
        env = child_env(sock, SNAPSHOTD_HOME=str(home))
        command = native_command("claude-code") if kind == "native" else hook_command("claude-code")
        got = subprocess.run(shlex.split(command), input=data, capture_output=True, env=env, cwd=tmp_path, timeout=HOOK_TIMEOUT_S, check=False)
        hooks = home / "hooks"  # a checkpoint's outcome is kept just after the hook returns: once it is there
        wait_until(lambda hooks=hooks: (hooks / "last-claude-code.json").exists() and not any(p.name.startswith(".") for p in hooks.iterdir()), 30, "the hook's outcome kept")
        outputs.append((got.returncode, got.stdout, got.stderr, sorted(p.name for p in hooks.iterdir())))
    assert outputs[0] == outputs[1]
    assert bool(outputs[0][1] and outputs[0][2]) == fails, outputs


def test_with_no_daemon_the_native_entry_runs_the_python_one_which_starts_it(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    sock = tmp_path / "auto" / "s.sock"
    env = child_env(sock)
    [(_, prompt)] = [item for item in recorded("claude-code") if "user-prompt" in item[0]]
    try:
        got = run(native_command("claude-code"), placed(prompt, repo), env)
        assert (got.code, got.stdout, got.stderr) == (0, "", ""), got
        [cp] = checkpoints(repo, env, prompt["session_id"])
        assert (cp["label"], cp["tree"]) == ("before: Add a CHANGES file and fix the greeting in a.txt", oracle_tree(repo))
        assert hook_calls(sock) == 0  # the Python entry's own calls
    finally:
        cli("stop", env=env)


def test_a_hung_daemon_leaves_the_native_entry_within_the_python_entrys_limits(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    folder = tmp_path / "stuck"
    folder.mkdir(mode=0o700)
    path = folder / "s.sock"
    [(_, prompt)] = [item for item in recorded("codex") if "user-prompt" in item[0]]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(8)  # accepts connections, never answers
        started = time.monotonic()
        got = run(native_command("codex"), placed(prompt, repo), child_env(path, SNAPSHOTD_CONNECT_TIMEOUT="1"))
        waited = time.monotonic() - started
    # the native entry's ping (2 s), then the Python entry's (SNAPSHOTD_CONNECT_TIMEOUT), far inside the agent's 60 s
    assert got.code == 0 and waited < 20, (waited, got)
    [line] = got.stderr.splitlines()
    assert "accepts connections but did not answer within 1 s" in line, got


def test_a_before_in_the_daemon_waits_for_the_sessions_earlier_checkpoint(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    env = child_env(sock)
    [(_, prompt)] = [item for item in recorded("claude-code") if "user-prompt" in item[0]]
    session = prompt["session_id"]
    order = Path(env["SNAPSHOTD_HOME"]) / "hooks" / "order" / key_name(session)
    for folder in (order.parent.parent.parent, order.parent.parent, order.parent, order):
        folder.mkdir(mode=0o700, exist_ok=True)
    earlier = os.open(order / f"{1:016d}-{1:010d}-{1:016d}-{1:010d}", os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(earlier, fcntl.LOCK_EX)  # an earlier hook of the session, its checkpoint still running
    proc = subprocess.Popen(shlex.split(native_command("claude-code")), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdin is not None
        proc.stdin.write(placed(prompt, repo))
        proc.stdin.close()
        wait_until(lambda: hook_calls(sock) == 1, 30, "the hook in the daemon")
        time.sleep(1)
        assert proc.poll() is None
        assert checkpoints(repo, env, session) == []
    finally:
        os.close(earlier)  # that checkpoint is recorded: this one may go
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        out, err = proc.stdout.read(), proc.stderr.read()
    assert (proc.wait(HOOK_TIMEOUT_S), out, err) == (0, b"", b"")
    [cp] = checkpoints(repo, env, session)
    assert cp["tree"] == oracle_tree(repo)


def test_integrate_writes_the_native_entry_for_the_events_the_agent_waits_for() -> None:
    wanted = wanted_entries("claude-code", "tools")
    commands = {event: group["hooks"][0]["command"] for event, group in wanted.items()}
    assert commands["UserPromptSubmit"] == f"{shlex.quote(NATIVE_PROGRAM)} {hook_command('claude-code')}"
    assert {event for event, command in commands.items() if command.startswith(shlex.quote(NATIVE_PROGRAM))} == {"UserPromptSubmit"}
    assert shutil.which(shlex.split(commands["UserPromptSubmit"])[0])


def test_doctor_says_which_entry_runs_each_event() -> None:
    cli("integrate", "codex")
    [hooks] = [c for c in cli("doctor", "codex", "--json").json()["checks"] if c["check"] == "codex hooks"]
    assert hooks["ok"] and "(the native entry for UserPromptSubmit, the Python one for the rest)" in hooks["detail"], hooks
