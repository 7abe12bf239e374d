"""Background push through a real daemon: after checkpoints, batched, never in a capture's way."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import trio
from daemon_helpers import Daemon, call, cli, wait_until
from repo_helpers import git, write
from transfer_helpers import remote_refs


def _clone(tmp_path: Path) -> tuple[Path, str]:
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    repo = tmp_path / "repo"
    git(tmp_path, "clone", "-q", bare.as_uri(), str(repo))
    write(repo / "a.txt", "a\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    git(repo, "push", "-q", "origin", "HEAD:main")
    return repo, bare.as_uri()


def _snapshotd_refs(repo: Path) -> dict[str, str]:
    out = git(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/snapshotd/")
    return dict(line.split(" ") for line in out.splitlines())


def _processes() -> list[tuple[int, list[str]]]:
    """(pid, argv) of this user's processes now."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            found.append((int(entry), [os.fsdecode(arg) for arg in argv if arg]))
    return found


def _pushes(daemon: Daemon, worktree: str) -> dict[str, Any]:
    return call(daemon.socket, "status")["background_push"].get(worktree, {})


def test_checkpoints_are_pushed_after_they_land_once_background_push_is_on(daemon: Daemon, tmp_path: Path) -> None:
    repo, url = _clone(tmp_path)
    here = {"path": str(repo)}
    worktree = call(daemon.socket, "open", here)["worktree"]["id"]
    call(daemon.socket, "checkpoint", here)
    call(daemon.socket, "checkpoint", here)
    assert call(daemon.socket, "status")["background_push"] == {}  # off until asked for
    assert "pushing after every checkpoint" in cli("push", "--background", cwd=repo, env={"SNAPSHOTD_SOCKET": str(daemon.socket)}).stdout
    assert _pushes(daemon, worktree) == {"pending": False, "in_flight": False, "pushes": 0, "last_push_at": None, "last_error": None}
    for turn in range(12):
        write(repo / "a.txt", f"turn {turn}\n")
        call(daemon.socket, "checkpoint", {**here, "session": f"s{turn % 3}"})

    def caught_up() -> bool:
        on_remote = {n: o for n, o in remote_refs(url, tmp_path).items() if n.startswith("refs/snapshotd/")}
        pushes = _pushes(daemon, worktree)
        return on_remote == _snapshotd_refs(repo) and not pushes["pending"] and not pushes["in_flight"]

    wait_until(caught_up, 30, "the background push to catch up")
    pushes = _pushes(daemon, worktree)
    assert pushes["last_error"] is None and pushes["last_push_at"]
    assert 1 <= pushes["pushes"] <= 12  # batched: never more pushes than checkpoints
    cli("push", "--no-background", cwd=repo, env={"SNAPSHOTD_SOCKET": str(daemon.socket)})
    before = remote_refs(url, tmp_path)
    call(daemon.socket, "checkpoint", {**here, "session": "later"})
    time.sleep(0.5)
    assert remote_refs(url, tmp_path) == before, "off means no push"


def test_a_remote_that_hangs_never_delays_a_capture_and_status_shows_the_backlog(daemon: Daemon, tmp_path: Path) -> None:
    repo, _ = _clone(tmp_path)
    here = {"path": str(repo)}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)  # accepts connections and never answers one
        git(repo, "config", "snapshotd.remote", f"git://127.0.0.1:{hung.getsockname()[1]}/r.git")
        worktree = call(daemon.socket, "open", here)["worktree"]["id"]
        call(daemon.socket, "push", {**here, "background": True, "remote": str(tmp_path / "remote.git")})
        call(daemon.socket, "checkpoint", here)
        wait_until(lambda: _pushes(daemon, worktree).get("in_flight"), 15, "a push to the hung remote")
        made = [call(daemon.socket, "checkpoint", {**here, "label": str(n)}) for n in range(5)]
        assert [m["checkpoint"]["seq"] for m in made] == [2, 3, 4, 5, 6]  # each recorded while the push hangs
        pushes = _pushes(daemon, worktree)
        assert pushes["in_flight"] and pushes["pending"] and pushes["pushes"] == 0
        assert call(daemon.socket, "ping")["pid"] == daemon.pid
        port = str(hung.getsockname()[1])
        pushing = [pid for pid, argv in _processes() if "push" in argv and any(port in arg for arg in argv)]
        assert pushing and all(os.getpriority(os.PRIO_PROCESS, pid) >= 10 for pid in pushing)  # it yields to captures


def test_a_remote_that_is_down_is_the_last_error_and_is_retried_after_the_next_checkpoint(daemon: Daemon, tmp_path: Path) -> None:
    repo, url = _clone(tmp_path)
    here = {"path": str(repo)}
    worktree = call(daemon.socket, "open", here)["worktree"]["id"]
    call(daemon.socket, "push", {**here, "background": True})
    gone = tmp_path / "gone.git"
    git(repo, "config", "snapshotd.remote", gone.as_uri())
    call(daemon.socket, "checkpoint", here)
    wait_until(lambda: _pushes(daemon, worktree).get("last_error"), 15, "the failed background push")
    assert "cannot be reached" in _pushes(daemon, worktree)["last_error"]
    status_line = cli("status", env={"SNAPSHOTD_SOCKET": str(daemon.socket)}).stdout
    assert f"background push {worktree}" in status_line and "cannot be reached" in status_line
    git(repo, "config", "snapshotd.remote", url)
    call(daemon.socket, "checkpoint", here)
    wait_until(lambda: _pushes(daemon, worktree).get("last_error") is None, 20, "the retry after the back-off")
    on_remote = {n: o for n, o in remote_refs(url, tmp_path).items() if n.startswith("refs/snapshotd/")}
    assert on_remote == _snapshotd_refs(repo)


async def test_a_background_push_to_a_remote_that_hangs_is_stopped_and_kept_as_the_error(
    watched_engine: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from snapshotd.engine import autopush

    monkeypatch.setattr(autopush, "TIMEOUT_S", 1.0)
    monkeypatch.setattr(autopush, "GATHER_S", 0.0)
    repo, _ = _clone(tmp_path)
    here = {"path": str(repo)}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        await watched_engine.call("push", {**here, "background": True})
        git(repo, "config", "snapshotd.remote", f"git://127.0.0.1:{hung.getsockname()[1]}/r.git")
        worktree = (await watched_engine.call("checkpoint", here))["checkpoint"]["worktree"]
        with trio.fail_after(20):
            while not (await watched_engine.call("status"))["background_push"][worktree]["last_error"]:  # listed once on
                await trio.sleep(0.05)
        port = str(hung.getsockname()[1])
        pushes = (await watched_engine.call("status"))["background_push"][worktree]
        assert "did not finish within 1 s" in pushes["last_error"] and not pushes["in_flight"]
        assert not [pid for pid, argv in _processes() if "push" in argv and any(port in arg for arg in argv)]


def test_push_and_fetch_name_sessions_as_people_gave_them_and_count_them_in_words(daemon: Daemon, tmp_path: Path) -> None:
    repo, _url = _clone(tmp_path)
    env = {"SNAPSHOTD_SOCKET": str(daemon.socket)}
    call(daemon.socket, "checkpoint", {"path": str(repo), "session": "agent"})
    call(daemon.socket, "checkpoint", {"path": str(repo), "session": "my bot: one"})  # not ref-safe: hex in the ref
    assert cli("push", cwd=repo, env=env).stdout.endswith(" sessions to origin: agent, my bot: one\n")
    assert cli("push", cwd=repo, env=env).stdout == "origin is up to date (2 sessions)\n"
    call(daemon.socket, "checkpoint", {"path": str(repo)})
    assert cli("push", cwd=repo, env=env).stdout == "pushed 1 session to origin: the default session\n"
    assert cli("fetch", cwd=repo, env=env).stdout == "fetched 3 sessions from origin\n"


async def test_a_worktree_without_the_setting_starts_no_pusher_after_its_first_checkpoint(watched_engine, tmp_path):
    repo, _ = _clone(tmp_path)
    here = {"path": str(repo)}
    state = watched_engine.registry.worktrees[(await watched_engine.call("open", here))["worktree"]["id"]]
    pushers = watched_engine.transfers.background

    async def settled_after_a_checkpoint() -> Any:
        await watched_engine.call("checkpoint", here)
        with trio.fail_after(10):
            while pushers.states[state.info.id].running:
                await trio.sleep(0.01)
        return pushers.states[state.info.id]

    Path(state.info.state_dir).mkdir(parents=True, exist_ok=True)
    (Path(state.info.state_dir) / "push.json").write_text("{not json")
    push = await settled_after_a_checkpoint()
    assert not push.enabled and not push.known  # unreadable: read again at the next checkpoint
    (Path(state.info.state_dir) / "push.json").write_text('{"background": false}')
    push = await settled_after_a_checkpoint()
    assert not push.enabled and push.known
    await watched_engine.call("checkpoint", here)
    assert not push.running and not push.pending  # known to be off: no pusher started, nothing pending
