"""``integrate --project`` in a project someone else prepared: nothing of the user's leaves through a link.

The project is a shared worktree (a folder its group may write, as in
``/srv/shared``), and another user (uid 65534, :mod:`test_other_users`)
planted links in it to the user's credentials, or settings files made to
exhaust the command: each is refused with one sentence, and nothing is read
through the link or written outside the project.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import assert_one_error_line, child_env, cli_process
from repo_helpers import init_repo, write
from test_other_users import OTHER_UID

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")

SECRET = '{"auths": {"registry.example": {"auth": "c2VjcmV0OnNlY3JldA=="}}}\n'


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A repository in a folder the other user's group may write to."""
    shared = tmp_path / "srv"
    shared.mkdir()
    os.chown(shared, 0, OTHER_UID)
    shared.chmod(0o2775)
    repo = init_repo(shared / "project", ("a.txt", "a\n"))
    os.chown(repo, 0, OTHER_UID)
    repo.chmod(0o2775)
    return repo


def planted_link(link: Path, target: Path) -> None:
    link.symlink_to(target)
    os.lchown(link, OTHER_UID, OTHER_UID)


def project_files(repo: Path) -> dict[str, str]:
    return {
        str(p.relative_to(repo)): p.read_text(errors="replace")
        for p in repo.rglob("*")
        if ".git" not in p.relative_to(repo).parts and p.is_file() and not p.is_symlink()
    }


def test_a_settings_file_linked_to_the_users_credentials_is_refused(project: Path) -> None:
    docker = write(Path(os.environ["HOME"]) / ".docker" / "config.json", SECRET, mode=0o600)
    (project / ".claude").mkdir()
    planted_link(project / ".claude" / "settings.json", docker)
    result = cli_process("integrate", "claude-code", "--project", cwd=project, code=None)
    assert_one_error_line(result, str(project / ".claude" / "settings.json"), "symlink")
    assert (project / ".claude" / "settings.json").is_symlink()
    assert docker.read_text() == SECRET
    assert not any("c2VjcmV0" in text for text in project_files(project).values())


def test_a_settings_folder_linked_out_of_the_project_gets_nothing_written(project: Path) -> None:
    ssh = Path(os.environ["HOME"]) / ".ssh"
    write(ssh / "id_ed25519", "PRIVATE KEY\n", mode=0o600)
    planted_link(project / ".codex", ssh)
    result = cli_process("integrate", "codex", "--project", cwd=project, code=None)
    assert_one_error_line(result, str(project / ".codex"), "symlink")
    assert sorted(os.listdir(ssh)) == ["id_ed25519"], "a file was written into ~/.ssh"


def test_deeply_nested_settings_are_one_error_not_a_traceback(project: Path) -> None:
    depth = 100_000
    write(project / ".claude" / "settings.json", "[" * depth + "]" * depth)
    result = cli_process("integrate", "claude-code", "--project", cwd=project, code=None)
    assert_one_error_line(result, "nested deeper than")


def test_a_huge_settings_file_is_refused_before_it_is_read(project: Path) -> None:
    huge = project / ".claude" / "settings.json"
    huge.parent.mkdir()
    with open(huge, "wb") as handle:
        handle.truncate(176 * 1024 * 1024)  # sparse: costs no disk
    os.lchown(huge, OTHER_UID, OTHER_UID)
    # The child's own peak, read by itself as it exits: a fork's ru_maxrss also counts the
    # parent's memory before exec, which grows with the test run around it.
    peak_file = project.parent / "peak"
    report_peak = (
        "import atexit, runpy, sys\n"
        "report = sys.argv[1]\n"
        "def peak():\n"
        "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
        "    open(report, 'w').write(hwm)\n"
        "atexit.register(peak)\n"
        "sys.argv = ['snapshotd', *sys.argv[2:]]\n"
        "runpy.run_module('snapshotd', run_name='__main__', alter_sys=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", report_peak, str(peak_file), "integrate", "claude-code", "--project"],
        cwd=project, env=child_env(), capture_output=True, text=True,
    )
    assert result.returncode == 1, result.stderr
    assert "larger than 1 MiB" in result.stderr, result.stderr
    assert peak_file.exists(), result.stderr
    peak_kib = int(peak_file.read_text())
    assert peak_kib < 150 * 1024, f"peak RSS {peak_kib // 1024} MiB"
