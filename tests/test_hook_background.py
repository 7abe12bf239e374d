"""Hooks the agent runs in the background (``async``) keep the order in which the agent started them.

This test process plays the agent: it starts each hook as Claude Code does
(``sh -c COMMAND``, the payload on stdin) and does not wait for the ones after
a tool. A background hook that is slow to take its place (its payload arrives
late) still records before the turn's end, which the agent started after it,
and the turn's last hook, which the agent waits for, returns only once the
earlier one has handed its checkpoint off.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from daemon_helpers import Daemon, child_env, cli, wait_until
from hook_helpers import placed, recorded
from repo_helpers import init_repo, write

from snapshotd.agents.integrate import hook_command, wanted_entries

LATE_S = 1.5


def test_a_background_hook_slow_to_start_records_before_the_turns_end(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "project", ("a.txt", "alpha\n"))
    env = child_env(sock)
    payloads = dict(recorded("claude-code"))
    session = payloads["5-stop.json"]["session_id"]
    command = hook_command("claude-code")
    assert wanted_entries("claude-code", "tools")["PostToolUse"]["hooks"][0]["async"] is True

    write(repo / "a.txt", "edited by the tool\n")
    after_tool = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    stop = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    stop.stdin.write(placed(payloads["5-stop.json"], repo))  # type: ignore[union-attr]
    stop.stdin.close()  # type: ignore[union-attr]
    time.sleep(LATE_S)  # the background hook is still starting: its payload comes late
    assert stop.poll() is None, "the turn's end returned while an earlier hook was still starting"
    sent = time.monotonic()
    after_tool.stdin.write(placed(payloads["4-post-tool-use-edit.json"], repo))  # type: ignore[union-attr]
    after_tool.stdin.close()  # type: ignore[union-attr]
    assert stop.wait(60) == 0 and time.monotonic() >= sent
    with stop.stdout, stop.stderr:  # type: ignore[union-attr]
        assert stop.stdout.read() == b"", stop.stderr.read()  # type: ignore[union-attr]
    assert after_tool.wait(60) == 0

    def listed() -> list[str]:
        return [cp["label"] for cp in cli("list", "--json", "--session", session, str(repo), env=env).json()["checkpoints"][::-1]]

    wait_until(lambda: len(listed()) == 2, 60, "both checkpoints")
    assert listed() == ["after Edit: a.txt", "after turn"]
