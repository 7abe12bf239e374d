"""The Node client talks only to this user's daemon, however another user swaps the socket's folder.

Two users: the tests run as root (the victim), the attacker is uid 65534
through ``setpriv`` (the helpers of :mod:`test_other_users`). The attacker
listens in a folder of its own with a program that answers every request
"saved", and swaps the victim's socket folder for it (or for a symlink to
either) in a loop while the victim's Node client connects and pings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from daemon_helpers import running_daemon
from test_other_users import DROP, OTHER_UID, fake_daemon, received

NODE = shutil.which("node")
ATTEMPTS = Path(__file__).resolve().parent / "node_attempts.mjs"
TRIES = 150

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user"),
    pytest.mark.skipif(NODE is None, reason="node is not installed; the Node client's tests need it"),
]

FLIPPER = r"""
import os, sys, time
mode, parent = sys.argv[1], sys.argv[2]
run, mine, hidden = (os.path.join(parent, name) for name in ("run", "attacker", "hidden"))
targets = [os.path.join(parent, "victim"), mine]
n = 0
while True:
    n += 1
    if mode == "links":
        tmp = os.path.join(parent, "link.tmp")
        os.symlink(targets[n % 2], tmp)
        os.replace(tmp, run)
    else:
        # The victim's own folder out, the attacker's in, and back.
        os.rename(run, hidden)
        os.rename(mine, run)
        time.sleep(0.0005)
        os.rename(run, mine)
        os.rename(hidden, run)
    time.sleep(0.0005)
"""


@pytest.fixture
def parent() -> Iterator[Path]:
    """A folder the attacker may change (world-writable, no sticky bit), as a careless shared runtime folder is."""
    folder = Path(tempfile.mkdtemp(prefix="sdn-"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def flipping(mode: str, parent: Path) -> Iterator[None]:
    proc = subprocess.Popen([*DROP, sys.executable, "-c", FLIPPER, mode, str(parent)], cwd="/")
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def attempts(socket_path: Path) -> list[dict[str, object]]:
    assert NODE is not None
    run = subprocess.run(
        [NODE, str(ATTEMPTS), str(socket_path), str(TRIES)], capture_output=True, text=True, timeout=300, check=True
    )
    return [json.loads(line) for line in run.stdout.splitlines()]


def attacker_listens(parent: Path, record: Path) -> Iterator[None]:
    return fake_daemon(str(parent / "attacker" / "snapshotd.sock"), record)


def test_a_symlinked_socket_folder_flipped_between_two_users_is_never_followed(parent: Path, tmp_path: Path) -> None:
    record = parent / "received"
    victim = running_daemon(parent / "victim" / "snapshotd.sock", tmp_path / "daemon.log")
    with victim, attacker_listens(parent, record), flipping("links", parent):
        outcomes = attempts(parent / "run" / "snapshotd.sock")
    assert received(record) == b"", "a request reached the other user's listener"
    assert len(outcomes) == TRIES
    for outcome in outcomes:
        assert outcome.get("error") in ("UnsafeSocketFolderError", "DaemonUnreachableError"), outcome
        assert "saved" not in outcome


def test_a_socket_folder_swapped_between_two_users_reaches_only_the_users_daemon(parent: Path, tmp_path: Path) -> None:
    record = parent / "received"
    victim = running_daemon(parent / "run" / "snapshotd.sock", tmp_path / "daemon.log")
    with victim as daemon, attacker_listens(parent, record), flipping("folders", parent):
        outcomes = attempts(parent / "run" / "snapshotd.sock")
    assert received(record) == b"", "a request reached the other user's listener"
    answered = [outcome for outcome in outcomes if "pid" in outcome]
    assert answered, outcomes  # the victim's daemon was reached between the swaps
    for outcome in outcomes:
        if "pid" in outcome:
            assert outcome == {"pid": daemon.pid}, outcome
        else:
            assert outcome["error"] in ("UnsafeSocketFolderError", "DaemonUnreachableError"), outcome
            assert f"uid {OTHER_UID}" in str(outcome["message"]) or "No snapshotd" in str(outcome["message"]), outcome
