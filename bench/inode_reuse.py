"""What making a file costs on a file system in the minutes after many files near it were removed.

Usage: ``python -m bench.inode_reuse [FOLDER] [--files 20000] [--probe 2000] [--waits 0,35,70]``

In a new folder (under ``FOLDER``, the checkout's ``bench/work`` by default) it makes ``--files``
empty files, removes them, then makes ``--probe`` more after each wait in ``--waits`` (seconds from
the removal), printing µs a file and the disk's reads and writes meanwhile (``/proc/diskstats``,
the file system's device). A restore frees as many inodes as it writes, ``git checkout-index``
too, and the background packing frees every loose object it packs; on this project's ext4
without a journal the files made afterwards cost several times more (see ``bench/README.md``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from .common import WORK


def _device_io(folder: str) -> tuple[int, int] | None:
    """Reads and writes completed so far by the device holding ``folder`` (None when not found)."""
    dev = os.stat(folder).st_dev
    wanted = (os.major(dev), os.minor(dev))
    with open("/proc/diskstats") as stats:
        for line in stats:
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == wanted:
                return int(fields[3]), int(fields[7])
    return None


def _make(folder: str, count: int, tag: str) -> str:
    before = _device_io(folder)
    started = time.perf_counter()
    for index in range(count):
        os.close(os.open(os.path.join(folder, f"{tag}{index}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    each = (time.perf_counter() - started) / count * 1e6
    after = _device_io(folder)
    io = "" if before is None or after is None else f", disk reads {after[0] - before[0]}, writes {after[1] - before[1]}"
    return f"{each:.0f} µs a file{io}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=WORK)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--probe", type=int, default=2000)
    parser.add_argument("--waits", default="0,35,70", help="seconds after the removal, ascending")
    options = parser.parse_args()
    options.folder.mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="inode-reuse-", dir=options.folder)
    try:
        print(f"{options.files} files made: {_make(folder, options.files, 'a')}")
        for index in range(options.files):
            os.unlink(os.path.join(folder, f"a{index}"))
        removed = time.monotonic()
        for round_, wait in enumerate(float(w) for w in options.waits.split(",")):
            time.sleep(max(0.0, removed + wait - time.monotonic()))
            print(f"{wait:.0f} s after removing them, {options.probe} made: {_make(folder, options.probe, f'p{round_}-')}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
