"""One agent process running many sessions (an agent server, Codex's app server) starts all their hooks.

A hook waits for the agent's earlier hooks only until they have taken their
place in their own session's order: a "before" of one session never waits for
another session's checkpoint, and the sessions' hooks do not poll one another
into a CPU storm. Within one session the order still holds. Real processes,
children of this test process as a fleet's hooks are of their agent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from daemon_helpers import child_env, wait_until

from snapshotd.agents import hooks
from snapshotd.errors import SnapshotdError

# A stand-in for a hook process: its command line names the hook program, as the agent's hooks do.
_HOOK = textwrap.dedent(
    """
    import sys, time
    from snapshotd.agents.hookorder import Spawn
    from snapshotd.agents.hookstate import Turn
    session, hold, wait = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    turn = Turn(session, Spawn())
    print("placed", flush=True)
    started = time.monotonic()
    waited = turn.wait(started + wait) if wait else True
    print(f"{'ran' if waited else 'gave up'} {time.monotonic() - started:.2f}", flush=True)
    time.sleep(hold)
    turn.release()
    """
)


def _hook(session: str, env: dict[str, str], *, hold: float = 0.0, wait: float = 0.0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _HOOK, session, str(hold), str(wait), "hookentry.py"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return child_env(SNAPSHOTD_HOME=str(home))


def test_a_hook_of_another_session_does_not_wait_for_an_earlier_hooks_checkpoint(tmp_path: Path) -> None:
    env = _env(tmp_path)
    earlier = _hook("session-a", env, hold=30)  # a "before" waiting for its slow checkpoint
    try:
        assert earlier.stdout is not None and earlier.stdout.readline() == "placed\n"
        later = _hook("session-b", env, wait=10)
        out, _ = later.communicate(timeout=60)
        assert earlier.poll() is None, "the earlier hook was to be still running"
        line = out.splitlines()[1]
        assert line.startswith("ran ") and float(line.split()[-1]) < 5, out
    finally:
        earlier.kill()
        earlier.communicate()


def test_a_hook_of_the_same_session_still_waits_for_the_earlier_one(tmp_path: Path) -> None:
    env = _env(tmp_path)
    earlier = _hook("session-a", env, hold=30)
    try:
        assert earlier.stdout is not None and earlier.stdout.readline() == "placed\n"
        later = _hook("session-a", env, wait=1)
        out, _ = later.communicate(timeout=60)
        assert earlier.poll() is None
        assert out.splitlines()[1].startswith("gave up "), out
    finally:
        earlier.kill()
        earlier.communicate()


def test_hooks_waiting_on_a_slow_earlier_hook_of_their_agent_use_little_cpu(tmp_path: Path) -> None:
    """Forty hooks of one session wait behind a first one that holds its place for 12 s: each looks at the
    one process or marker before it now and then, not at every process of the agent every few milliseconds."""
    env = _env(tmp_path)
    first = _hook("session-a", env, hold=12)
    assert first.stdout is not None and first.stdout.readline() == "placed\n"
    waiting = [_hook("session-a", env, wait=60) for _ in range(40)]
    for hook in waiting:  # past their start-up: each has taken its place and waits
        assert hook.stdout is not None and hook.stdout.readline() == "placed\n"
    time.sleep(0.5)
    assert first.poll() is None, "the first hook was to hold its place while the others were measured"
    cpu = sum(_cpu_seconds(hook.pid) for hook in waiting)
    time.sleep(2)
    cpu = sum(_cpu_seconds(hook.pid) for hook in waiting) - cpu
    outs = [hook.communicate(timeout=120)[0] for hook in waiting]
    first.communicate(timeout=60)
    assert all(out.startswith("ran ") for out in outs), outs
    assert cpu < 0.5, f"forty waiting hooks used {cpu:.2f} s of CPU in 2 s"


def test_a_checkpoint_child_that_detaches_late_is_read_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a starved machine the child may take longer than DETACH_WAIT_S to leave the agent's pipes: its
    marker is then not read as its report ("+ok"), and the hook still returns within its budget."""
    detach = hooks._detach

    def late_detach() -> None:
        time.sleep(0.6)
        detach()

    monkeypatch.setattr(hooks, "DETACH_WAIT_S", 0.2)
    monkeypatch.setattr(hooks, "_detach", late_detach)
    assert hooks.within_budget(lambda: None, 3.0) is None
    assert hooks.within_budget(_fail, 3.0) == "the checkpoint failed here"
    started = time.monotonic()
    assert hooks.within_budget(lambda: time.sleep(8), 1.0) == hooks.still_running(1.0)
    assert time.monotonic() - started < 4


def _fail() -> None:
    raise SnapshotdError("the checkpoint failed here")


def test_a_checkpoint_child_past_its_limit_says_so_and_records_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The child's alarm ends a checkpoint that outlives CHILD_LIMIT_S with a note the hook's record keeps
    (``doctor`` reads it), not by killing it silently."""
    monkeypatch.setattr(hooks, "CHILD_LIMIT_S", 1)
    kept = tmp_path / "note"

    def done(note: str | None) -> None:
        kept.write_text(str(note))

    note = hooks.within_budget(lambda: time.sleep(5), 4.0, done=done)
    assert note == "TimeoutError: the checkpoint did not finish within 1 s"
    wait_until(kept.exists, 10, "the child's record of its note")
    assert kept.read_text() == note
