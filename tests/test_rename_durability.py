"""A loose object's folder is left unsynced only where a crash right after the file's fsync keeps the rename.

Checked on the real kernel: a small ext4 is made on a loop device, an object
is written under a temporary name, renamed, and only the file is fsynced (as
:func:`snapshotd.git.loose.make_durable` does where
:func:`~snapshotd.git.flush.fsync_covers_rename` says so); then the device
is copied as it stands, which is what a crash at that moment leaves, and the
copy is mounted (its journal replayed). The same without any fsync shows the
copy does lose what was not made durable. Needs root and loop devices.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshotd.git import flush

BODY = b"object bytes\n" * 100


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def _can_mount_loop() -> str | None:
    """Why loop mounts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "mounting a loop device needs root"
    for tool in ("mkfs.ext4", "mount", "umount", "findmnt", "dd"):
        if shutil.which(tool) is None:
            return f"{tool} is missing"
    return None


class Device:
    """An ext4 image with ``features`` (mkfs.ext4 -O) mounted on a loop device (with a journal, commit=60: no
    periodic commit within a test)."""

    def __init__(self, root: Path, features: str) -> None:
        self.image = root / "fs.img"
        self.mount = root / "mnt"
        self.copy = root / "copy.img"
        self.copy_mount = root / "copy"
        self.mount.mkdir()
        self.copy_mount.mkdir()
        with open(self.image, "wb") as image:
            image.truncate(64 * 1024 * 1024)
        journal = "^has_journal" not in features
        _run("mkfs.ext4", "-q", "-F", *(["-O", features] if features else []), str(self.image))
        _run("mount", "-o", "loop,commit=60" if journal else "loop", str(self.image), str(self.mount))
        try:
            self.loop = _run("findmnt", "-n", "-o", "SOURCE", "--target", str(self.mount))
        except BaseException:
            self.close()
            raise

    def crash_copy(self) -> Path:
        """The device as it stands now, mounted elsewhere: what a crash at this moment leaves."""
        _run("dd", f"if={self.loop}", f"of={self.copy}", "bs=4M", "iflag=direct", "status=none")
        _run("mount", "-o", "loop", str(self.copy), str(self.copy_mount))
        return self.copy_mount

    def drop_copy(self) -> None:
        _run("umount", str(self.copy_mount))
        self.copy.unlink()

    def close(self) -> None:
        subprocess.run(["umount", str(self.copy_mount)], capture_output=True)
        subprocess.run(["umount", str(self.mount)], capture_output=True)


@pytest.fixture
def device(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Device]:
    why = _can_mount_loop()
    if why is not None:
        pytest.skip(why)
    features = getattr(request, "param", "")
    try:
        made = Device(tmp_path, features)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"an ext4 ({features or 'defaults'}) could not be made and mounted on a loop device here: {exc.stderr.strip() or exc}")
    try:
        yield made
    finally:
        made.close()


def _write_object(folder: Path, name: str, fsync_file: bool) -> None:
    """As the loose writer does: a temporary file, renamed into ``folder``; then only the file fsynced, or nothing."""
    folder.mkdir(exist_ok=True)
    temporary = folder / f"tmp_obj_{name}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    os.write(fd, BODY)
    os.close(fd)
    os.rename(temporary, folder / name)
    if fsync_file:
        fd = os.open(folder / name, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


@pytest.mark.parametrize("device", ["", "fast_commit"], indirect=True, ids=["journal", "fast-commits"])
def test_on_a_journaled_ext4_the_files_fsync_keeps_its_rename_through_a_crash(device: Device) -> None:
    assert flush.fsync_covers_rename(str(device.mount)) is True
    (device.mount / "objects").mkdir()
    (device.mount / "objects" / "ab").mkdir()
    os.sync()
    cases = [("ab", "in-an-old-folder", True), ("cd", "in-a-new-folder", True), ("ef", "never-fsynced", False)]
    for folder, name, fsync_file in cases:
        _write_object(device.mount / "objects" / folder, name, fsync_file)
        left = device.crash_copy()
        try:
            kept = left / "objects" / folder / name
            if fsync_file:
                assert kept.read_bytes() == BODY, name
            else:  # the copy does lose what was not made durable: the check above can fail
                assert not kept.exists(), name
        finally:
            device.drop_copy()


@pytest.mark.parametrize("device", ["^has_journal"], indirect=True, ids=["no-journal"])
def test_an_ext4_without_a_journal_keeps_its_folders_fsynced(device: Device) -> None:
    assert flush.fsync_covers_rename(str(device.mount)) is False
