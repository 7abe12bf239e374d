"""``scripts/demo``: the README's first command works in ``$TMPDIR`` and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _demo(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSHOTD_")} | {"TMPDIR": str(tmp)}
    return subprocess.run(
        [str(ROOT / "scripts" / "demo"), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_demo_runs_in_tmpdir_and_removes_its_folder(tmp_path: Path) -> None:
    tmp = tmp_path / "t"
    tmp.mkdir()
    run = _demo(tmp)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "summary" in run.stdout and f"the demo folder {tmp}/snapshotd-demo." in run.stdout
    assert list(tmp.iterdir()) == []
    kept = _demo(tmp, "--keep")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    (folder,) = tmp.iterdir()
    assert folder.name.startswith("snapshotd-demo.") and (folder / "project" / "turn2.txt").is_file()


def test_a_long_tmpdir_still_works_and_leaves_nothing(tmp_path: Path) -> None:
    """A ``$TMPDIR`` too long for a socket path: the demo's socket goes elsewhere, and is removed too."""
    tmp = tmp_path / ("long-" * 20)
    tmp.mkdir()
    run = _demo(tmp)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"the demo folder {tmp}/snapshotd-demo." in run.stdout
    assert list(tmp.iterdir()) == []
