"""The restore's file operations (snapshotd.restore.fileops), directly, on real folders."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from repo_helpers import git, write

from snapshotd.errors import InvalidParams, PathBlocked
from snapshotd.restore import fileops
from snapshotd.restore.fileops import TEMP_PREFIX


@pytest.fixture
def root(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A worktree folder, an outside folder with a file, and the worktree's descriptor."""
    wt = tmp_path / "wt"
    wt.mkdir()
    write(tmp_path / "outside" / "victim.txt", "outside\n")
    fd = os.open(wt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield wt, fd
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["", ".", "..", ".git", ".GIT", "a/b", "a\0b"])
def test_unsafe_names_are_refused(name: str) -> None:
    assert not fileops.safe_name(name)
    if "/" not in name:  # a slash only separates components of a path
        with pytest.raises(InvalidParams, match="not a safe worktree path"):
            fileops.split_path(f"ok/{name}/x")


def test_open_dir_creates_missing_folders_and_lists_them(root: tuple[Path, int]) -> None:
    wt, fd = root
    created: list[str] = []
    child = fileops.open_dir(fd, ["a", "b", "c"], create=True, created=created)
    os.close(child)
    assert created == ["a", "a/b", "a/b/c"]
    assert (wt / "a" / "b" / "c").is_dir()
    with pytest.raises(FileNotFoundError):
        fileops.open_dir(fd, ["a", "missing"], create=False)


@pytest.mark.parametrize("create", [False, True])
def test_open_dir_never_goes_through_a_symlink_or_a_file(root: tuple[Path, int], create: bool) -> None:
    wt, fd = root
    (wt / "ln").symlink_to(wt.parent / "outside")
    write(wt / "afile", "a file\n")
    with pytest.raises(PathBlocked) as link:
        fileops.open_dir(fd, ["ln", "deeper"], create=create)
    assert (link.value.path, link.value.is_link) == ("ln", True)
    with pytest.raises(PathBlocked) as plain:
        fileops.open_dir(fd, ["afile", "deeper"], create=create)
    assert (plain.value.path, plain.value.is_link) == ("afile", False)
    assert os.listdir(wt.parent / "outside") == ["victim.txt"]


def test_remove_temp_removes_only_our_temporary_files(root: tuple[Path, int]) -> None:
    wt, fd = root
    write(wt / "d" / f"{TEMP_PREFIX}1", "half written")
    write(wt / "d" / "real.txt", "a user's file\n")
    (wt / "d" / f"{TEMP_PREFIX}dir").mkdir()
    (wt / "ln").symlink_to(wt.parent / "outside")
    assert fileops.remove_temp(fd, f"d/{TEMP_PREFIX}1")
    assert not fileops.remove_temp(fd, "d/real.txt")
    assert not fileops.remove_temp(fd, f"d/{TEMP_PREFIX}dir")
    assert not fileops.remove_temp(fd, f"ln/{TEMP_PREFIX}victim")
    assert not fileops.remove_temp(fd, f"../outside/{TEMP_PREFIX}x")
    assert sorted(os.listdir(wt / "d")) == [f"{TEMP_PREFIX}dir", "real.txt"]
    assert os.listdir(wt.parent / "outside") == ["victim.txt"]


def test_remove_empty_tree_keeps_a_folder_holding_anything(root: tuple[Path, int]) -> None:
    wt, fd = root
    (wt / "empty" / "a" / "b").mkdir(parents=True)
    write(wt / "full" / "a" / "keep.txt", "keep\n")
    assert fileops.remove_empty_tree(fd, "empty")
    assert not fileops.remove_empty_tree(fd, "full")
    assert sorted(os.listdir(wt)) == ["full"]
    assert (wt / "full" / "a" / "keep.txt").read_text() == "keep\n"


def test_read_at_reads_only_regular_files(root: tuple[Path, int]) -> None:
    wt, fd = root
    write(wt / "f.txt", b"bytes\n")
    (wt / "ln").symlink_to(wt.parent / "outside" / "victim.txt")
    os.mkfifo(wt / "fifo")
    assert fileops.read_at(fd, "f.txt") == b"bytes\n"
    assert fileops.read_at(fd, "ln") is None
    assert fileops.read_at(fd, "fifo") is None  # and it did not block
    assert fileops.read_at(fd, "missing") is None
    reader = fileops.DiskReader(fd)
    try:
        assert reader.read("ln/victim.txt") is None
        assert reader.read("f.txt") == b"bytes\n"
    finally:
        reader.close()


def test_blob_id_is_gits(root: tuple[Path, int]) -> None:
    wt, _ = root
    data = b"some content\r\n\0with a nul\n"
    write(wt / "f", data)
    expected = git(wt.parent, "hash-object", "--no-filters", str(wt / "f"))
    assert fileops.blob_id(data, "0" * 40) == expected


@pytest.mark.parametrize(
    ("mode", "existing", "umask", "expected"),
    [
        (0o100644, None, 0o022, 0o644),
        (0o100755, None, 0o022, 0o755),
        (0o100755, None, 0o077, 0o700),
        (0o100644, 0o100750, 0o022, 0o640),  # the old file's bits, exec bits dropped
        (0o100755, 0o100640, 0o022, 0o750),  # exec added where read is allowed
    ],
)
def test_file_permissions_follow_the_old_file_and_the_umask(
    mode: int, existing: int | None, umask: int, expected: int
) -> None:
    old = os.stat_result((existing, 0, 0, 1, 0, 0, 0, 0, 0, 0)) if existing is not None else None
    assert fileops.file_permissions(mode, old, umask) == expected


def test_copy_entry_keeps_bytes_mode_and_link_target(root: tuple[Path, int], tmp_path: Path) -> None:
    wt, fd = root
    write(wt / "run.sh", b"#!/bin/sh\n", mode=0o750)
    (wt / "ln").symlink_to("run.sh")
    backup = tmp_path / "backup"
    backup.mkdir()
    backup_fd = os.open(backup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fileops.copy_entry(fd, "run.sh", backup_fd, "1")
        fileops.copy_entry(fd, "ln", backup_fd, "2")
    finally:
        os.close(backup_fd)
    assert (backup / "1").read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE((backup / "1").stat().st_mode) == 0o750
    assert os.readlink(backup / "2") == "run.sh"


def test_disk_reader_reads_files_without_a_link_and_opens_each_folder_once(root, tmp_path, monkeypatch):
    wt, fd = root
    write(wt / "a/b/.gitattributes", "*.txt text\n")
    write(wt / "a/.gitattributes", "* -text\n")
    write(tmp_path / "outside/.gitattributes", "secret\n")
    (wt / "link").symlink_to(tmp_path / "outside")
    write(wt / "file", "not a folder\n")
    os.mkfifo(wt / "a/fifo")
    opened: list[str] = []
    real_open = os.open

    def counting(path, flags, *args, **kwargs):
        opened.append(path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(fileops.os, "open", counting)
    reader = fileops.DiskReader(fd)
    try:
        assert reader.read("a/b/.gitattributes") == b"*.txt text\n"
        assert reader.read("a/.gitattributes") == b"* -text\n"
        assert reader.read("a/b/missing") is None
        assert reader.read("link/.gitattributes") is None  # never through a symlink
        assert reader.read("file/.gitattributes") is None
        assert reader.read("gone/x/.gitattributes") is None
        assert reader.read("a/fifo") is None  # and never blocking on a FIFO
        assert reader.read(".gitattributes") is None
    finally:
        reader.close()
    folders = [name for name in opened if name in ("a", "b", "link", "file", "gone")]
    assert sorted(folders) == ["a", "b", "file", "gone", "link"]  # each opened once, from its parent
