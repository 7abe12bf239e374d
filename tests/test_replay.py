"""Real histories replayed against a real daemon: every capture and restore equals git.

The histories are consecutive releases of real projects, taken from their PyPI
sdists (one commit per release), so CI can build them with nothing but PyPI.
Downloads and histories are kept in ``$SNAPSHOTD_REPLAY_CACHE`` (default
``~/.cache/snapshotd-replay`` of the real user), so reruns download nothing.
"""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.replay import Options, replay
from bench.trees import release_history

# Read at import, before the tests' isolated HOME is set.
CACHE = Path(
    os.environ.get("SNAPSHOTD_REPLAY_CACHE")
    or os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".cache", "snapshotd-replay")
)

HISTORIES = {
    "click": ["8.1.0", "8.1.1", "8.1.2", "8.1.3", "8.1.4", "8.1.5", "8.1.6", "8.1.7"],
    "requests": ["2.31.0", "2.32.0", "2.32.1", "2.32.2", "2.32.3"],
    "jinja2": ["3.1.0", "3.1.1", "3.1.2", "3.1.3", "3.1.4"],
}


def history(project: str) -> Path:
    """The project's release history, built once; the test is skipped when PyPI cannot be reached."""
    try:
        return release_history(project, HISTORIES[project], CACHE, log=False)
    except RuntimeError as exc:
        pytest.skip(f"the {project} sdists could not be downloaded from PyPI: {exc}")


@pytest.mark.slow
@pytest.mark.parametrize("move", ["reset", "merge"])
@pytest.mark.parametrize("project", sorted(HISTORIES))
def test_release_history_replays_equal_to_git(tmp_path: Path, project: str, move: str) -> None:
    """Each release is one turn; warm and exact captures, and restores of earlier turns, equal git."""
    repo = history(project)
    turns = len(HISTORIES[project]) - 1
    summary = replay(Options(repo=str(repo), start=f"HEAD~{turns}", turns=turns, move=move,
                             exact_every=1, restores=turns, work=str(tmp_path)))
    assert summary.turns == turns
    assert summary.warm_captures == turns + 1 + summary.restores
    assert summary.exact_captures == turns + 1
    assert summary.restores == turns
    assert summary.verify_diffs == 0, summary.line()
    assert summary.differences == [], summary.line()
