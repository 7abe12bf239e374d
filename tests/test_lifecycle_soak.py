"""The lifecycle soak (bench/lifecycle_soak.py), short: worktrees created, edited, moved and deleted
under a running daemon while sessions checkpoint them, the watch limit lowered half way.

The bench runs it for minutes; here 8 worktrees for 15 s. Every bound must hold: no restart, every
capture compared with git equal, every failed request a clear error about its own worktree, ping
always answered, no traceback in the daemon's log, and a stop within seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.lifecycle_soak import parser, run


def test_a_short_lifecycle_soak_holds_every_bound() -> None:
    report = run(parser().parse_args(["--duration", "15", "--worktrees", "8", "--sessions", "3", "--folders", "12"]))
    print(json.dumps(report, indent=1))  # shown in full when an assertion below fails
    assert report["restarts"] == 0, report
    assert report["compared_with_git"] > 10 and report["differences"] == 0, report
    assert report["failed_unclear"] == 0, report
    assert report["ping_failed"] == 0 and report["log_tracebacks"] == 0, report
    assert report["mutations"].get("move", 0) and report["mutations"].get("delete", 0), report
    assert report["stop_s"] < 10, report
    if report["user_namespace"]:
        assert report["watch_limit_lowered_to"] is not None, report
    assert report["ok"], report
