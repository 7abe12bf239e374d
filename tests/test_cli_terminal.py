"""Colour and the pager as git decides them: at a terminal only, NO_COLOR, --color, --no-pager.

The pager is a real program (a shell script that keeps what it was given and
the LESS it saw); the terminal is a pseudo-terminal.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import child_env, cli_process
from repo_helpers import init_repo, write
from terminal_helpers import at_a_terminal

ESC = "\x1b["
COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # an SGR sequence; a progress line's erase (ESC [K) is no colour


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A worktree with one checkpoint (embedded, in its own home) and an edit after it."""
    repo = init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))
    cli_process("--embedded", "checkpoint", "-m", "first", cwd=repo, env=embedded_env(tmp_path))
    write(repo / "a.txt", "beta\n")
    return repo


def embedded_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = child_env(SNAPSHOTD_HOME=str(tmp_path / "home"), **extra)
    for name in ("NO_COLOR", "PAGER", "SNAPSHOTD_PAGER", "LESS"):
        env.pop(name, None)
    env.update(extra)
    return env


def fake_pager(tmp_path: Path) -> tuple[str, Path]:
    """A pager that writes what it reads, and the LESS it was given, to files beside it."""
    script = tmp_path / "pager.sh"
    kept = tmp_path / "paged.txt"
    script.write_text(f'#!/bin/sh\necho "$LESS" > {kept}.less\ncat > {kept}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), kept


def test_at_a_terminal_output_goes_through_the_pager_in_colour_when_there_is_one(repo: Path, tmp_path: Path) -> None:
    pager, kept = fake_pager(tmp_path)
    env = embedded_env(tmp_path, SNAPSHOTD_PAGER=pager)
    code, screen = at_a_terminal(["--embedded", "diff", "@", "--patch"], b"", env, repo)
    assert code == 0, screen
    paged = kept.read_text()
    assert "+beta" in paged and f"{ESC}32m+beta" in paged  # coloured: the person sees a terminal
    assert "+beta" not in screen
    assert Path(f"{kept}.less").read_text().strip() == "FRX"
    # A pager that is not installed, cat or an empty one: printed directly.
    for missing in ("no-such-pager-anywhere", "cat", ""):
        code, screen = at_a_terminal(["--embedded", "diff", "@", "--patch"], b"", embedded_env(tmp_path, PAGER=missing), repo)
        assert code == 0 and "+beta" in screen, (missing, screen)
    # A pager quit before it read everything ends the command quietly, as git ends.
    for n in range(2000):
        write(repo / f"f{n:04}.txt", "x\n" * 20)
    code, screen = at_a_terminal(["--embedded", "diff", "@", "--patch"], b"", embedded_env(tmp_path, SNAPSHOTD_PAGER="true"), repo)
    assert "Traceback" not in screen and "rror" not in screen, screen
    assert code in (0, -13), screen  # done, or ended by SIGPIPE


def test_no_pager_and_a_pipe_print_directly(repo: Path, tmp_path: Path) -> None:
    pager, kept = fake_pager(tmp_path)
    env = embedded_env(tmp_path, SNAPSHOTD_PAGER=pager)
    code, screen = at_a_terminal(["--embedded", "--no-pager", "diff", "@", "--patch"], b"", env, repo)
    assert code == 0 and "+beta" in screen and not kept.exists()
    # Standard output to a pipe: never paged, never coloured (auto), whatever the terminal around it.
    reader, writer = os.pipe()
    code, _ = at_a_terminal(["--embedded", "diff", "@", "--patch"], b"", env, repo, stdout=writer)
    os.close(writer)
    with os.fdopen(reader) as piped:
        text = piped.read()
    assert code == 0 and "+beta" in text and not COLOUR.search(text) and not kept.exists()


def test_a_reader_that_stops_early_ends_a_read_as_git_by_sigpipe(repo: Path, tmp_path: Path) -> None:
    # As `snapshotd diff | head -0` under `set -o pipefail`: git's status there is 141, a broken pipe's.
    read_end, write_end = os.pipe()
    os.close(read_end)  # gone before the first write
    try:
        proc = subprocess.run([sys.executable, "-m", "snapshotd", "--embedded", "diff", "@"], cwd=repo, env=embedded_env(tmp_path), stdin=subprocess.DEVNULL,
                              stdout=write_end, stderr=subprocess.PIPE, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == -signal.SIGPIPE and proc.stderr == b""


def test_color_options_and_no_color(repo: Path, tmp_path: Path) -> None:
    args = ["--embedded", "--no-pager", "diff", "@", "--patch"]
    code, screen = at_a_terminal(args, b"", embedded_env(tmp_path), repo)
    assert code == 0 and f"{ESC}32m+beta" in screen
    code, screen = at_a_terminal(args, b"", embedded_env(tmp_path, NO_COLOR="1"), repo)
    assert code == 0 and "+beta" in screen and not COLOUR.search(screen)
    code, screen = at_a_terminal(["--color=always", *args], b"", embedded_env(tmp_path, NO_COLOR="1"), repo)
    assert code == 0 and f"{ESC}32m+beta" in screen
    code, screen = at_a_terminal(["--color", "never", *args], b"", embedded_env(tmp_path), repo)
    assert code == 0 and "+beta" in screen and not COLOUR.search(screen)
    piped = cli_process("--color=always", *args, cwd=repo, env=embedded_env(tmp_path))
    assert f"{ESC}32m+beta" in piped.stdout
    wrong = cli_process("--color=sometimes", *args, cwd=repo, env=embedded_env(tmp_path), code=2)
    assert "'sometimes' is not one of 'auto', 'always', 'never'" in wrong.stderr
