"""``snapshotd log`` and ``--turn N``: the turns Claude Code's recorded hooks make, seen and taken back.

Every checkpoint comes from a real ``snapshotd hook claude-code`` process fed
a recorded payload, against a real daemon; git's own diff of the same two
checkpoints is the oracle for what a turn changed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from daemon_helpers import Daemon, child_env, cli
from hook_helpers import claude_hook, recorded_claude_turn, run_hook
from repo_helpers import git, git_bytes, init_repo, write

from snapshotd.cli.turns import age

SESSION = "2f6a9c1e-8b4d-4e0f-9a37-5c1d2e3f4a5b"  # the recorded session's id


@pytest.fixture
def env(sock: Path) -> dict[str, str]:
    return child_env(sock, SNAPSHOTD_HOOK_BUDGET="60")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(tmp_path / "project", ("a.txt", "alpha\n"))


def two_turns_and_an_open_one(repo: Path, env: dict[str, str]) -> None:
    """Turn 1 as recorded (CHANGES added, a.txt edited); turn 2 adds notes.txt; turn 3 has only its prompt."""
    recorded_claude_turn(repo, env)
    claude_hook(repo, env, "1-user-prompt-submit.json", prompt="Write notes\nwith two lines\n")
    write(repo / "notes.txt", "one\ntwo\nthree\n")
    claude_hook(repo, env, "4-post-tool-use-edit.json")
    claude_hook(repo, env, "5-stop.json")
    claude_hook(repo, env, "1-user-prompt-submit.json", prompt="Now tidy up")


def test_log_lists_turns_from_real_hook_payloads(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    two_turns_and_an_open_one(repo, env)
    turns = cli("log", "--json", str(repo), env=env).json()["turns"]
    assert [(t["turn"], t["prompt"], t["open"]) for t in turns] == [
        (3, "Now tidy up", True),
        (2, "Write notes", False),
        (1, "Add a CHANGES file and fix the greeting in a.txt", False),
    ]
    first = turns[2]
    assert (first["start_seq"], first["end_seq"], first["session"]) == (1, 5, SESSION)
    assert git(repo, "diff", "--numstat", first["start"], first["end"]).splitlines() == ["1\t0\tCHANGES", "1\t1\ta.txt"]
    assert (first["files"], first["additions"], first["deletions"]) == (2, 2, 1)
    assert (turns[1]["files"], turns[1]["additions"], turns[1]["deletions"]) == (1, 3, 0)

    lines = cli("log", str(repo), env=env).stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("turn 3") and lines[0].endswith("Now tidy up (open)")
    assert lines[1].split()[:6] == ["turn", "2", "#6..#8", "1", "file", "+3"] and lines[1].endswith("Write notes")
    assert lines[2].split()[:6] == ["turn", "1", "#1..#5", "2", "files", "+2"]
    assert cli("log", "--limit", "1", "--json", str(repo), env=env).json()["turns"][0]["turn"] == 3
    assert cli("log", "--session", "other", str(repo), env=env).stdout.startswith("no agent turns")


def test_log_of_several_sessions_names_each_session_whole(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    other = "9c0d1e2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f"
    recorded_claude_turn(repo, env)
    claude_hook(repo, env, "1-user-prompt-submit.json", prompt="Another agent's turn", session_id=other)
    lines = cli("log", str(repo), env=env).stdout.splitlines()
    assert [line.split()[0] for line in lines] == [other, SESSION]  # each whole, as --session takes it
    assert lines[0].index("turn") == lines[1].index("turn")  # in one column
    assert cli("log", "--session", lines[0].split()[0], "--json", str(repo), env=env).json()["turns"][0]["prompt"] == (
        "Another agent's turn"
    )

def test_diff_and_revert_of_a_turn_by_number(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    two_turns_and_an_open_one(repo, env)
    first = cli("log", "--json", str(repo), env=env).json()["turns"][2]
    names = cli("diff", "--turn", "1", cwd=repo, env=env).stdout.splitlines()
    assert names == ["A  CHANGES", "M  a.txt"]
    assert git(repo, "diff", "--name-status", first["start"], first["end"]).splitlines() == ["A\tCHANGES", "M\ta.txt"]
    stat = cli("diff", "--turn", "1", "--session", SESSION, "--stat", cwd=repo, env=env).stdout
    assert stat == git_bytes(repo, "diff", "--stat", first["start"], first["end"]).decode()
    # Taking back turn 2 removes its file and leaves turn 1's work.
    cli("revert", "--turn", "2", "--yes", cwd=repo, env=env)
    assert not (repo / "notes.txt").exists()
    assert (repo / "a.txt").read_text() == "hello\n" and (repo / "CHANGES").exists()
    # Errors: one sentence each, exit 1, nothing changed.
    missing = cli("diff", "--turn", "9", cwd=repo, env=env, code=1)
    assert f"There is no turn 9 in the session {SESSION} (it has 3); `snapshotd log` lists the turns." in missing.stderr
    both = cli("diff", "--turn", "1", "@", cwd=repo, env=env, code=2)  # arguments that do not go together
    assert "--turn names both checkpoints" in both.stderr
    assert "needs FROM" in cli("diff", cwd=repo, env=env, code=2).stderr


def test_show_of_a_turn_by_number(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    two_turns_and_an_open_one(repo, env)
    first = cli("log", "--json", str(repo), env=env).json()["turns"][2]
    shown = cli("show", "--turn", "1", cwd=repo, env=env).stdout.splitlines()
    assert shown[0] == "turn 1: Add a CHANGES file and fix the greeting in a.txt"
    assert shown[1] == f"Spans:     #1..#5 of session {SESSION}"
    assert shown[2] == f"checkpoint {first['end']}"
    assert shown[-2:] == ["A  CHANGES", "M  a.txt"]  # the whole turn, as git diff START END has it
    patched = cli("show", "--turn", "1", "--patch", cwd=repo, env=env).stdout
    assert "+hello" in patched and "diff --git a/CHANGES b/CHANGES" in patched
    as_json = cli("show", "--turn", "2", "--json", cwd=repo, env=env).json()
    assert as_json["turn"]["prompt"] == "Write notes" and as_json["checkpoint"]["id"] == as_json["turn"]["end"]
    assert "--turn names both checkpoints" in cli("show", "@", "--turn", "1", cwd=repo, env=env, code=2).stderr
    assert "There is no turn 9" in cli("show", "--turn", "9", cwd=repo, env=env, code=1).stderr
    assert "show needs CHECKPOINT" in cli("show", cwd=repo, env=env, code=2).stderr


def test_no_turns_says_how_they_are_made(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    cli("checkpoint", "-m", "by hand", str(repo), env=env)
    assert "snapshotd integrate" in cli("log", str(repo), env=env).stdout
    assert "no agent turns" in cli("diff", "--turn", "1", cwd=repo, env=env, code=1).stderr


def test_age_as_people_say_it() -> None:
    assert age("2026-01-01T00:00:00Z", now=1767225600 + 30) == "just now"
    assert age("2026-01-01T00:00:00Z", now=1767225600 + 60) == "1 minute ago"
    assert age("2026-01-01T00:00:00Z", now=1767225600 + 7200) == "2 hours ago"
    assert age("2026-01-01T00:00:00.123Z", now=1767225600 + 86400 * 3) == "3 days ago"


def test_a_turn_no_stop_ended_is_closed_at_the_next_prompt(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    # The user pressed Esc during the first turn: Claude Code sends no Stop for it.
    claude_hook(repo, env, "1-user-prompt-submit.json", prompt="First")
    write(repo / "a.txt", "edited before Esc\n")
    claude_hook(repo, env, "1-user-prompt-submit.json", prompt="Second")
    write(repo / "b.txt", "second turn\n")
    claude_hook(repo, env, "5-stop.json")

    listed = cli("list", "--json", "--session", SESSION, str(repo), env=env).json()["checkpoints"][::-1]
    assert [cp["label"] for cp in listed] == ["before: First", "after turn (interrupted)", "before: Second", "after turn"]
    assert listed[1]["tree"] == listed[2]["tree"]  # the first turn's work ends where the second begins
    turns = cli("log", "--json", str(repo), env=env).json()["turns"]
    assert [(t["turn"], t["prompt"], t["open"], t["files"]) for t in turns] == [(2, "Second", False, 1), (1, "First", False, 1)]
    cli("revert", "--turn", "1", "--yes", cwd=repo, env=env)
    assert (repo / "a.txt").read_text() == "alpha\n" and (repo / "b.txt").read_text() == "second turn\n"


def test_a_resumed_session_closes_the_turn_its_killed_agent_left(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    claude_hook(repo, env, "1-user-prompt-submit.json", prompt="First")
    write(repo / "a.txt", "edited, then the agent was killed\n")
    start = {"hook_event_name": "SessionStart", "session_id": SESSION, "cwd": str(repo), "source": "resume"}
    run = run_hook("claude-code", json.dumps(start).encode(), env)
    assert (run.code, run.stdout, run.stderr) == (0, "", ""), run
    listed = cli("list", "--json", "--session", SESSION, str(repo), env=env).json()["checkpoints"][::-1]
    assert [cp["label"] for cp in listed] == ["before: First", "after turn (interrupted)", "session start (resume)"]
    claude_hook(repo, env, "1-user-prompt-submit.json", prompt="Second")  # nothing left open: no second close
    assert len(cli("list", "--json", "--session", SESSION, str(repo), env=env).json()["checkpoints"]) == 4


def test_a_turn_ends_at_its_after_turn_for_log_and_mcp_alike() -> None:
    from snapshotd.turns import find_turns, turn_end

    labels = ["before: one", "after Write", "after turn", "session start (resume)", "by hand", "before: two", "after Edit"]
    cps = [{"id": f"c{seq}", "seq": seq, "session": "s", "label": label, "created_at": f"2026-12-07T00:00:0{seq}Z"}
           for seq, label in enumerate(labels, start=1)]
    first, second = cps[0], cps[5]
    # The user's own edit after the turn (the resume's checkpoint, one by hand) is not the turn's.
    assert turn_end(cps[::-1], first)["id"] == "c3"
    assert turn_end(cps, second)["id"] == "c7"  # open: up to the last checkpoint there is
    by_start = {turn.start: turn.end for turn in find_turns(cps)}
    assert by_start == {"c1": "c3", "c6": "c7"}
