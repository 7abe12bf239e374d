"""The ctypes inotify binding (capture/inotify.py) and the Watcher's own bookkeeping, on real folders.

The binding's close tells trio the descriptor is going, so its tests run under trio too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from repo_helpers import init_repo

from snapshotd.capture.inotify import (
    IN_CREATE,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    Inotify,
    open_in_tree,
)
from snapshotd.capture.watch import Watcher
from snapshotd.store.identity import Records, identify, locate


async def test_events_watches_and_the_kernels_count(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    inotify = Inotify()
    try:
        fd = open_in_tree(str(tmp_path), "a")
        try:
            wd = inotify.add(fd)
        finally:
            os.close(fd)
        assert inotify.read() == []
        assert inotify.kernel_watches() == {wd} and inotify.kernel_watch_count() == 1
        (tmp_path / "a" / "f.txt").write_text("x")
        (tmp_path / "a" / "d").mkdir()
        events = inotify.read()
        assert (wd, IN_CREATE, "f.txt") in events
        assert any(mask & IN_MODIFY and name == "f.txt" for _, mask, name in events)
        assert (wd, IN_CREATE | IN_ISDIR, "d") in events
        inotify.remove(wd)
        assert any(mask & IN_IGNORED for _, mask, _ in inotify.read())
        assert inotify.kernel_watch_count() == 0
    finally:
        inotify.close()


def test_open_in_tree_never_goes_through_a_link(tmp_path: Path) -> None:
    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.close(open_in_tree(str(tmp_path), "real/deep"))
    with pytest.raises(OSError):
        open_in_tree(str(tmp_path), "link/deep")
    with pytest.raises(OSError):
        open_in_tree(str(tmp_path), "link")


async def test_the_watcher_holds_exactly_the_kernels_watches(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "r", ("a/b/c.txt", "c\n"), ("d.txt", "d\n"))
    os.symlink(tmp_path, repo / "out")  # a link to a folder is never watched
    info = identify(locate(str(repo)), Records(tmp_path / "home"))
    watcher = Watcher(info)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher.run)
        assert await watcher.wait_started(10)
        assert watcher.check(always=True) and watcher.suspect is None
        assert await watcher.sync()
        watcher.take()
        (repo / "a" / "b" / "c.txt").write_text("changed\n")
        (repo / "a" / "new").mkdir()
        (repo / "a" / "new" / "e.txt").write_text("e\n")
        assert await watcher.sync()
        dirty, reasons = watcher.take()
        assert {"a/b/c.txt", "a/new"} <= dirty and reasons == set()
        assert not any(path.startswith("out/") for path in dirty)
        assert watcher.check(always=True)
        nursery.cancel_scope.cancel()
    assert not watcher.live
