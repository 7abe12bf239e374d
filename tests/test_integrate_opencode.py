"""``snapshotd integrate opencode``: snapshotd's plug-in file in OpenCode's plug-in folders, and ``doctor opencode``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import assert_one_error_line, cli
from repo_helpers import init_repo

from snapshotd.agents.opencode import MARK, NODE_CLIENT


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """OpenCode's config folder of a user whose ~/.config/opencode already holds OpenCode's own files."""
    folder = tmp_path / "xdg" / "opencode"
    folder.mkdir(parents=True)
    (folder / "opencode.json").write_text('{"theme": "dark"}\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return folder


def test_user_plugin_imports_the_node_client_and_snapshotd_by_absolute_path(config: Path, tmp_path: Path) -> None:
    said = cli("integrate", "opencode", "--events", "tools", cwd=tmp_path).stdout
    plugin = config / "plugins" / "snapshotd.js"
    assert said.strip() == (f"installed snapshotd's OpenCode plug-in at {plugin}; it checkpoints before each prompt, "
                            "before and after each bash, edit, write and apply_patch, and after each turn")
    text = plugin.read_text()
    assert text.startswith(MARK) and NODE_CLIENT.as_uri() in text and f'"{sys.executable}", "-m", "snapshotd"' in text
    # Node loads it as OpenCode would, and it exports one plug-in function
    loaded = subprocess.run(["node", "--input-type=module", "-e", f"const m = await import({str(plugin.as_uri())!r}); console.log(Object.keys(m).join(), typeof m.SnapshotdPlugin)"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert loaded.stdout.strip() == "SnapshotdPlugin function", loaded.stderr

    assert cli("integrate", "opencode", "--events", "tools", cwd=tmp_path).stdout.strip() == f"{plugin}: already as wanted"
    switched = cli("integrate", "opencode", cwd=tmp_path).stdout
    assert switched.startswith(f"snapshotd's OpenCode plug-in at {plugin} now takes --events turns (was tools)"), switched
    assert '"events": "turns"' in plugin.read_text()

    removed = cli("integrate", "opencode", "--remove", cwd=tmp_path).stdout
    assert removed.strip() == f"removed snapshotd's OpenCode plug-in {plugin}"
    assert sorted(p.name for p in config.iterdir()) == ["opencode.json"]  # the plugins folder it made went; OpenCode's file stays


def test_project_plugin_goes_to_dot_opencode_and_remove_leaves_what_opencode_put_there(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    (repo / "sub").mkdir()
    cli("integrate", "opencode", "--project", cwd=repo / "sub")
    plugin = repo / ".opencode" / "plugins" / "snapshotd.js"
    assert plugin.read_text().startswith(MARK)
    (repo / ".opencode" / "package.json").write_text("{}\n")  # as OpenCode writes there on its start
    cli("integrate", "opencode", "--project", "--remove", cwd=repo)
    assert sorted(p.name for p in (repo / ".opencode").iterdir()) == ["package.json"]
    cli("integrate", "opencode", "--project", cwd=repo)
    (repo / ".opencode" / "package.json").unlink()
    cli("integrate", "opencode", "--project", "--remove", cwd=repo)
    assert not (repo / ".opencode").exists()  # nothing else was in it


def test_a_plugin_file_of_someone_else_is_never_replaced_or_removed(config: Path, tmp_path: Path) -> None:
    theirs = config / "plugins" / "snapshotd.js"
    theirs.parent.mkdir()
    theirs.write_text("export const Mine = async () => ({});\n")
    for args in ((), ("--remove",)):
        result = cli("integrate", "opencode", *args, cwd=tmp_path, code=1)
        assert_one_error_line(result, "is not snapshotd's plug-in")
        assert theirs.read_text() == "export const Mine = async () => ({});\n"


def test_a_linked_dot_opencode_folder_in_a_project_is_refused(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "plugins").mkdir(parents=True)
    (repo / ".opencode").symlink_to(elsewhere)
    result = cli("integrate", "opencode", "--project", cwd=repo, code=1)
    assert_one_error_line(result, "is a symlink")
    assert list((elsewhere / "plugins").iterdir()) == []


def test_local_scope_is_claude_codes_only(config: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    assert_one_error_line(cli("integrate", "opencode", "--local", cwd=repo, code=1), "Only Claude Code has local settings")


def test_doctor_finds_the_plugin_and_what_it_imports(config: Path, tmp_path: Path) -> None:
    env = {"SNAPSHOTD_SOCKET": str(tmp_path / "none" / "s.sock")}
    checks = {c["check"]: c for c in cli("doctor", "opencode", "--json", cwd=tmp_path, env=env, code=None).json()["checks"]}
    assert not checks["opencode plug-in"]["ok"] and "snapshotd integrate opencode" in checks["opencode plug-in"]["fix"]
    cli("integrate", "opencode", "--events", "tools", cwd=tmp_path)
    plugin = config / "plugins" / "snapshotd.js"
    checks = {c["check"]: c for c in cli("doctor", "--json", cwd=tmp_path, env=env, code=None).json()["checks"]}
    assert checks["opencode plug-in"]["ok"] and checks["opencode plug-in"]["detail"] == f"{plugin}: --events tools"
    assert "claude-code hooks" not in checks  # only what is installed is checked
    plugin.write_text(plugin.read_text().replace(sys.executable, "/gone/python"))
    checks = {c["check"]: c for c in cli("doctor", "opencode", "--json", cwd=tmp_path, env=env, code=None).json()["checks"]}
    assert not checks["opencode plug-in"]["ok"] and "/gone/python no longer exists" in checks["opencode plug-in"]["detail"]
    assert os.path.exists(NODE_CLIENT)
