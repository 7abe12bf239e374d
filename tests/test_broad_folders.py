"""A home folder, ``/`` and the folders around them are opened by no command unasked.

Any method that takes a ``path`` would open the worktree there, watching and
scanning everything under it (``diff`` in ``$HOME`` copied gigabytes into the
data folder). A read (``list``, ``verify``, ``diff``, ``gc``) in a folder outside
git never recorded finds no worktree there and opens nothing; ``open`` and
``checkpoint`` there are refused with ``needs_force`` before anything is
opened, and asked at a terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import assert_one_error_line, child_env, cli_process

from snapshotd.engine.core import Engine
from snapshotd.errors import NeedsForce, NotFound

CALLS = [
    ("list", {}),
    ("open", {}),
    ("verify", {}),
    ("diff", {"from": "worktree", "to": "worktree"}),
    ("gc", {"dry_run": True}),
]
NO_WORKTREE = r"is in no worktree: it is not in a git repository"


def data_home() -> Path:
    return Path(os.environ["SNAPSHOTD_HOME"])


@pytest.mark.parametrize(("method", "params"), CALLS, ids=[name for name, _ in CALLS])
async def test_every_command_refuses_a_home_folder_never_recorded(engine: Engine, method: str, params: dict) -> None:
    home = Path(os.environ["HOME"])
    (home / "notes.txt").write_text("mine\n")
    refusal = (NeedsForce, r"home folder and holds no checkpoints.*force") if method == "open" else (NotFound, NO_WORKTREE)
    with pytest.raises(refusal[0], match=refusal[1]):
        await engine.call(method, {"path": str(home), **params})
    assert not (data_home() / "repos").exists()  # nothing opened, nothing copied
    assert engine.worktrees == {}


async def test_a_folder_above_the_home_folder_is_refused_and_a_recorded_home_is_not(engine: Engine) -> None:
    home = Path(os.environ["HOME"])
    with pytest.raises(NeedsForce, match="above your home folder"):
        await engine.call("open", {"path": str(home.parent)})
    with pytest.raises(NeedsForce, match="root of the file system"):
        await engine.call("open", {"path": "/"})
    for folder in (home.parent, "/"):
        with pytest.raises(NotFound, match=NO_WORKTREE):
            await engine.call("list", {"path": str(folder)})
    await engine.call("checkpoint", {"path": str(home), "force": True})
    listed = await engine.call("list", {"path": str(home)})  # asked for once: known from then on
    assert len(listed["checkpoints"]) == 1
    (home / "projects" / "notes").mkdir(parents=True)  # a forced home holds only itself
    with pytest.raises(NotFound, match=NO_WORKTREE):
        await engine.call("list", {"path": str(home / "projects" / "notes")})


def test_the_command_line_refuses_open_in_home_without_a_terminal_and_asks_at_one() -> None:
    home = Path(os.environ["HOME"])
    env = child_env()
    refused = cli_process("--embedded", "open", str(home), env=env, code=1)
    assert_one_error_line(refused, "home folder", "force")
    assert_one_error_line(cli_process("--embedded", "list", str(home), env=env, code=1), "in no worktree")
    main, secondary = os.openpty()
    try:
        asked = subprocess.Popen(
            [sys.executable, "-m", "snapshotd", "--embedded", "open", "--json", str(home)],
            stdin=secondary, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
        )
        os.write(main, b"y\n")
        out, err = asked.communicate(timeout=60)
    finally:
        os.close(main)
        os.close(secondary)
    assert asked.returncode == 0, err
    assert "Go ahead anyway?" in err and f'"path": "{home}"' in out
