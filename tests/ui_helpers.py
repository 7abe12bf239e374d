"""A real ``snapshotd ui`` process for the page's tests: its address, token, and plain HTTP requests to it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Page:
    """A running ``snapshotd ui`` process: its address and its token file."""

    def __init__(self, proc: subprocess.Popen[str], url: str, token_file: Path) -> None:
        self.proc, self.url, self.token_file = proc, url, token_file
        match = re.match(r"http://127\.0\.0\.1:(\d+)/\?token=(\S+)$", url)
        assert match, url
        self.port, self.token = int(match[1]), match[2]
        self.base = f"http://127.0.0.1:{self.port}"
        self.cookie = {"Cookie": f"snapshotd_ui={self.token}"}


@contextmanager
def ui_process(env: dict[str, str], path: Path | None = None, stop: int = signal.SIGINT) -> Iterator[Page]:
    """``python -m snapshotd ui --no-open [PATH]`` for the block; it must stop cleanly on ``stop``, its token file gone."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "snapshotd", "ui", "--no-open", *([str(path)] if path else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline(), proc.stdout.readline()
        assert first.startswith("snapshotd ui: http://127.0.0.1:"), first + second + proc.stdout.read()
        found = re.search(r"address is also in (\S+);", second)
        assert found, second
        token_file = Path(found[1])
        yield Page(proc, first.split()[-1], token_file)
    finally:
        proc.send_signal(stop)
        try:
            rest, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate()
    assert "Traceback" not in rest, rest
    assert proc.returncode == 0, rest
    assert not token_file.exists()  # the address goes with the server


def request(url: str, headers: dict[str, str] | None = None, data: bytes | None = None) -> tuple[int, bytes]:
    """The status and body of one request (an error status is returned, not raised)."""
    sent = urllib.request.Request(url, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(sent, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def status(url: str, headers: dict[str, str] | None = None, data: bytes | None = None) -> int:
    return request(url, headers, data)[0]
