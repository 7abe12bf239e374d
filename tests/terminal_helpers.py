"""Running the command line on a pseudo-terminal, as a person at a terminal would."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def at_a_terminal(
    args: list[str],
    answer: bytes,
    env: dict[str, str],
    cwd: Path,
    *,
    prompt: bytes = b"Go ahead?",
    stdout: Any = None,
) -> tuple[int, str]:
    """Run ``snapshotd ARGS`` on a pseudo-terminal, answer its prompt, return (status, screen).

    ``stdout`` sends the command's standard output elsewhere (a pipe, say)
    while stdin and stderr stay on the terminal.
    """
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "snapshotd", *args],
        stdin=slave, stdout=slave if stdout is None else stdout, stderr=slave, cwd=cwd, env=env,
        start_new_session=True,
    )
    os.close(slave)
    screen = b""
    answered = False
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other side has closed
                break
            if not chunk:
                break
            screen += chunk
            if not answered and prompt in screen:
                os.write(master, answer)
                answered = True
        return proc.wait(timeout=30), screen.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
