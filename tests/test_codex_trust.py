"""Codex runs new hook entries only once trusted: ``integrate codex`` records that trust as Codex does, and ``doctor`` checks it.

The hashes below are the ``currentHash`` Codex 0.171's own ``app-server``
reported (``hooks/list``) for these entries; tests/test_agent_clis.py checks
the same against the installed ``codex`` when it is there.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

from daemon_helpers import child_env, cli
from hook_helpers import run_hook

from snapshotd.agents import codextrust
from snapshotd.agents.integrate import hook_command, native_command

COMMAND = "/work/h-agent/.venv/bin/python -m snapshotd hook codex"
CODEX_0_171 = {
    ("SessionStart", None): "sha256:3638c9149a2d85eade60ed06d1f6a20382fd929ada6dcb78f9406619f0c4fa34",
    ("UserPromptSubmit", None): "sha256:38f67f6003e513f5c2f49b20964e6f7c9b6ccc3a7e2b8bf74f8b21b7a4bd3ccd",
    ("Stop", None): "sha256:3d9c53f0108c20d8b3b9157516e9ed918d555f4839dd17bac25e1c98dcf989e5",
    ("PostToolUse", "Bash|apply_patch"): "sha256:f81fe7a5c010d9779427a1fc69b35947f41175b667395cddba5f5314959488fc",
}

THEIRS = """{
  "hooks": {
    "SessionStart": [
      {"matcher": "startup", "hooks": [{"type": "command", "command": "python3 ~/.codex/start.py"}]}
    ]
  }
}
"""
CONFIG = 'model = "gpt-5"\r\n\r\n[hooks.state."/elsewhere/hooks.json:stop:0:0"]\r\ntrusted_hash = "sha256:theirs"\r\n'


def test_the_hash_is_the_one_codex_computes() -> None:
    handler = {"type": "command", "command": COMMAND, "timeout": 60}
    assert {(event, matcher): codextrust.hook_hash(event, matcher, handler) for event, matcher in CODEX_0_171} == CODEX_0_171


def codex_files() -> tuple[Path, Path]:
    home = Path(os.environ["HOME"]) / ".codex"
    home.mkdir()
    return home / "hooks.json", home / "config.toml"


def trusted(config: Path) -> dict[str, str]:
    state = tomllib.loads(config.read_text())["hooks"]["state"]
    return {key: value["trusted_hash"] for key, value in state.items()}


def test_integrate_trusts_exactly_its_entries_and_remove_forgets_them() -> None:
    hooks, config = codex_files()
    hooks.write_text(THEIRS)
    config.write_bytes(CONFIG.encode())

    added = cli("integrate", "codex", "--events", "tools")
    assert "recorded Codex's trust" in added.stdout, added
    handler = {"type": "command", "command": hook_command("codex"), "timeout": 60}
    expected = {
        f"{hooks}:session_start:1:0": codextrust.hook_hash("SessionStart", None, handler),  # after theirs
        # the prompt's is the native entry when it was built (it runs the Python one when the daemon cannot)
        f"{hooks}:user_prompt_submit:0:0": codextrust.hook_hash("UserPromptSubmit", None, {**handler, "command": native_command("codex")}),
        f"{hooks}:stop:0:0": codextrust.hook_hash("Stop", None, handler),
        # the hook after a tool runs in the background: its entry (and so its hash) says async
        f"{hooks}:post_tool_use:0:0": codextrust.hook_hash("PostToolUse", "Bash|apply_patch", {**handler, "async": True}),
    }
    assert trusted(config) == {"/elsewhere/hooks.json:stop:0:0": "sha256:theirs", **expected}
    assert config.read_bytes().startswith(CONFIG.encode()) and b"\n" not in config.read_bytes().replace(b"\r\n", b"")

    assert "already as wanted" in cli("integrate", "codex", "--events", "tools").stdout
    cli("integrate", "codex")  # fewer events: the tool hook's trust goes with it
    assert f"{hooks}:post_tool_use:0:0" not in trusted(config)

    cli("integrate", "codex", "--remove")
    assert config.read_bytes() == CONFIG.encode()


def test_taking_ours_out_says_when_it_moves_a_hook_of_theirs_that_codex_trusted() -> None:
    hooks, config = codex_files()
    cli("integrate", "codex")  # ours is the Stop group at place 0
    settings = json.loads(hooks.read_text())
    theirs = {"type": "command", "command": "touch /tmp/their-stop-ran"}
    settings["hooks"]["Stop"].append({"hooks": [theirs]})  # theirs at place 1, trusted there
    hooks.write_text(json.dumps(settings, indent=2) + "\n")
    with open(config, "a") as out:
        out.write(f'\n[hooks.state."{hooks}:stop:1:0"]\ntrusted_hash = "{codextrust.hook_hash("Stop", None, theirs)}"\n')
    removed = cli("integrate", "codex", "--remove")
    assert "this moves 1 of yours it trusted (Stop); trust them again in Codex's /hooks." in removed.stderr, removed
    assert json.loads(hooks.read_text())["hooks"]["Stop"] == [{"hooks": [theirs]}]  # now at place 0
    assert "already as wanted" not in removed.stdout and "warning" not in cli("integrate", "codex", "--remove").stderr


def test_a_state_written_by_someone_else_is_left_to_codex() -> None:
    hooks, config = codex_files()
    other = f'[hooks.state."{hooks}:user_prompt_submit:0:0"]\nenabled = false\n'
    config.write_text(other)
    result = cli("integrate", "codex")
    assert "start `codex`, type /hooks and trust the snapshotd entries" in result.stderr, result
    assert config.read_text() == other


def test_doctor_finds_untrusted_entries_and_says_the_step() -> None:
    _, config = codex_files()
    cli("integrate", "codex")
    cli("doctor", "codex")  # exits 0: every check passes
    config.write_text("")  # as if trust had never been recorded
    result = cli("doctor", "codex", "--json", code=1)
    [trust] = [c for c in json.loads(result.stdout)["checks"] if c["check"] == "codex trust"]
    assert not trust["ok"] and "UserPromptSubmit (untrusted)" in trust["detail"] and "/hooks" in trust["fix"]


def test_doctor_finds_a_command_found_only_through_path_and_a_failed_hook() -> None:
    settings = Path(os.environ["HOME"]) / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "snapshotd hook claude-code", "timeout": 10}]}]}}))
    assert run_hook("claude-code", b"not json", child_env()).code == 0
    checks = {c["check"]: c for c in cli("doctor", "claude-code", "--json", code=1).json()["checks"]}
    assert not checks["claude-code hooks"]["ok"] and "found only through PATH" in checks["claude-code hooks"]["detail"]
    assert "under 60 s" in checks["claude-code hooks"]["detail"]
    settings.write_text(json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": f"{sys.executable} -m snapshotd hook claude-code", "timeout": 60}]}]}}))
    checks = {c["check"]: c for c in cli("doctor", "claude-code", "--json", code=1).json()["checks"]}
    assert "the command line's `snapshotd hook`" in checks["claude-code hooks"]["detail"], checks
    cli("integrate", "claude-code")  # rewrites the entry with the hook program
    checks = {c["check"]: c for c in cli("doctor", "claude-code", "--json", code=1).json()["checks"]}
    assert checks["claude-code hooks"]["ok"], checks
    assert not checks["claude-code last hook"]["ok"] and "is not JSON" in checks["claude-code last hook"]["detail"]
