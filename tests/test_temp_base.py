"""The suite runs wherever ``TMPDIR`` is, even under a git repository or at a long path (see temp_base)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from daemon_helpers import child_env
from repo_helpers import git
from temp_base import repository_above, why_not

ROOT = Path(__file__).resolve().parent.parent


def test_a_folder_under_a_repository_or_at_a_long_path_is_not_taken(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    (repo / "deep" / "er").mkdir(parents=True)
    git(repo, "init", "-q")
    assert repository_above(repo / "deep" / "er") == repo / ".git"
    assert "under a git repository" in (why_not(str(repo / "deep" / "er")) or "")
    bare = tmp_path / "b.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    assert repository_above(bare / "refs") == bare
    long = tmp_path / ("x" * 60)
    long.mkdir()
    assert "too long" in (why_not(str(long)) or "")


def test_the_suite_passes_with_tmpdir_under_a_repository_and_long(tmp_path: Path) -> None:
    """A plain folder's capture and a daemon on its socket, run by pytest itself from such a TMPDIR."""
    above = tmp_path / "gitted"
    above.mkdir()
    git(above, "init", "-q")
    tmpdir = above / ("long" * 20)
    tmpdir.mkdir()
    env = child_env(TMPDIR=str(tmpdir))
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR", "SNAPSHOTD_HOME"):
        env.pop(name, None)
    env["HOME"] = os.environ["HOME"]
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "tests/test_capture_cases.py::test_plain_folder",
            "tests/test_daemon.py::test_serve_listens_privately_answers_ping_and_stops_on_sigterm",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout
    assert list(tmpdir.iterdir()) == []  # nothing was made under it
