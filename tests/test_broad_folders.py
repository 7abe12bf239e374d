"""A home folder, ``/`` and the folders around them are opened by no command unasked.

Any method that takes a ``path`` would open the worktree there, watching and
scanning everything under it (``diff`` in ``$HOME`` copied gigabytes into the
data folder): one never recorded is refused with ``needs_force`` before
anything is opened, as ``checkpoint`` refuses it, and asked at a terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import assert_one_error_line, child_env, cli_process

from snapshotd.engine.core import Engine
from snapshotd.errors import NeedsForce

CALLS = [
    ("list", {}),
    ("open", {}),
    ("verify", {}),
    ("diff", {"from": "worktree", "to": "worktree"}),
    ("gc", {"dry_run": True}),
]


def data_home() -> Path:
    return Path(os.environ["SNAPSHOTD_HOME"])


@pytest.mark.parametrize(("method", "params"), CALLS, ids=[name for name, _ in CALLS])
async def test_every_command_refuses_a_home_folder_never_recorded(engine: Engine, method: str, params: dict) -> None:
    home = Path(os.environ["HOME"])
    (home / "notes.txt").write_text("mine\n")
    with pytest.raises(NeedsForce, match=r"home folder and holds no checkpoints.*force"):
        await engine.call(method, {"path": str(home), **params})
    assert not (data_home() / "repos").exists()  # nothing opened, nothing copied
    assert engine.worktrees == {}


async def test_a_folder_above_the_home_folder_is_refused_and_a_recorded_home_is_not(engine: Engine) -> None:
    home = Path(os.environ["HOME"])
    with pytest.raises(NeedsForce, match="above your home folder"):
        await engine.call("list", {"path": str(home.parent)})
    with pytest.raises(NeedsForce, match="root of the file system"):
        await engine.call("list", {"path": "/"})
    await engine.call("checkpoint", {"path": str(home), "force": True})
    listed = await engine.call("list", {"path": str(home)})  # asked for once: known from then on
    assert len(listed["checkpoints"]) == 1


def test_the_command_line_refuses_list_in_home_without_a_terminal_and_asks_at_one() -> None:
    home = Path(os.environ["HOME"])
    env = child_env()
    refused = cli_process("--embedded", "list", str(home), env=env, code=1)
    assert_one_error_line(refused, "home folder", "force")
    main, secondary = os.openpty()
    try:
        asked = subprocess.Popen(
            [sys.executable, "-m", "snapshotd", "--embedded", "list", "--json", str(home)],
            stdin=secondary, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
        )
        os.write(main, b"y\n")
        out, err = asked.communicate(timeout=60)
    finally:
        os.close(main)
        os.close(secondary)
    assert asked.returncode == 0, err
    assert "Go ahead anyway?" in err and '"checkpoints": []' in out
