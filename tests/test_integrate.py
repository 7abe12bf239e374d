"""``snapshotd integrate``: hook entries merged into real settings files and taken out byte for byte."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from daemon_helpers import assert_one_error_line, cli, cli_process
from repo_helpers import init_repo

from snapshotd.agents.integrate import EDIT_MATCHERS, HOOK_PROGRAM, hook_command, native_command

# A user's Claude Code settings as people write them: four-space indent, inline
# arrays, their own hooks on the events snapshotd also uses, a trailing newline.
CLAUDE_SETTINGS = """{
    "model": "opus",
    "permissions": {
        "allow": ["Bash(npm run test:*)", "Read(~/.zshrc)"],
        "deny": []
    },
    "hooks": {
        "PostToolUse": [
            {
                "matcher": "Edit|Write",
                "hooks": [
                    { "type": "command", "command": "npx prettier --write \\"$(jq -r .tool_input.file_path)\\"" }
                ]
            }
        ],
        "Stop": [{"hooks": [{"type": "command", "command": "notify-send 'Claude is done'"}]}]
    },
    "env": {"DISABLE_TELEMETRY": "1"}
}
"""

# Codex's hooks.json, two-space indent, no trailing newline, no hooks of ours' events yet.
CODEX_HOOKS = """{
  "hooks": {
    "SessionStart": [
      {
        "matcher": "startup|resume",
        "hooks": [
          {
            "type": "command",
            "command": "python3 ~/.codex/hooks/session_start.py",
            "statusMessage": "Loading context"
          }
        ]
      }
    ]
  }
}"""

COMPACT = '{"theme":"dark","hooks":{"Stop":[{"hooks":[{"type":"command","command":"say done"}]}]}}\n'


def user_file(tool: str) -> Path:
    home = Path(os.environ["HOME"])
    return home / ".claude" / "settings.json" if tool == "claude-code" else home / ".codex" / "hooks.json"


def ours(settings: dict, tool: str) -> dict[str, list[str | None]]:
    """Event -> matchers of the groups that run snapshotd's hook."""
    found: dict[str, list[str | None]] = {}
    for event, groups in settings.get("hooks", {}).items():
        for group in groups:
            if any(h.get("command") in (hook_command(tool), native_command(tool)) for h in group["hooks"]):
                found.setdefault(event, []).append(group.get("matcher"))
    return found


@pytest.mark.parametrize(("tool", "original"), [("claude-code", CLAUDE_SETTINGS), ("codex", CODEX_HOOKS), ("claude-code", COMPACT)], ids=["claude", "codex", "compact"])
def test_add_is_idempotent_and_remove_gives_back_every_byte(tool: str, original: str) -> None:
    path = user_file(tool)
    path.parent.mkdir(parents=True)
    path.write_bytes(original.encode())
    os.chmod(path, 0o600)

    cli("integrate", tool, "--events", "tools")
    added = path.read_bytes()
    settings = json.loads(added)
    turns = {"SessionStart": [None], "UserPromptSubmit": [None], "Stop": [None], **({"StopFailure": [None]} if tool == "claude-code" else {})}
    tools = {"PostToolUse": [EDIT_MATCHERS[tool]], **({"PostToolUseFailure": [EDIT_MATCHERS[tool]], "SubagentStop": [None]} if tool == "claude-code" else {})}
    assert ours(settings, tool) == {**turns, **tools}
    assert {h["timeout"] for groups in settings["hooks"].values() for g in groups for h in g["hooks"] if h.get("command") in (hook_command(tool), native_command(tool))} == {60}
    before = json.loads(original)
    for event, groups in before["hooks"].items():
        assert settings["hooks"][event][: len(groups)] == groups  # theirs first, as they were
    assert {k: v for k, v in settings.items() if k != "hooks"} == {k: v for k, v in before.items() if k != "hooks"}
    assert list(settings) == list(before) + (["hooks"] if "hooks" not in before else [])
    assert os.stat(path).st_mode & 0o777 == 0o600

    again = cli("integrate", tool, "--events", "tools")
    assert "already as wanted" in again.stdout
    assert path.read_bytes() == added

    # Fewer events: the tool hooks go, the turn hooks stay.
    cli("integrate", tool)
    assert ours(json.loads(path.read_bytes()), tool) == turns

    removed = cli("integrate", tool, "--remove")
    assert "removed" in removed.stdout
    assert path.read_bytes() == original.encode()
    assert "already as wanted" in cli("integrate", tool, "--remove").stdout


def test_project_scope_writes_at_the_worktree_root(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("src/a.py", "x = 1\n"))
    cli("integrate", "claude-code", "--project", cwd=repo / "src")
    settings = json.loads((repo / ".claude" / "settings.json").read_text())
    assert set(ours(settings, "claude-code")) == {"SessionStart", "UserPromptSubmit", "Stop", "StopFailure"}
    assert not user_file("claude-code").exists()

    cli("integrate", "codex", "--project", cwd=repo)
    assert set(ours(json.loads((repo / ".codex" / "hooks.json").read_text()), "codex")) == {"SessionStart", "UserPromptSubmit", "Stop"}

    # A file snapshotd created holds nothing of anyone else's; removing leaves an empty object.
    cli("integrate", "claude-code", "--project", "--remove", cwd=repo)
    assert (repo / ".claude" / "settings.json").read_text() == "{}\n"


def test_dry_run_shows_a_diff_and_writes_nothing() -> None:
    path = user_file("codex")
    path.parent.mkdir(parents=True)
    path.write_text(CODEX_HOOKS)
    result = cli("integrate", "codex", "--dry-run")
    assert result.stdout.startswith(f"--- {path}\n+++ {path}\n@@ ")
    added = [line for line in result.stdout.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert any(hook_command("codex") in line for line in added)
    assert not [line for line in result.stdout.splitlines() if line.startswith("-") and not line.startswith("---")][1:]
    assert path.read_text() == CODEX_HOOKS

    as_json = cli("integrate", "codex", "--dry-run", "--json").json()
    assert as_json["changed"] and as_json["dry_run"] and as_json["diff"] == result.stdout
    assert path.read_text() == CODEX_HOOKS


def test_codex_feature_flag_off_is_said(tmp_path: Path) -> None:
    config = Path(os.environ["HOME"]) / ".codex" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('model = "gpt-5.1-codex"\n\n[features]\nhooks = false\n')
    result = cli_process("integrate", "codex")
    assert result.code == 0
    assert "[features] hooks = false" in result.stderr and str(config) in result.stderr
    config.write_text("[features]\nhooks = true\n")
    assert cli_process("integrate", "codex").stderr == ""


def test_a_file_that_is_not_json_is_left_alone() -> None:
    path = user_file("claude-code")
    path.parent.mkdir(parents=True)
    path.write_text('{"model": "opus",}\n')
    line = assert_one_error_line(cli_process("integrate", "claude-code", code=1), str(path), "not valid JSON")
    assert "fix or move it" in line
    assert path.read_text() == '{"model": "opus",}\n'
    # doctor says the same, not "run integrate", which would refuse
    [hooks] = [c for c in cli("doctor", "--json", code=None).json()["checks"] if c["check"] == "claude-code hooks"]
    assert not hooks["ok"] and hooks["detail"].startswith(f"{path} is not valid JSON (")
    assert hooks["fix"] == "fix it or move it away, then run `snapshotd doctor` again"
    path.write_text('{"hooks": []}\n')
    assert_one_error_line(cli_process("integrate", "claude-code", code=1), "'hooks'", "not an object")


def test_the_command_is_absolute_whatever_is_on_path(tmp_path: Path) -> None:
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    program = venv_bin / "snapshotd"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    cli("integrate", "claude-code", env={"PATH": f"{venv_bin}:{os.environ['PATH']}"})
    commands = {h["command"] for groups in json.loads(user_file("claude-code").read_text())["hooks"].values() for g in groups for h in g["hooks"]}
    # This interpreter on the light hook program, both absolute: the agent's shell needs no PATH (the native
    # entry, when it was built, before it for the prompt: absolute too).
    python = f"{sys.executable} -I -S {HOOK_PROGRAM} claude-code"
    assert commands == {python, native_command("claude-code")}
    assert native_command("claude-code").endswith(" " + python)
    assert os.path.isabs(sys.executable) and os.path.isfile(HOOK_PROGRAM)


def test_a_linked_settings_file_is_edited_where_it_lies_with_its_line_endings(tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles" / "settings.json"
    dotfiles.parent.mkdir()
    original = b'{\r\n  "model": "opus"\r\n}\r\n'
    dotfiles.write_bytes(original)
    path = user_file("claude-code")
    path.parent.mkdir()
    path.symlink_to(dotfiles)
    cli("integrate", "claude-code")
    assert path.is_symlink() and os.readlink(path) == str(dotfiles)
    added = dotfiles.read_bytes()
    assert b"snapshotd" in added and b"\n" not in added.replace(b"\r\n", b"")  # every line ends in CRLF
    cli("integrate", "claude-code", "--remove")
    assert path.is_symlink() and dotfiles.read_bytes() == original


def test_remove_deletes_the_file_and_folder_it_created_and_messages_say_what_changed() -> None:
    path = user_file("codex")
    added = cli("integrate", "codex", "--events", "tools")
    assert "added snapshotd's hooks (PostToolUse, SessionStart, Stop, UserPromptSubmit)" in added.stdout
    fewer = cli("integrate", "codex")
    assert "now run at SessionStart, Stop, UserPromptSubmit (removed PostToolUse)" in fewer.stdout, fewer
    removed = cli("integrate", "codex", "--remove")
    assert "the file is removed" in removed.stdout, removed
    assert not path.exists() and not path.parent.exists()  # hooks.json, config.toml and ~/.codex were all snapshotd's


def test_local_scope_writes_claude_codes_settings_local_json(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("src/a.py", "x = 1\n"))
    first = cli("integrate", "claude-code", "--local", cwd=repo / "src")
    # Not ignored by git: checkpoints would hold it, and a restore from before it would remove it.
    assert "warning: git does not ignore .claude/settings.local.json" in first.stderr, first
    (repo / ".git" / "info" / "exclude").write_text("/.claude/settings.local.json\n")
    again = cli("integrate", "claude-code", "--local", "--events", "tools", cwd=repo / "src")
    assert "warning" not in again.stderr, again
    cli("integrate", "claude-code", "--local", cwd=repo / "src")
    settings = json.loads((repo / ".claude" / "settings.local.json").read_text())
    assert set(ours(settings, "claude-code")) == {"SessionStart", "UserPromptSubmit", "Stop", "StopFailure"}
    assert not (repo / ".claude" / "settings.json").exists()
    checks = {c["check"]: c for c in cli("doctor", "claude-code", "--json", cwd=repo, code=None).json()["checks"]}
    assert checks["claude-code hooks"]["ok"] and "settings.local.json" in checks["claude-code hooks"]["detail"]
    refused = cli("integrate", "codex", "--local", cwd=repo, code=1)
    assert "Only Claude Code has local settings" in refused.stderr
