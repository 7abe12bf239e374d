"""A restore's copies: all written ahead and made durable before the first rename, each folder opened once.

The safety rules hold as they are (a path changed meanwhile is left alone, a
failure part-way puts everything back and leaves no temporary file or folder
it made). Most tests take the many-file path (``barrier.SYNCFS_FROM`` files or
more: one ``syncfs``); the last, a small restore's (each copy fsynced).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from oracle import oracle_tree
from restore_helpers import temps_left
from test_restore_safety import checkpoint, files_as_they_are, fsck_clean, make_repo

from snapshotd.errors import FilesystemError, SnapshotdError
from snapshotd.restore import apply as apply_mod, barrier, fileops

FILES = 200
FOLDERS = 8


def _scene(tmp_path: Path) -> tuple[Path, list[str]]:
    """A repository of FILES files in FOLDERS folders; returns it and the paths."""
    paths = [f"d{i % FOLDERS}/f{i:03}.txt" for i in range(FILES)]
    return make_repo(tmp_path / "wt", {rel: f"{rel} at A\n" for rel in paths}), paths


async def test_a_big_restore_opens_each_folder_once_and_writes_every_file(engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wt, paths = _scene(tmp_path)
    cp = await checkpoint(engine, wt)
    for rel in paths:
        (wt / rel).write_text("edited\n")
    os.chmod(wt / paths[5], 0o755)
    opened: list[tuple[str, ...]] = []
    real = apply_mod.open_dir

    def counted(root_fd: int, parts: Any, **kwargs: Any) -> int:
        opened.append(tuple(parts))
        return real(root_fd, parts, **kwargs)

    monkeypatch.setattr(apply_mod, "open_dir", counted)
    result = await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert len(result["written"]) == FILES and not result.get("skipped")
    assert oracle_tree(wt) == cp["tree"]
    assert not os.stat(wt / paths[5]).st_mode & 0o111
    # Once to check the disk against the safety checkpoint, once to write (and sync): not once per file.
    assert len(opened) <= 3 * FOLDERS, len(opened)
    assert temps_left(wt) == []


async def test_a_full_disk_part_way_through_a_big_restore_changes_nothing(engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wt, paths = _scene(tmp_path)
    for i in range(FILES):  # files in folders that only the checkpoint has: the restore creates them
        (wt / f"new{i % 4}" / f"n{i:03}.txt").parent.mkdir(exist_ok=True)
        (wt / f"new{i % 4}" / f"n{i:03}.txt").write_text(f"n{i} at A\n")
    cp = await checkpoint(engine, wt)
    for rel in paths:
        (wt / rel).write_text("edited\n")
    for i in range(4):
        for child in (wt / f"new{i}").iterdir():
            child.unlink()
        (wt / f"new{i}").rmdir()
    before = files_as_they_are(wt)
    real = fileops.write_all
    calls = {"n": 0}

    def full_disk_part_way(fd: int, data: bytes) -> None:
        if data.endswith(b" at A\n"):
            calls["n"] += 1
            if calls["n"] == FILES:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(fileops, "write_all", full_disk_part_way)
    assert barrier.SYNCFS_FROM <= FILES
    with pytest.raises(FilesystemError) as info:
        await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert "disk is full" in info.value.message and "Nothing was changed" in info.value.message
    assert files_as_they_are(wt) == before  # the new folders too: no temporary file was left in them
    assert temps_left(wt) == []
    fsck_clean(wt)
    monkeypatch.undo()
    await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert oracle_tree(wt) == cp["tree"]


async def test_a_big_restore_renames_nothing_before_every_copy_is_durable(engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wt, paths = _scene(tmp_path)
    cp = await checkpoint(engine, wt)
    for rel in paths:
        (wt / rel).write_text("edited\n")
    seen: dict[str, Any] = {}
    real = barrier.make_durable

    def look(written: Any) -> None:
        written = list(written)
        seen["on disk"] = {rel: (wt / rel).read_text() for rel in paths}
        seen["temps"] = len(temps_left(wt))
        seen["synced"] = len(written)
        real(written)

    monkeypatch.setattr(barrier, "make_durable", look)
    result = await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert len(result["written"]) == FILES
    assert seen["on disk"] == dict.fromkeys(paths, "edited\n")  # no target replaced yet
    assert seen["temps"] == seen["synced"] == FILES  # every copy written, all synced at once
    assert oracle_tree(wt) == cp["tree"] and temps_left(wt) == []


async def test_a_big_restore_whose_copies_cannot_be_synced_changes_nothing(engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wt, paths = _scene(tmp_path)
    cp = await checkpoint(engine, wt)
    for rel in paths:
        (wt / rel).write_text("edited\n")
    before = files_as_they_are(wt)

    def broken(fd: int) -> bool:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(barrier, "_syncfs", broken)
    with pytest.raises(SnapshotdError) as info:
        await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert "Nothing was changed" in info.value.message
    assert files_as_they_are(wt) == before and temps_left(wt) == []
    monkeypatch.undo()
    await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert oracle_tree(wt) == cp["tree"]


async def test_without_syncfs_a_big_restore_syncs_each_copy(engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wt, paths = _scene(tmp_path)
    cp = await checkpoint(engine, wt)
    for rel in paths:
        (wt / rel).write_text("edited\n")
    synced: list[str] = []
    real = barrier._fsync_each

    def counted(files: list[tuple[int, str]]) -> None:
        real(files)
        synced.extend(name for _, name in files)

    monkeypatch.setattr(barrier, "_syncfs", lambda fd: False)
    monkeypatch.setattr(barrier, "_fsync_each", counted)
    result = await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert len(result["written"]) == FILES and len(set(synced)) == FILES
    assert all(name.startswith(fileops.TEMP_PREFIX) for name in synced)
    assert oracle_tree(wt) == cp["tree"] and temps_left(wt) == []


async def test_a_small_restore_syncs_every_copy_before_the_first_rename_without_a_syncfs(engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = [f"s{i}.txt" for i in range(5)]
    wt = make_repo(tmp_path / "wt", {rel: f"{rel} at A\n" for rel in small})
    cp = await checkpoint(engine, wt)
    for rel in small:
        (wt / rel).write_text("edited\n")
    seen: dict[str, Any] = {}
    real = barrier._fsync_each

    def look(files: list[tuple[int, str]]) -> None:
        seen["on disk"] = {rel: (wt / rel).read_text() for rel in small}
        seen["temps"] = len(temps_left(wt))
        seen["synced"] = sorted(name for _, name in files)
        real(files)

    def no_syncfs(fd: int) -> bool:
        raise AssertionError("a small restore flushed the whole file system")

    monkeypatch.setattr(barrier, "_fsync_each", look)
    monkeypatch.setattr(barrier, "_syncfs", no_syncfs)
    result = await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert sorted(result["written"]) == small
    assert seen["on disk"] == dict.fromkeys(small, "edited\n")  # no target replaced yet
    assert seen["temps"] == len(seen["synced"]) == len(small)
    assert all(name.startswith(fileops.TEMP_PREFIX) for name in seen["synced"])
    assert oracle_tree(wt) == cp["tree"] and temps_left(wt) == []
