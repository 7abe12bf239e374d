"""Shared test set-up: a base folder with no git above it, a clean git environment, unwrapped trio errors."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import Daemon, quiet_daemon
from temp_base import make_base

_BASE_KEY = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Unless ``--basetemp`` is given, every temporary folder of the session lives in a fresh base (see temp_base).

    ``TMPDIR`` points there too, for ``tempfile`` here and for the daemons
    and commands the tests start.
    """
    if config.option.basetemp:
        return
    try:
        base = make_base()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    config.stash[_BASE_KEY] = base
    config.option.basetemp = str(base / "t")
    os.environ["TMPDIR"] = str(base)
    tempfile.tempdir = None  # tempfile reads TMPDIR again


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A daemon a test left running fails the session (it is ended); the base goes once every test passed,
    and after a failure it stays, to be looked at."""
    base = session.config.stash.get(_BASE_KEY, None)
    if base is None:
        return
    left = _daemons_left_running(base)
    for _ in range(30):  # one told to stop may still be ending
        if not left:
            break
        time.sleep(0.1)
        left = _daemons_left_running(base)
    for pid, _ in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if left:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        tests = ", ".join(sorted({test for _, test in left}))
        print(f"\nerror: {len(left)} daemon(s) left running after the tests that started them: {tests}")
        return
    if exitstatus == 0:
        shutil.rmtree(base, ignore_errors=True)


def _daemons_left_running(base: Path) -> list[tuple[int, str]]:
    """Daemons started under ``base`` and still running, with the test that started each."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            if b"snapshotd" not in b" ".join(argv) or b"serve" not in argv:
                continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = dict(item.partition(b"=")[::2] for item in fh.read().split(b"\0") if item)
        except OSError:
            continue
        if environ.get(b"TMPDIR") == os.fsencode(base):
            found.append((int(entry), environ.get(b"PYTEST_CURRENT_TEST", b"?").decode(errors="replace").split(" ")[0]))
    return found

# Tests run real git; make it independent of the machine's own configuration.
_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Test User",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test User",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "LC_ALL": "C",
}


@pytest.fixture(autouse=True)
def _own_reconciliation_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon-wide share of time for idle reconciliations starts unspent in each test."""
    from snapshotd.capture import pace

    monkeypatch.setattr(pace, "fleet", pace.FleetShare())


@pytest.fixture(autouse=True)
def _isolated_git(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(home / "run"))
    monkeypatch.setenv("SNAPSHOTD_HOME", str(home / "snapshotd-home"))
    monkeypatch.delenv("SNAPSHOTD_SOCKET", raising=False)
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG_GLOBAL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in _GIT_ENV.items():
        monkeypatch.setenv(name, value)
    os.makedirs(home / "run", mode=0o700, exist_ok=True)
    (home / ".gitconfig").write_text("[init]\n\tdefaultBranch = main\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Unwrap single-exception groups from pytest-trio so failures read plainly."""
    outcome = yield
    excinfo = outcome.excinfo
    if excinfo is None:
        return
    exc = excinfo[1]
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if exc is not excinfo[1]:
        outcome.force_exception(exc)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``needs("inotify", ...)`` is about that facility: skipped, saying why, where it is missing.

    ``SNAPSHOTD_DISABLE`` switches facilities off (the second pass of
    ``.ci/run``); macOS or a container may lack them outright.
    """
    from snapshotd import facilities

    for mark in item.iter_markers("needs"):
        for name in mark.args:
            why = facilities.missing_reason(name)
            if why is not None:
                pytest.skip(f"about {name}, which is unavailable here ({why})")


@pytest.fixture
async def engine():
    """An embedded engine (no watcher): every capture takes the cold path."""
    from snapshotd.engine.core import Engine

    eng = Engine()
    try:
        yield eng
    finally:
        await eng.aclose()


@pytest.fixture
async def watched_engine(nursery):
    """An engine with a nursery: worktrees are watched and captures go warm."""
    from snapshotd.engine.core import Engine

    eng = Engine(nursery=nursery)
    try:
        yield eng
    finally:
        await eng.aclose()


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    """A socket path in a folder that does not exist yet (the daemon creates it 0700)."""
    return tmp_path / "run" / "s.sock"


@pytest.fixture
def daemon(sock: Path, tmp_path: Path) -> Iterator[Daemon]:
    """A real daemon on ``sock``; the test fails if its log reports an error."""
    with quiet_daemon(tmp_path) as running:
        assert running.socket == sock
        yield running


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable folder with the sticky bit, as ``/tmp`` is."""
    folder = Path(tempfile.mkdtemp(prefix="snapshotd-shared-"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
