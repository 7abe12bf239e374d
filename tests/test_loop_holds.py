"""Work that grows with a hostile input never holds the trio loop: big trees moved out, the watch list, big patches.

A neighbour moving a tree of thousands of folders out of a worktree makes the
watcher drop a watch per folder and then read the kernel's count of the rest;
both run on a worker thread. A slow kernel (a fault injected into each
``inotify_rm_watch`` and into the read of ``/proc/self/fdinfo``) makes the
difference plain: the loop's longest stall stays far below the time the
kernel takes. A patch of megabytes is made by git (libgit2 would hold the GIL
while it builds it) and encoded on a worker thread a piece at a time, so a
real daemon answers another client's pings meanwhile.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import trio
from daemon_helpers import Daemon
from repo_helpers import init_repo, write

from snapshotd.capture import inotify as inotify_mod
from snapshotd.capture.watch import Watcher
from snapshotd.client.rpc import Client
from snapshotd.contract.framing import encode_message
from snapshotd.store.identity import Records, identify, locate


def make_folders(root: Path, count: int) -> None:
    for index in range(count):
        write(root / f"d{index // 10}" / f"e{index % 10}" / "f.txt", f"{index}\n")


async def longest_stall(seconds: float) -> float:
    """The loop's longest delay past a 10 ms sleep over ``seconds``."""
    worst = 0.0
    with trio.move_on_after(seconds):
        while True:
            before = time.monotonic()
            try:
                await trio.sleep(0.01)
            finally:  # also when the deadline passed while the loop was held
                worst = max(worst, time.monotonic() - before - 0.01)
    return worst


async def test_a_big_tree_moved_out_is_unwatched_off_the_loop(tmp_path: Path, monkeypatch) -> None:
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    make_folders(repo / "big", 2000)  # 2,201 folders
    watcher = Watcher(identify(locate(str(repo)), Records(tmp_path / "home")))
    real_remove = inotify_mod.Inotify.remove

    def slow_remove(self, wd):  # the fault: a kernel taking 1 ms per removed watch (over 2 s for the tree)
        time.sleep(0.001)
        real_remove(self, wd)

    async with trio.open_nursery() as inner:
        inner.start_soon(watcher.run)
        assert await watcher.wait_started(20)
        held = watcher.held()
        monkeypatch.setattr(inotify_mod.Inotify, "remove", slow_remove)
        (repo / "big").rename(tmp_path / "big")
        worst = await longest_stall(1.5)
        with trio.fail_after(20):
            while watcher.held() > held - 2201:
                await trio.sleep(0.05)
        assert watcher.live and await watcher.sync()
        assert watcher.suspect is None
        inner.cancel_scope.cancel()
    assert worst < 0.5, f"the loop was held for {worst:.2f} s"


async def test_the_kernels_count_of_watches_is_read_off_the_loop(tmp_path: Path, monkeypatch) -> None:
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    watcher = Watcher(identify(locate(str(repo)), Records(tmp_path / "home")))
    real_fdinfo = inotify_mod.Inotify._fdinfo

    def slow_fdinfo(self):  # the fault: a kernel taking 1.5 s to list the watches
        time.sleep(1.5)
        return real_fdinfo(self)

    async with trio.open_nursery() as inner:
        inner.start_soon(watcher.run)
        assert await watcher.wait_started(20)
        write(repo / "b.txt", "b\n")  # an event: the next sync asks the kernel for its count
        monkeypatch.setattr(inotify_mod.Inotify, "_fdinfo", slow_fdinfo)
        synced: list[bool] = []

        async def sync() -> None:
            synced.append(await watcher.sync(timeout=10))

        inner.start_soon(sync)
        worst = await longest_stall(2.5)
        assert synced == [True] and watcher.suspect is None
        assert "b.txt" in watcher.dirty
        inner.cancel_scope.cancel()
    assert worst < 0.5, f"the loop was held for {worst:.2f} s"


def test_pings_are_answered_while_a_patch_of_megabytes_is_made_and_sent(daemon: Daemon, sock: Path, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", ("a.txt", "a\n"))
    with Client(str(sock), timeout=60) as client:
        before = client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]
        write(repo / "big.txt", "".join(f"line {n:07d} of a file that makes a big patch\n" for n in range(400_000)))
        after = client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]
    params = {"from": before, "to": after, "patch": True, "max_patch_bytes": 32 * 1024 * 1024}
    sizes: list[int] = []

    def hog() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn, conn.makefile("rb") as replies:
            conn.connect(str(sock))
            for n in range(3):
                conn.sendall(encode_message({"jsonrpc": "2.0", "id": n, "method": "diff", "params": params}))
                line = replies.readline()  # not parsed here: json.loads of it would hold this process's GIL
                sizes.append(len(line) if line.startswith(b'{"jsonrpc":"2.0","id":%d,"result":' % n) else 0)

    worst = 0.0
    with Client(str(sock), timeout=60) as client:
        client.call("ping")
        hogging = threading.Thread(target=hog)
        hogging.start()
        while hogging.is_alive():
            started = time.monotonic()
            client.call("ping")
            worst = max(worst, time.monotonic() - started)
            time.sleep(0.01)
        hogging.join()
    assert sizes and min(sizes) > 15_000_000
    assert worst < 0.5, f"a ping waited {worst:.2f} s while the patch was made"
