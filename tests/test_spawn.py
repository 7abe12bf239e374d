"""snapshotd.git.spawn against real processes: both faces, native helper and fallback."""

from __future__ import annotations

import errno
import functools
import gc
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from snapshotd.git import child, spawn

MiB = 1024 * 1024

Runner = Callable[..., Awaitable[spawn.Completed]]


def base_env(**extra: str) -> dict[str, str]:
    """A small, complete environment for a child."""
    env = {"PATH": os.environ["PATH"], "LC_ALL": "C", "HOME": os.environ["HOME"]}
    env.update(extra)
    return env


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process in process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid:
            members.append((int(entry), state))
    return members


def live_members(pgid: int) -> list[int]:
    # A zombie is dead: it waits for its parent (here perhaps an init that does
    # not reap) and can run nothing.
    return [pid for pid, state in group_members(pgid) if state not in ("Z", "X")]


def wait_until_group_gone(pgid: int, limit: float = 5.0) -> list[int]:
    end = time.monotonic() + limit
    while (alive := live_members(pgid)) and time.monotonic() < end:
        time.sleep(0.01)
    return alive


def zombie_children() -> set[int]:
    """Children of this process that have exited and not been reaped."""
    me = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == me:
            found.add(int(entry))
    return found


def proc_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def status_field(status: bytes, name: str) -> int:
    for line in status.decode().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return int(value.strip(), 16)
    raise AssertionError(f"{name} not in /proc/self/status")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(params=["native", "fallback"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with the compiled helper, then with the subprocess fallback."""
    if request.param == "native":
        if not spawn.NATIVE:
            pytest.skip(f"native helper not built: {spawn.NATIVE_ERROR}")
    else:
        monkeypatch.setattr(child, "_lib", None)
        monkeypatch.setattr(child, "_ffi", None)
        monkeypatch.setattr(spawn, "NATIVE", False)
        monkeypatch.setattr(spawn, "NATIVE_ERROR", "disabled by the test")
    return request.param


@pytest.fixture(params=["trio", "sync"])
def runner(request: pytest.FixtureRequest, mode: str) -> Runner:
    """Either face behind one awaitable: run_sync goes through a worker thread."""
    if request.param == "trio":
        return spawn.run

    async def via_thread(argv: list[str], **kwargs: Any) -> spawn.Completed:
        call = functools.partial(spawn.run_sync, argv, **kwargs)
        return await trio.to_thread.run_sync(call)

    return via_thread


@pytest.fixture
def extra_fds() -> Iterator[None]:
    """Descriptors a careless start would hand to the child: one inheritable."""
    inheritable = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(inheritable, True)
    private = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    yield
    os.close(inheritable)
    os.close(private)


# --------------------------------------------------------------------------- the helper


def test_native_helper_is_in_use() -> None:
    assert spawn.NATIVE, f"snapshotd._spawn_native did not load: {spawn.NATIVE_ERROR}"
    assert spawn.NATIVE_ERROR is None


# --------------------------------------------------------------------------- core behaviour


async def test_cwd_is_honoured(runner: Runner, tmp_path: Path) -> None:
    folder = tmp_path / "with space" / "deeper"
    folder.mkdir(parents=True)
    result = await runner(["pwd", "-P"], cwd=str(folder), env=base_env())
    assert result.returncode == 0
    assert result.stdout.decode().strip() == os.path.realpath(folder)

    repo = tmp_path / "repo"
    repo.mkdir()
    env = base_env(GIT_CONFIG_NOSYSTEM="1")
    assert (await runner(["git", "init", "-q"], cwd=str(repo), env=env)).returncode == 0
    (repo / "sub").mkdir()
    shown = await runner(["git", "rev-parse", "--show-toplevel"], cwd=str(repo / "sub"), env=env)
    assert shown.stdout.decode().strip() == os.path.realpath(repo)


async def test_env_is_exactly_the_given_one(
    runner: Runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPSHOTD_PARENT_ONLY", "must not reach the child")
    env = {"PATH": os.environ["PATH"], "ONE": "1", "EMPTY": "", "SPACED": "a b  c", "UTF": "é"}
    result = await runner(["env"], cwd=str(tmp_path), env=env)
    seen = dict(line.split("=", 1) for line in result.stdout.decode().splitlines())
    assert seen == env

    # Without PATH in env, the program is still found (on this process's PATH)
    # and the child gets no PATH at all.
    result = await runner(["env"], cwd=str(tmp_path), env={"ONLY": "this"})
    assert result.stdout == b"ONLY=this\n"


async def test_program_is_found_on_the_given_path(
    runner: Runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
    script = first / "snapshotd-hello"
    script.write_text("#!/bin/sh\necho first\n")
    script.chmod(0o755)
    env = base_env(PATH=f"{first}:{second}:{os.environ['PATH']}")
    monkeypatch.setenv("PATH", os.defpath)  # not the parent's PATH: env's
    assert (await runner(["snapshotd-hello"], cwd=str(tmp_path), env=env)).stdout == b"first\n"

    # The resolution is cached; once that program is gone, it is looked up again.
    script.unlink()
    replacement = second / "snapshotd-hello"
    replacement.write_text("#!/bin/sh\necho second\n")
    replacement.chmod(0o755)
    assert (await runner(["snapshotd-hello"], cwd=str(tmp_path), env=env)).stdout == b"second\n"


async def test_stdin_and_stdout_20_mib(runner: Runner, tmp_path: Path) -> None:
    data = os.urandom(20 * MiB)
    result = await runner(["cat"], cwd=str(tmp_path), env=base_env(), input=data)
    assert result.returncode == 0
    assert result.stdout == data
    assert result.stderr == b""


async def test_large_stderr_and_both_outputs_at_once(runner: Runner, tmp_path: Path) -> None:
    data = os.urandom(20 * MiB)
    result = await runner(
        ["sh", "-c", "cat >&2; echo done"], cwd=str(tmp_path), env=base_env(), input=data
    )
    assert result.stderr == data
    assert result.stdout == b"done\n"

    # tee fills both pipes in turn: a reader that drained one pipe at a time
    # would deadlock here.
    data = os.urandom(8 * MiB)
    result = await runner(["tee", "/dev/stderr"], cwd=str(tmp_path), env=base_env(), input=data)
    assert result.returncode == 0
    assert result.stdout == data
    assert result.stderr == data


async def test_stdin_variants(runner: Runner, tmp_path: Path) -> None:
    env = base_env()
    shown = await runner(["sh", "-c", "readlink /proc/$$/fd/0"], cwd=str(tmp_path), env=env)
    assert shown.stdout == b"/dev/null\n"
    empty = await runner(["cat"], cwd=str(tmp_path), env=env, input=b"")
    assert (empty.returncode, empty.stdout) == (0, b"")
    # A child that never reads its input is not an error.
    unread = await runner(["true"], cwd=str(tmp_path), env=env, input=os.urandom(4 * MiB))
    assert unread.returncode == 0


async def test_exit_codes(runner: Runner, tmp_path: Path) -> None:
    for code in (0, 1, 3, 128, 255):
        result = await runner(["sh", "-c", f"exit {code}"], cwd=str(tmp_path), env=base_env())
        assert result.returncode == code
        assert result.argv == ("sh", "-c", f"exit {code}")


async def test_death_by_signal_is_negative(runner: Runner, tmp_path: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGPIPE):
        result = await runner(
            ["sh", "-c", f"kill -{sig.name[3:]} $$"], cwd=str(tmp_path), env=base_env()
        )
        assert result.returncode == -sig


async def test_timeout_kills_the_whole_group(runner: Runner, tmp_path: Path) -> None:
    argv = ["sh", "-c", "sleep 100 & echo $!; sleep 100"]
    started = time.monotonic()
    with pytest.raises(spawn.SpawnTimeout) as caught:
        await runner(argv, cwd=str(tmp_path), env=base_env(), timeout=0.5)
    assert time.monotonic() - started < 5
    exc = caught.value
    assert exc.argv == tuple(argv)
    assert exc.timeout == 0.5
    grandchild = int(exc.stdout)
    # The leader is reaped (no zombie of ours), the grandchild is dead, and no
    # live process is left in the group.
    with pytest.raises(ChildProcessError):
        os.waitpid(exc.pid, os.WNOHANG)
    assert wait_until_group_gone(exc.pid) == []
    assert not proc_alive(grandchild)


async def test_no_descriptor_leaks_into_the_child(
    runner: Runner, tmp_path: Path, extra_fds: None
) -> None:
    argv = ["sh", "-c", "ls /proc/$$/fd"]
    for data in (None, b"some input"):
        result = await runner(argv, cwd=str(tmp_path), env=base_env(), input=data)
        assert result.stdout.split() == [b"0", b"1", b"2"]


async def test_no_descriptor_or_zombie_leaks_in_the_parent(runner: Runner, tmp_path: Path) -> None:
    env = base_env()
    gc.collect()  # an earlier test's garbage closing its descriptors mid-test is not a leak of the spawner's
    before = open_fds()
    zombies_before = zombie_children()
    for i in range(200):
        kind = i % 10
        if kind == 0:
            with pytest.raises(spawn.SpawnTimeout):
                await runner(["sleep", "10"], cwd=str(tmp_path), env=env, timeout=0.02)
        elif kind == 1:
            with pytest.raises(FileNotFoundError):
                await runner(["snapshotd-no-such-program"], cwd=str(tmp_path), env=env)
        elif kind == 2:
            with pytest.raises(FileNotFoundError):
                await runner(["true"], cwd=str(tmp_path / "missing"), env=env)
        elif kind == 3:
            result = await runner(["sh", "-c", "exit 7"], cwd=str(tmp_path), env=env)
            assert result.returncode == 7
        else:
            result = await runner(["cat"], cwd=str(tmp_path), env=env, input=b"x" * i)
            assert result.stdout == b"x" * i
    assert open_fds() == before
    assert zombie_children() <= zombies_before


async def test_200_concurrent_children(runner: Runner, tmp_path: Path) -> None:
    results: dict[int, spawn.Completed] = {}
    before = spawn.spawned_total()

    async def one(i: int) -> None:
        argv = ["sh", "-c", 'printf "%s:" "$1"; cat; printf "err%s" "$1" >&2', "sh", str(i)]
        payload = f"payload-{i};".encode() * 500
        results[i] = await runner(argv, cwd=str(tmp_path), env=base_env(), input=payload)

    async with trio.open_nursery() as nursery:
        for i in range(200):
            nursery.start_soon(one, i)

    assert spawn.spawned_total() - before == 200
    for i in range(200):
        assert results[i].returncode == 0
        assert results[i].stdout == f"{i}:".encode() + f"payload-{i};".encode() * 500
        assert results[i].stderr == f"err{i}".encode()


async def test_start_errors(runner: Runner, tmp_path: Path) -> None:
    env = base_env()
    before = spawn.spawned_total()
    with pytest.raises(FileNotFoundError) as missing:
        await runner(["snapshotd-no-such-program"], cwd=str(tmp_path), env=env)
    assert missing.value.filename == "snapshotd-no-such-program"

    gone = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError) as no_cwd:
        await runner(["true"], cwd=gone, env=env)
    assert no_cwd.value.filename == gone

    plain = tmp_path / "not-executable"
    plain.write_text("echo hi\n")
    with pytest.raises(PermissionError) as denied:
        await runner([str(plain)], cwd=str(tmp_path), env=env)
    assert denied.value.errno == errno.EACCES

    for bad_env in ({"A=B": "x"}, {"": "x"}, {"A": "nul\0"}):
        with pytest.raises(ValueError):
            await runner(["true"], cwd=str(tmp_path), env=bad_env)
    with pytest.raises(ValueError):
        await runner(["echo", "nul\0"], cwd=str(tmp_path), env=env)
    with pytest.raises(ValueError):
        await runner([], cwd=str(tmp_path), env=env)
    assert spawn.spawned_total() == before


async def test_spawned_total_counts_exactly(runner: Runner, tmp_path: Path) -> None:
    env = base_env()
    before = spawn.spawned_total()
    await runner(["true"], cwd=str(tmp_path), env=env)
    await runner(["false"], cwd=str(tmp_path), env=env)
    await runner(["cat"], cwd=str(tmp_path), env=env, input=b"abc")
    with pytest.raises(spawn.SpawnTimeout):
        await runner(["sleep", "10"], cwd=str(tmp_path), env=env, timeout=0.05)
    with pytest.raises(FileNotFoundError):
        await runner(["snapshotd-no-such-program"], cwd=str(tmp_path), env=env)
    assert spawn.spawned_total() - before == 4


# --------------------------------------------------------------------------- signals


async def test_ignored_signals_are_reset_in_the_child(
    runner: Runner, mode: str, tmp_path: Path
) -> None:
    # Python ignores SIGPIPE; add SIGUSR1 so both kinds of ignored signal show.
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        status = (
            await runner(["cat", "/proc/self/status"], cwd=str(tmp_path), env=base_env())
        ).stdout
    finally:
        signal.signal(signal.SIGUSR1, previous)
    ignored = status_field(status, "SigIgn")
    if mode == "native":
        assert ignored == 0
    else:
        # subprocess resets only SIGPIPE and SIGXFSZ: the fallback's known gap.
        assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert status_field(status, "SigBlk") == 0


def _status_with_sigterm_blocked(tmp_path: Path) -> bytes:
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        assert signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        result = spawn.run_sync(["cat", "/proc/self/status"], cwd=str(tmp_path), env=base_env())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return result.stdout


@pytest.mark.skipif(
    not spawn.NATIVE, reason="the subprocess fallback keeps the thread's signal mask"
)
def test_clean_signal_mask_in_the_child_sync(tmp_path: Path) -> None:
    status = _status_with_sigterm_blocked(tmp_path)
    assert status_field(status, "SigBlk") == 0
    assert status_field(status, "SigIgn") == 0


@pytest.mark.skipif(
    not spawn.NATIVE, reason="the subprocess fallback keeps the thread's signal mask"
)
async def test_clean_signal_mask_in_the_child_trio_and_threads(tmp_path: Path) -> None:
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        result = await spawn.run(["cat", "/proc/self/status"], cwd=str(tmp_path), env=base_env())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    assert status_field(result.stdout, "SigBlk") == 0
    # And from a worker thread that blocks it.
    status = await trio.to_thread.run_sync(_status_with_sigterm_blocked, tmp_path)
    assert status_field(status, "SigBlk") == 0


# --------------------------------------------------------------------------- cancellation


async def test_cancellation_kills_and_reaps(mode: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    argv = ["sh", "-c", 'sleep 100 & echo "$$ $!" > "$1"; wait', "sh", str(pidfile)]
    gc.collect()  # an earlier test's garbage closing its descriptors mid-test is not a leak of the spawner's
    before = open_fds()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(spawn.run, argv, cwd=str(tmp_path), env=base_env())
            )
            while not pidfile.exists() or not pidfile.read_text().endswith("\n"):
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    leader, grandchild = map(int, pidfile.read_text().split())
    assert not os.path.exists(f"/proc/{leader}")  # reaped, not a zombie
    with pytest.raises(ChildProcessError):
        os.waitpid(leader, os.WNOHANG)
    assert wait_until_group_gone(leader) == []
    assert not proc_alive(grandchild)
    assert open_fds() == before


# --------------------------------------------------------------------------- the blocking face


def test_run_sync_in_plain_code(mode: str, tmp_path: Path) -> None:
    env = base_env()
    data = os.urandom(3 * MiB)
    result = spawn.run_sync(["cat"], cwd=str(tmp_path), env=env, input=data)
    assert result == spawn.Completed(("cat",), 0, data, b"")
    assert spawn.run_sync(["sh", "-c", "kill -9 $$"], cwd=str(tmp_path), env=env).returncode == -9
    with pytest.raises(spawn.SpawnTimeout) as caught:
        spawn.run_sync(
            ["sh", "-c", "echo started; sleep 100"], cwd=str(tmp_path), env=env, timeout=0.3
        )
    assert caught.value.stdout == b"started\n"
    assert wait_until_group_gone(caught.value.pid) == []
    with pytest.raises(ValueError):
        spawn.run_sync(["true"], cwd=str(tmp_path), env=env, timeout=-1)


async def test_both_faces_agree(mode: str, tmp_path: Path) -> None:
    argv = ["sh", "-c", "cat; echo to-err >&2; exit 5"]
    kwargs: dict[str, Any] = {"cwd": str(tmp_path), "env": base_env(), "input": b"in\n"}
    from_trio = await spawn.run(argv, **kwargs)
    from_sync = spawn.run_sync(argv, **kwargs)
    assert from_trio == from_sync == spawn.Completed(tuple(argv), 5, b"in\n", b"to-err\n")


def test_uses_this_python(tmp_path: Path) -> None:
    # A program named by path (with a slash) is run as given, not searched.
    result = spawn.run_sync(
        [sys.executable, "-c", "import os; print(os.getcwd())"], cwd=str(tmp_path), env={}
    )
    assert result.stdout.decode().strip() == os.path.realpath(tmp_path)
