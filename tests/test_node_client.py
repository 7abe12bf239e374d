"""The Node client's own suite (clients/node/test) against a real daemon of this checkout.

Node's test runner runs it; the suite starts ``snapshotd serve`` from this
environment's ``snapshotd`` program (``SNAPSHOTD_BIN``) on temporary repositories.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import child_env

NODE = shutil.which("node")
CLIENT = Path(__file__).resolve().parent.parent / "clients" / "node"
SNAPSHOTD_BIN = Path(sys.executable).with_name("snapshotd")
SUITE_TIMEOUT_S = 600


@pytest.mark.skipif(NODE is None, reason="node is not installed; the Node client's tests need it")
def test_node_client_suite() -> None:
    assert SNAPSHOTD_BIN.exists(), f"{SNAPSHOTD_BIN} is missing; run ./scripts/setup"
    files = sorted(str(path) for path in (CLIENT / "test").glob("*.test.js"))
    assert files, f"no test files in {CLIENT / 'test'}"
    assert NODE is not None
    run = subprocess.run(
        [NODE, "--test", "--test-reporter=tap", *files],
        cwd=CLIENT,
        env=child_env(SNAPSHOTD_BIN=str(SNAPSHOTD_BIN)),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT_S,
    )
    report = run.stdout[-30000:] + run.stderr[-5000:]
    assert run.returncode == 0, report
    counts = {name: int(n) for name, n in re.findall(r"^# (tests|pass|fail|skipped) (\d+)$", run.stdout, re.M)}
    assert counts["fail"] == 0, report
    assert counts["pass"] > 0, report
    assert counts["pass"] + counts["skipped"] == counts["tests"], report
