"""Kernel limits and large trees are a state of one worktree, never a loop that holds the daemon.

The kernel's watch limit is met for real in a user namespace of the test's own
(``/proc/sys/user/max_inotify_watches`` there is the namespace's, so the
machine's limit is untouched); snapshotd's own ceiling per worktree is its
setting; a deep chain of folders and a slow kernel (a fault injected into each
``inotify_add_watch``) show that the walk of new folders runs on a worker
thread, iteratively, and that a stopping watch never waits for it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from daemon_helpers import answers, child_env, ping, wait_until
from oracle import oracle_tree
from repo_helpers import init_repo, write

from snapshotd.capture import inotify as inotify_mod
from snapshotd.capture.watch import Watcher
from snapshotd.capture.worktree import WorktreeCapture
from snapshotd.client.rpc import Client
from snapshotd.settings import size_cap
from snapshotd.store.identity import Records, identify, locate


def make_folders(root: Path, count: int) -> None:
    for index in range(count):
        write(root / f"d{index // 10}" / f"e{index % 10}" / "f.txt", f"{index}\n")


def capture_of(repo: Path, home: Path, counters: Counter[str] | None = None) -> WorktreeCapture:
    info = identify(locate(str(repo)), Records(home))
    return WorktreeCapture(info, lock=trio.Lock(), counters=counters if counters is not None else Counter(), size_cap=size_cap(None))


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-U", "-r", "sh", "-c", "echo 100 > /proc/sys/user/max_inotify_watches"],
        capture_output=True, check=False,
    )
    return probe.returncode == 0


@contextlib.contextmanager
def daemon_with_watch_limit(tmp_path: Path, limit: int) -> Iterator[Path]:
    """A daemon in a user namespace of its own whose inotify watch limit is ``limit``; its socket.

    On leaving, the daemon must stop at SIGTERM within 5 s and its log hold no traceback.
    """
    sock = tmp_path / "run" / "s.sock"
    sock.parent.mkdir(mode=0o700)
    log = tmp_path / "daemon.log"
    serve = f"{sys.executable} -m snapshotd serve --socket {sock} --allow-root"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["unshare", "-U", "-r", "sh", "-c", f"echo {limit} > /proc/sys/user/max_inotify_watches && exec {serve}"],
            stdout=out, stderr=subprocess.STDOUT, env=child_env(), stdin=subprocess.DEVNULL,
        )
    try:
        wait_until(lambda: answers(sock), 15, "the daemon in its namespace")
        yield sock
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text()


needs_namespaces = pytest.mark.skipif(
    not _namespaces_work(), reason="needs an unprivileged user namespace with its own inotify limits"
)


@needs_namespaces
def test_the_kernels_watch_limit_is_named_and_the_worktree_captured_cold(tmp_path: Path) -> None:
    big = init_repo(tmp_path / "big", ("a.txt", "a\n"))
    make_folders(big, 120)
    small = init_repo(tmp_path / "small", ("a.txt", "a\n"))
    with daemon_with_watch_limit(tmp_path, 60) as sock, Client(str(sock), timeout=30) as client:
        for round_ in range(3):
            write(big / "a.txt", f"round {round_}\n")
            done = client.call("checkpoint", {"path": str(big)})
            assert done["checkpoint"]["tree"] == oracle_tree(big)
            assert done["stats"]["scan"] == "full"
        shown = client.call("open", {"path": str(big)})["worktree"]
        assert not shown["watching"]
        assert "fs.inotify.max_user_watches = 60" in shown["watch_error"]
        assert "this daemon holds" in shown["watch_error"] and "sudo sysctl" in shown["watch_error"]
        status = client.call("status")
        assert status["counters"]["watch_given_up.watch_limit"] == 1  # backed off: not retried per request
        # Its watches were given back: a small worktree is watched and warm.
        client.call("checkpoint", {"path": str(small)})
        write(small / "a.txt", "b\n")
        warm = client.call("checkpoint", {"path": str(small)})
        assert warm["stats"]["scan"] == "watch" and warm["checkpoint"]["tree"] == oracle_tree(small)
        assert client.call("ping")["pid"] == ping(sock)["pid"]


@needs_namespaces
def test_at_the_watch_limit_worktrees_fill_it_in_turn_and_the_rest_wait_for_watches_given_back(tmp_path: Path) -> None:
    """Five worktrees of 334 folders each opened at once under a limit of 1,200 watches.

    The limit fills worktree by worktree: three are watched, the walks of the other two stop
    short of the last watches (kept for the watched ones' new folders), and those two do not
    walk again on a timer, nor when a small worktree gives back too few watches. When a
    watched worktree is deleted, its watches are given back and the next capture of one
    waiting worktree watches it; the other does not walk to find it no longer fits.
    """
    repos = [init_repo(tmp_path / f"r{index}", ("a.txt", "a\n")) for index in range(5)]
    for repo in repos:
        make_folders(repo, 300)  # 300 + 30 folders and the root; the daemon adds three of its own
    with daemon_with_watch_limit(tmp_path, 1200) as sock:
        def first_checkpoint(repo: Path) -> None:
            with Client(str(sock), timeout=60) as client:
                client.call("checkpoint", {"path": str(repo)})

        threads = [threading.Thread(target=first_checkpoint, args=(repo,)) for repo in repos]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with Client(str(sock), timeout=60) as client:
            def watching() -> list[Path]:
                return [repo for repo in repos if client.call("open", {"path": str(repo)})["worktree"]["watching"]]

            wait_until(lambda: len(watching()) == 3, 20, "three worktrees watched")
            watched = watching()
            waiting = [repo for repo in repos if repo not in watched]
            for repo in waiting:
                assert "fs.inotify.max_user_watches = 1200" in client.call("open", {"path": str(repo)})["worktree"]["watch_error"]
            assert client.call("status")["counters"]["watch_given_up.watch_limit"] == 2
            # A watched worktree's new folders take from the reserve.
            make_folders(watched[0] / "new", 20)
            done = client.call("checkpoint", {"path": str(watched[0])})
            assert done["stats"]["scan"] == "watch" and done["checkpoint"]["tree"] == oracle_tree(watched[0])
            # Past the first back-off (5 s), the waiting worktrees still do not walk again: no watch was given back.
            time.sleep(5.5)
            for repo in waiting:
                write(repo / "a.txt", "later\n")
                done = client.call("checkpoint", {"path": str(repo)})
                assert done["stats"]["scan"] == "full" and done["checkpoint"]["tree"] == oracle_tree(repo)
            assert client.call("status")["counters"]["watch_given_up.watch_limit"] == 2
            assert watching() == watched

            def still_watched(repo: Path) -> bool:
                listed = client.call("worktrees")["worktrees"]
                return any(item.get("path") == str(repo) and item.get("watching") for item in listed)

            def checkpoint_all(repos: list[Path]) -> None:
                threads = [threading.Thread(target=first_checkpoint, args=(repo,)) for repo in repos]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()

            # A small worktree watched and deleted gives back too few watches for a waiting one: none walks.
            small = init_repo(tmp_path / "small", ("a.txt", "a\n"))
            make_folders(small, 10)
            client.call("checkpoint", {"path": str(small)})
            wait_until(lambda: still_watched(small), 20, "the small worktree watched")
            shutil.rmtree(small)
            wait_until(lambda: not still_watched(small), 20, "the small worktree's watch to end")
            checkpoint_all(waiting)
            assert client.call("status")["counters"]["watch_given_up.watch_limit"] == 2
            assert watching() == watched
            # A watched worktree deleted gives back room for one: of the two asking at once, one walks and is
            # watched, and the other, its turn come, sees there is no longer room and does not walk.
            shutil.rmtree(watched[1])
            repos.remove(watched[1])
            wait_until(lambda: not still_watched(watched[1]), 20, "the deleted worktree's watch to end")
            checkpoint_all(waiting)
            wait_until(lambda: len(watching()) == 3, 20, "a waiting worktree watched")
            now_watched = next(repo for repo in waiting if repo in watching())
            still_waiting = next(repo for repo in waiting if repo is not now_watched)
            assert client.call("open", {"path": str(now_watched)})["worktree"]["watch_error"] is None  # past
            assert client.call("status")["counters"]["watch_given_up.watch_limit"] == 2
            write(now_watched / "a.txt", "watched now\n")
            done = client.call("checkpoint", {"path": str(now_watched)})
            assert done["stats"]["scan"] == "watch" and done["checkpoint"]["tree"] == oracle_tree(now_watched)
            write(still_waiting / "a.txt", "still waiting\n")
            done = client.call("checkpoint", {"path": str(still_waiting)})
            assert done["stats"]["scan"] == "full" and done["checkpoint"]["tree"] == oracle_tree(still_waiting)
            assert "fs.inotify.max_user_watches = 1200" in client.call("open", {"path": str(still_waiting)})["worktree"]["watch_error"]


async def test_past_the_ceiling_a_worktree_is_captured_cold_and_says_so(tmp_path, nursery, monkeypatch):
    monkeypatch.setenv("SNAPSHOTD_WATCH_CEILING", "40")
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    make_folders(repo, 20)  # 2 + 20 folders: under the ceiling
    counters: Counter[str] = Counter()
    capture = capture_of(repo, tmp_path / "home", counters)
    await capture.ensure_watch(nursery, lambda paths, overflow: None)
    assert capture.watching
    await capture.take()
    outside = tmp_path / "incoming"
    make_folders(outside, 60)
    outside.rename(repo / "incoming")  # one rename brings 66 folders in
    with trio.fail_after(10):
        while capture.watching:
            await trio.sleep(0.05)
    assert "has more than 40 folders" in (capture.watch_error or "")
    assert "SNAPSHOTD_WATCH_CEILING" in (capture.watch_error or "")
    assert counters["watch_given_up.watch_ceiling"] == 1
    result = await capture.take()
    assert result.stats.scan == "full" and result.tree == oracle_tree(repo)
    capture.close()


async def test_a_chain_of_1200_folders_is_watched_and_captured(tmp_path, nursery):
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    deep = repo.joinpath(*(["d"] * 1200))
    fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1200):  # one level at a time: pathlib and os.makedirs recurse
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    write(deep / "bottom.txt", "bottom\n")
    capture = capture_of(repo, tmp_path / "home")
    await capture.ensure_watch(nursery, lambda paths, overflow: None)
    assert capture.watching, capture.watch_error
    assert capture.watcher is not None and capture.watcher.held() >= 1201
    assert (await capture.take()).tree == oracle_tree(repo)
    write(deep / "bottom.txt", "changed at the bottom\n")
    warm = await capture.take()
    assert warm.stats.scan == "watch" and warm.tree == oracle_tree(repo)
    capture.close()
    subprocess.run(["rm", "-rf", str(repo / "d")], check=True)  # pytest's own clean-up recurses


async def test_new_folders_are_walked_off_the_loop_and_a_stop_does_not_wait_for_the_walk(tmp_path, monkeypatch):
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    watcher = Watcher(identify(locate(str(repo)), Records(tmp_path / "home")))
    real_add = inotify_mod.Inotify.add

    def slow_add(self, folder_fd):  # the fault: a kernel taking 2 ms per watch
        time.sleep(0.002)
        return real_add(self, folder_fd)

    worst = 0.0
    async with trio.open_nursery() as inner:
        inner.start_soon(watcher.run)
        assert await watcher.wait_started(10)
        monkeypatch.setattr(inotify_mod.Inotify, "add", slow_add)
        outside = tmp_path / "incoming"
        make_folders(outside, 3000)  # 3,301 folders: over 6 s to watch at that pace
        outside.rename(repo / "incoming")
        with trio.move_on_after(2.0):
            while True:
                before = time.monotonic()
                try:
                    await trio.sleep(0.01)
                finally:  # also when the deadline passed while the loop was held
                    worst = max(worst, time.monotonic() - before - 0.01)
        assert watcher.live
        stopping = time.monotonic()
        inner.cancel_scope.cancel()
    assert worst < 0.5, f"the loop was held for {worst:.2f} s"
    assert time.monotonic() - stopping < 1.0
    assert not watcher.live and watcher._inotify is None
