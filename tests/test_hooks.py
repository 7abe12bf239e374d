"""``snapshotd hook``: recorded payloads of Claude Code and Codex become labelled checkpoints.

Every run is a real ``python -m snapshotd hook TOOL`` process fed a payload on
stdin, against a real daemon. Whatever goes wrong, the hook exits 0, prints
nothing on stdout (which the agent would read as a decision) and at most one
line on stderr.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import Daemon, answers, child_env, cli, running_daemon, wait_until
from hook_helpers import HookRun, placed, recorded, run_hook
from oracle import oracle_tree
from repo_helpers import git, init_repo, write

from snapshotd.agents import hookstate
from snapshotd.agents.hooks import LABEL_DETAIL_CHARS, describe
from snapshotd.agents.integrate import hook_command
from snapshotd.errors import InvalidParams

LONG_WAIT = "60"  # budget for runs that must record before the next one starts


@pytest.fixture
def env(sock: Path) -> dict[str, str]:
    return child_env(sock, SNAPSHOTD_HOOK_BUDGET=LONG_WAIT)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(tmp_path / "project", ("a.txt", "alpha\n"), ("src/b.py", "print('b')\n"))


def user_line(run: HookRun) -> str:
    """The one line the hook asked the agent to show the user (its ``systemMessage``)."""
    [line] = run.stdout.splitlines()
    return json.loads(line)["systemMessage"]


def session_checkpoints(repo: Path, env: dict[str, str], session: str) -> list[dict[str, Any]]:
    """The session's checkpoints, oldest first."""
    return cli("list", "--json", "--session", session, str(repo), env=env).json()["checkpoints"][::-1]


def act(repo: Path, name: str, payload: dict[str, Any]) -> None:
    """Do what the recorded tool call did, before its PostToolUse payload arrives."""
    if "post-tool-use-bash" in name:
        subprocess.run(["sh", "-c", payload["tool_input"]["command"]], cwd=repo, check=True)
    elif "post-tool-use" in name:  # Claude Code's Edit, Codex's apply_patch: alpha -> hello
        write(repo / "a.txt", "hello\n")


EXPECTED_LABELS = {
    "claude-code": [
        "before: Add a CHANGES file and fix the greeting in a.txt",
        "before Bash: printf 'v1: first release\\n' > CHANGES",
        "after Bash: printf 'v1: first release\\n' > CHANGES",
        "after Edit: a.txt",
        "after turn",
    ],
    "codex": [
        "before: Add a CHANGES file and fix the greeting in a.txt",
        "before Bash: printf 'v1: first release\\n' > CHANGES",
        "after Bash: printf 'v1: first release\\n' > CHANGES",
        "after apply_patch: a.txt",
        "after turn",
    ],
}


@pytest.mark.parametrize("tool", ["claude-code", "codex"])
def test_recorded_session_becomes_labelled_checkpoints(tool: str, daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    trees = []
    session = None
    for name, payload in recorded(tool):
        act(repo, name, payload)
        trees.append(oracle_tree(repo))
        session = payload["session_id"]
        run = run_hook(tool, placed(payload, repo), env)
        assert (run.code, run.stdout, run.stderr) == (0, "", ""), run

    checkpoints = session_checkpoints(repo, env, session)
    assert [cp["label"] for cp in checkpoints] == EXPECTED_LABELS[tool]
    assert {cp["session"] for cp in checkpoints} == {session}
    assert [cp["tree"] for cp in checkpoints] == trees
    after_bash = git(repo, "show", f"{checkpoints[2]['id']}:CHANGES", "--")
    assert after_bash == "v1: first release"
    assert "CHANGES" not in git(repo, "ls-tree", "--name-only", checkpoints[1]["id"])
    # The user's own state is untouched: the edits are still uncommitted.
    assert git(repo, "status", "--porcelain") == " M a.txt\n?? CHANGES"


def test_subfolder_cwd_and_payload_without_session(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    [(_, stop)] = [item for item in recorded("claude-code") if "stop" in item[0]]
    payload = {k: v for k, v in stop.items() if k != "session_id"}
    run = run_hook("claude-code", placed(payload, repo, cwd=str(repo / "src")), env)
    assert (run.code, run.stdout, run.stderr) == (0, "", ""), run
    [cp] = cli("list", "--json", str(repo), env=env).json()["checkpoints"]
    assert (cp["session"], cp["label"], cp["tree"]) == (None, "after turn", oracle_tree(repo))


def test_a_turn_in_a_plain_folder_never_checkpointed(daemon: Daemon, env: dict[str, str], tmp_path: Path) -> None:
    # The first hook asks for the session's newest checkpoint; a folder in no worktree yet has none (its
    # first checkpoint makes it one), which is no failure of the hook.
    folder = tmp_path / "notes"
    write(folder / "a.txt", "a\n")
    [(_, prompt)] = [item for item in recorded("claude-code") if "user-prompt" in item[0]]
    run = run_hook("claude-code", placed(prompt, folder, session_id="plain-session"), env)
    assert (run.code, run.stdout, run.stderr) == (0, "", ""), run
    [cp] = cli("list", "--json", str(folder), env=env).json()["checkpoints"]
    assert cp["session"] == "plain-session" and cp["label"].startswith("before: ")


def _prompt_payload(**changes: Any) -> bytes:
    [(_, payload)] = [item for item in recorded("claude-code") if "user-prompt" in item[0]]
    return placed(payload, Path("/home/user/project"), **changes)


def test_labels_quote_the_first_line_briefly() -> None:
    long_prompt = "\n\n  " + "word " * 40 + "\nsecond line"
    event = describe("claude-code", _prompt_payload(prompt=long_prompt))
    assert event.label.startswith("before: word word")
    assert event.label.endswith("…") and len(event.label) == len("before: ") + LABEL_DETAIL_CHARS
    assert describe("claude-code", _prompt_payload(prompt="")).label == "before: "
    assert describe("claude-code", _prompt_payload(prompt="nul\0here")).label == "before: nul\ufffdhere"  # no label holds NUL

    as_list = {"hook_event_name": "PostToolUse", "cwd": "/w", "tool_name": "Bash", "tool_input": {"command": ["rm", "a b"]}}
    assert describe("codex", _json(as_list)).label == "after Bash: rm 'a b'"
    patch = "*** Begin Patch\n*** Add File: n.py\n+x\n*** Delete File: old.py\n*** Update File: a.py\n*** Move to: b.py\n*** End Patch\n"
    as_patch = {**as_list, "tool_name": "apply_patch", "tool_input": {"command": patch}}
    assert describe("codex", _json(as_patch)).label == "after apply_patch: n.py, old.py, a.py, b.py"
    outside = {**as_list, "tool_name": "Write", "tool_input": {"file_path": "/etc/x.conf", "content": ""}}
    assert describe("claude-code", _json(outside)).label == "after Write: /etc/x.conf"
    mcp_tool = {**as_list, "tool_name": "mcp__github__create_issue", "tool_input": {"title": "t"}}
    assert describe("claude-code", _json(mcp_tool)).label == "after mcp__github__create_issue"
    start = {"hook_event_name": "SessionStart", "cwd": "/w", "source": "resume"}
    assert describe("claude-code", _json(start)).label == "session start (resume)"


def _json(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


@pytest.mark.parametrize(
    ("data", "tool", "fragment"),
    [
        (b"not json", "claude-code", "is not JSON"),
        (b"[1, 2]", "codex", "not a JSON object"),
        (b'{"session_id": "s"}', "codex", "no 'hook_event_name'"),
        (b'{"hook_event_name": "Stop"}', "cursor", "Unknown agent tool 'cursor'"),
        (b'{"hook_event_name": "Stop", "cwd": "/nonexistent/folder"}', "claude-code", "/nonexistent/folder does not exist"),
    ],
    ids=["garbage", "array", "no-event", "unknown-tool", "missing-cwd"],
)
def test_bad_input_exits_0_with_one_line(daemon: Daemon, env: dict[str, str], data: bytes, tool: str, fragment: str) -> None:
    run = run_hook(tool, data, env)
    assert run.code == 0, run
    [line] = run.stderr.splitlines()
    assert line.startswith("snapshotd hook: ") and fragment in line, run
    assert fragment in user_line(run), run


def test_a_stuck_daemon_costs_a_before_hook_one_ping(tmp_path: Path, repo: Path) -> None:
    folder = tmp_path / "stuck"
    folder.mkdir(mode=0o700)
    path = folder / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(8)  # accepts connections, never answers
        [(_, prompt)] = [item for item in recorded("codex") if "user-prompt" in item[0]]
        started = time.monotonic()
        # A "before" waits up to 55 s for its checkpoint; the ping tells a stuck daemon after the wait for room.
        run = run_hook("codex", placed(prompt, repo), child_env(path, SNAPSHOTD_CONNECT_TIMEOUT="4"))
        waited = time.monotonic() - started
        assert run.code == 0 and 4 <= waited < 10, (waited, run)
        [line] = run.stderr.splitlines()
        assert "accepts connections but did not answer within 4 s" in line, run
        assert "did not answer" in user_line(run), run
        # The next hooks ask it only briefly (a `snapshotd serve` stopped by Ctrl-Z: every prompt would wait).
        started = time.monotonic()
        again = run_hook("codex", placed(prompt, repo), child_env(path, SNAPSHOTD_CONNECT_TIMEOUT="4"))
        waited = time.monotonic() - started
    assert again.code == 0 and waited < 3.5, (waited, again)
    assert "did not answer within 2 s" in again.stderr, again
    assert hookstate.silent_lately(str(path))
    # A daemon that answers again clears the mark: the hooks after it wait for room as long as ever.
    path.unlink()
    with running_daemon(path, tmp_path / "daemon.log"):
        heard = run_hook("codex", placed(prompt, repo), child_env(path, SNAPSHOTD_CONNECT_TIMEOUT="4"))
        assert heard.code == 0 and heard.stderr == "", heard
    assert not hookstate.silent_lately(str(path))


def test_a_daemon_heard_again_is_waited_for_as_long_as_ever(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    assert not hookstate.silent_lately(path)
    hookstate.note_silence(path, True)
    assert hookstate.silent_lately(path) and not hookstate.silent_lately(str(tmp_path / "other.sock"))
    assert not hookstate.silent_lately(path, now=time.time() + hookstate.SILENT_KEEP_S + 1)
    hookstate.note_silence(path, False)
    assert not hookstate.silent_lately(path)


def test_a_daemon_that_cannot_start_exits_0(tmp_path: Path, repo: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    (folder / "s.sock").write_text("not a socket")  # the daemon will not remove a file in its way
    env = child_env(folder / "s.sock", SNAPSHOTD_HOOK_BUDGET=LONG_WAIT)
    [(_, prompt)] = [item for item in recorded("claude-code") if "user-prompt" in item[0]]
    run = run_hook("claude-code", placed(prompt, repo), env)
    assert run.code == 0, run
    [line] = run.stderr.splitlines()
    assert "is not a socket" in line and "is not a socket" in user_line(run), run


def test_a_hook_starts_the_daemon_when_none_runs(tmp_path: Path, repo: Path) -> None:
    sock = tmp_path / "auto" / "s.sock"
    env = child_env(sock, SNAPSHOTD_HOOK_BUDGET=LONG_WAIT)
    [(_, prompt)] = [item for item in recorded("codex") if "user-prompt" in item[0]]
    try:
        run = run_hook("codex", placed(prompt, repo), env)
        assert (run.code, run.stdout, run.stderr) == (0, "", ""), run
        [cp] = session_checkpoints(repo, env, prompt["session_id"])
        assert cp["tree"] == oracle_tree(repo)
    finally:
        cli("stop", env=env)


def test_a_checkpoint_past_the_budget_finishes_in_the_background(tmp_path: Path, repo: Path) -> None:
    sock = tmp_path / "late" / "s.sock"
    env = child_env(sock, SNAPSHOTD_HOOK_BUDGET="0.01")  # far less than starting a daemon takes
    [(_, stop)] = [item for item in recorded("claude-code") if "stop" in item[0]]
    try:
        run = run_hook("claude-code", placed(stop, repo), env)
        assert run.code == 0 and run.stdout == "", run  # going on in the background is no failure
        [line] = run.stderr.splitlines()
        assert "still running" in line and "finishes in the background" in line, run
        wait_until(lambda: answers(sock) and session_checkpoints(repo, env, stop["session_id"]), 60, "the checkpoint")
        [cp] = session_checkpoints(repo, env, stop["session_id"])
        assert (cp["label"], cp["tree"]) == ("after turn", oracle_tree(repo))
    finally:
        cli("stop", env=env)


def test_unknown_tool_error_is_the_library_sentence() -> None:
    with pytest.raises(InvalidParams, match="use one of: claude-code, codex"):
        describe("cursor", b"{}")


# --------------------------------------------------------------------------
# A whole simulated agent session, then a revert of one turn.


def test_simulated_session_then_revert_one_turn(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    shapes = dict(recorded("claude-code"))
    session = "e2e-session"

    def hook(name: str, **changes: Any) -> None:
        run = run_hook("claude-code", placed(shapes[name], repo, session_id=session, **changes), env)
        assert (run.code, run.stdout, run.stderr) == (0, "", ""), run

    def turn(prompt: str, command: str) -> None:
        hook("1-user-prompt-submit.json", prompt=prompt)
        subprocess.run(["sh", "-c", command], cwd=repo, check=True)  # the agent's Bash tool
        hook("3-post-tool-use-bash.json", tool_input={"command": command})
        hook("5-stop.json")

    turn("Write the notes", "echo one > notes.txt && echo changed > a.txt")
    turn("Now the todo list", f"echo two > todo.txt && echo {shlex.quote('print(2)')} >> src/b.py")

    checkpoints = session_checkpoints(repo, env, session)
    assert [cp["label"] for cp in checkpoints] == [
        "before: Write the notes",
        "after Bash: echo one > notes.txt && echo changed > a.txt",
        "after turn",
        "before: Now the todo list",
        "after Bash: echo two > todo.txt && echo 'print(2)' >> src/b.py",
        "after turn",
    ]
    first_start, first_end = checkpoints[0]["id"], checkpoints[2]["id"]
    cli("revert", first_start, first_end, "--yes", cwd=repo, env=env)

    assert not (repo / "notes.txt").exists()
    assert (repo / "a.txt").read_text() == "alpha\n"
    assert (repo / "todo.txt").read_text() == "two\n"
    assert (repo / "src/b.py").read_text() == "print('b')\nprint(2)\n"
    assert git(repo, "status", "--porcelain") == " M src/b.py\n?? todo.txt"


HEAVY = ("click", "pygit2", "trio", "mcp", "typing", "pathlib", "dataclasses", "socket", "hashlib", "subprocess")


def test_what_the_agent_waits_for_after_a_tool_imports_nothing_heavy(daemon: Daemon, sock: Path, repo: Path) -> None:
    # Every agent event starts a hook process: the part the agent waits for stays on light modules
    # (the checkpoint's connection is made by its background child).
    [(_, post)] = [item for item in recorded("claude-code") if "post-tool-use-bash" in item[0]]
    argv = shlex.split(hook_command("claude-code"))
    assert run_hook("claude-code", placed(post, repo), child_env(sock)).code == 0  # the first run makes the hooks' folder
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], input=placed(post, repo), capture_output=True, env=child_env(sock), check=True)
    imported = {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines() if line.startswith("import time:")}
    assert "snapshotd.agents.hooks" in imported and not imported & set(HEAVY), sorted(imported & set(HEAVY))
    assert proc.stdout == b""
    session = post["session_id"]
    wait_until(lambda: len(session_checkpoints(repo, child_env(sock), session)) == 2, 30, "the handed-off checkpoints")


def test_the_command_lines_hook_runs_the_same_program(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    [(_, prompt)] = [item for item in recorded("claude-code") if "user-prompt" in item[0]]
    run = run_hook("claude-code", placed(prompt, repo, session_id="cli-session"), env, cli=True)
    assert (run.code, run.stdout, run.stderr) == (0, "", ""), run
    [cp] = session_checkpoints(repo, env, "cli-session")
    assert (cp["label"], cp["tree"]) == ("before: Add a CHANGES file and fix the greeting in a.txt", oracle_tree(repo))


def test_a_failure_is_shown_to_the_user_once_in_a_while(tmp_path: Path, repo: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    (folder / "s.sock").write_text("not a socket")  # no daemon can start here
    env = child_env(folder / "s.sock", SNAPSHOTD_HOOK_BUDGET=LONG_WAIT)
    [(_, prompt)] = [item for item in recorded("codex") if "user-prompt" in item[0]]
    first = run_hook("codex", placed(prompt, repo), env)
    assert first.code == 0 and "is not a socket" in first.stderr, first
    line = user_line(first)
    assert line.startswith("snapshotd: the checkpoint 'before: Add a CHANGES file") and "snapshotd doctor" in line, first
    second = run_hook("codex", placed(prompt, repo), env)
    assert second.code == 0 and "is not a socket" in second.stderr and second.stdout == "", second  # told already


def test_a_failure_in_the_background_is_shown_at_the_next_hook(tmp_path: Path, repo: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    (folder / "s.sock").write_text("not a socket")
    env = child_env(folder / "s.sock")  # an "after" hands its checkpoint off and says nothing
    [(_, stop)] = [item for item in recorded("claude-code") if "stop" in item[0]]
    first = run_hook("claude-code", placed(stop, repo), env)
    assert (first.code, first.stdout, first.stderr) == (0, "", ""), first
    wait_until(lambda: "is not a socket" in (run_hook("claude-code", placed(stop, repo), env).stdout), 60, "the earlier failure told")


@pytest.mark.parametrize("entry", ["program", "command line"])
def test_a_home_other_users_may_use_fails_the_hook_in_one_line_not_the_agent(
    repo: Path, tmp_path: Path, entry: str
) -> None:
    home = tmp_path / "open-home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    [(_, payload)] = [item for item in recorded("claude-code") if "user-prompt-submit" in item[0]]
    run = run_hook("claude-code", placed(payload, repo), child_env(SNAPSHOTD_HOME=str(home)), repo, cli=entry == "command line")
    assert run.code == 0, run.stderr
    assert "Traceback" not in run.stderr
    told = json.loads(run.stdout)["systemMessage"]
    assert "was not recorded: snapshotd will not use its home" in told and f"chmod 700 {home}" in told
    assert not (home / "hooks").exists()
