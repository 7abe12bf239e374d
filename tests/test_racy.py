"""Racy timestamps: a same-size rewrite right after a capture is never missed [102, 113].

A file rewritten within the filesystem's timestamp granularity, with the same
size (and even with its mtime forced back to the old value), looks unchanged
to anything that trusts stat data alone. Every capture below must still hold
the new bytes, and equal git's tree.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import capture_helpers
import trio
from capture_helpers import assert_matches_git, checkpoint
from oracle import oracle_tree
from repo_helpers import blob, git, init_repo, write

from snapshotd.engine.core import Engine

mode = capture_helpers.mode
eng = capture_helpers.eng

ROUNDS = 25


def rewrite(path: Path, content: bytes, *, keep_mtime: bool = False) -> None:
    """Rewrite in place (same inode); optionally force the old atime and mtime back."""
    st = os.stat(path)
    with open(path, "r+b") as fh:
        fh.write(content)
        fh.truncate()
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(path).st_mtime_ns == st.st_mtime_ns


def racy_repo(tmp_path: Path) -> Path:
    repo = init_repo(tmp_path / "repo", ("tracked.txt", "0000\n"), ("other.txt", "other\n"))
    write(repo / "untracked.txt", "0000\n")
    return repo


async def assert_sees(engine: Engine, repo: Path, expected: dict[str, bytes]) -> str:
    result = await checkpoint(engine, repo)
    for path, content in expected.items():
        got = blob(repo, result["checkpoint"]["id"], path)
        assert got == content, f"{path}: the capture holds {got!r}, the disk {content!r}"
    assert_matches_git(repo, result)
    return result["checkpoint"]["tree"]


async def test_same_size_rewrites(eng: Engine, tmp_path: Path) -> None:
    repo = racy_repo(tmp_path)
    for i in range(ROUNDS):
        await checkpoint(eng, repo)
        content = f"{i:04}\n".encode()
        rewrite(repo / "tracked.txt", content)
        rewrite(repo / "untracked.txt", content)
        await assert_sees(eng, repo, {"tracked.txt": content, "untracked.txt": content})


async def test_same_size_rewrites_with_the_same_mtime(eng: Engine, tmp_path: Path) -> None:
    repo = racy_repo(tmp_path)
    for i in range(ROUNDS):
        await checkpoint(eng, repo)
        content = f"{i:04}\n".encode()
        rewrite(repo / "tracked.txt", content, keep_mtime=True)
        rewrite(repo / "untracked.txt", content, keep_mtime=True)
        await assert_sees(eng, repo, {"tracked.txt": content, "untracked.txt": content})


async def test_rewrite_after_the_user_refreshed_the_index(mode: str, eng: Engine, tmp_path: Path) -> None:
    """The user's index holds fresh stat data (``git status``); then same-size rewrites.

    Each rewrite puts the old mtime back within the second the index was
    written, so only the ctime's nanoseconds tell. Git compares timestamps to
    the second and calls the file clean: the contract's answer (git add -A on
    a copy of that index, trusting its stat data as git does) keeps the
    indexed bytes, and a cold capture must give exactly that. With a watcher
    the write events are hints the daemon follows, so a warm capture holds the
    bytes on disk.
    """
    repo = racy_repo(tmp_path)

    async def check(content: bytes) -> None:
        if mode == "warm":
            await assert_sees(eng, repo, {"tracked.txt": content})
        else:
            result = await checkpoint(eng, repo)
            assert result["checkpoint"]["tree"] == oracle_tree(repo, trust_stat=True)

    for i in range(10):
        git(repo, "update-index", "-q", "--refresh")
        await checkpoint(eng, repo)
        content = f"r{i:03}\n".encode()
        rewrite(repo / "tracked.txt", content, keep_mtime=True)
        await check(content)
        git(repo, "add", "tracked.txt")  # the user stages the new content
        content = f"s{i:03}\n".encode()
        rewrite(repo / "tracked.txt", content, keep_mtime=True)
        await check(content)


async def test_burst_of_same_size_rewrites(eng: Engine, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", *[(f"f{i}.txt", "aaaa\n") for i in range(20)])
    await checkpoint(eng, repo)
    for round_ in range(5):
        expected = {}
        for i in range(20):
            content = f"{round_}{i:03}\n".encode()
            rewrite(repo / f"f{i}.txt", content, keep_mtime=i % 2 == 0)
            expected[f"f{i}.txt"] = content
        await assert_sees(eng, repo, expected)


async def test_rewrite_during_capture_is_caught_by_the_next(eng: Engine, tmp_path: Path) -> None:
    """A write landing while a capture runs may or may not be in it, but is in the next one."""
    repo = racy_repo(tmp_path)
    for i in range(15):
        content = f"{i:04}\n".encode()

        async def writer(content: bytes = content, delay: float = (i % 5) * 0.002) -> None:
            await trio.sleep(delay)
            rewrite(repo / "tracked.txt", content, keep_mtime=True)
            rewrite(repo / "untracked.txt", content, keep_mtime=True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await checkpoint(eng, repo)
        await assert_sees(eng, repo, {"tracked.txt": content, "untracked.txt": content})


async def test_coarse_timestamps_while_idle(eng: Engine, tmp_path: Path) -> None:
    """[113] whole-second mtimes (FAT, HFS+, some network mounts), edits after an idle pause."""
    repo = racy_repo(tmp_path)
    for i in range(2):
        second = int(time.time())
        for name in ("tracked.txt", "untracked.txt"):
            os.utime(repo / name, (second, second))
        await checkpoint(eng, repo)
        await trio.sleep(1.1)  # idle: the daemon does nothing meanwhile
        content = f"c{i:03}\n".encode()
        for name in ("tracked.txt", "untracked.txt"):
            rewrite(repo / name, content)
            os.utime(repo / name, (second, second))
        await assert_sees(eng, repo, {"tracked.txt": content, "untracked.txt": content})
