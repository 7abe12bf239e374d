"""A checkpoint's new objects written loose, one file each, against one small pack, flushed as a record does.

Usage: ``python -m bench.pack_vs_loose [FOLDER] [--objects 8] [--rounds 300]``

In two new bare repositories under ``FOLDER`` (the checkout's ``bench/work`` by default), each
round writes ``--objects`` new blobs of about 200 bytes (what a one-file checkpoint writes: the
blob, the trees above it, the commit and its pin) into one repository as loose objects
(:func:`snapshotd.git.loose.write_object`) and into the other as one pack
(:class:`snapshotd.git.loose.Batch`), each followed by :func:`snapshotd.git.loose.make_durable`,
the order alternating. It prints the wall and CPU time (this process, user and system, from
``getrusage``) per round of each. What a pack a checkpoint would cost beyond this (many small
packs to roll up, and libgit2 keeping every pack it has listed) is in ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from snapshotd.git import loose
from snapshotd.git.packwrite import PackedObject

from .common import WORK


def _cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_stime


def _bodies(round_: int, count: int) -> list[bytes]:
    return [os.urandom(200) + b"%d %d" % (round_, index) for index in range(count)]


def _loose(git_dir: str, bodies: list[bytes]) -> None:
    for body in bodies:
        loose.write_object(git_dir, "blob", body)
    loose.make_durable(git_dir)


def _pack(git_dir: str, bodies: list[bytes]) -> None:
    batch = loose.Batch(git_dir)
    for body in bodies:
        batch.add(PackedObject(hashlib.sha1(loose.with_header("blob", body)).digest(), "blob", body))
    batch.write()  # one pack: PACK_AT_LEAST is 1 here (see main)
    loose.make_durable(git_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=WORK)
    parser.add_argument("--objects", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=300)
    options = parser.parse_args()
    loose.PACK_AT_LEAST = 1  # a capture packs from 32 new objects; here every round's objects are one pack
    options.folder.mkdir(parents=True, exist_ok=True)
    root = tempfile.mkdtemp(prefix="pack-vs-loose-", dir=options.folder)
    try:
        ways: dict[str, tuple[Callable[[str, list[bytes]], None], str]] = {}
        for name, write in (("loose", _loose), ("pack", _pack)):
            git_dir = os.path.join(root, name)
            subprocess.run(["git", "init", "-q", "--bare", git_dir], check=True)
            ways[name] = (write, git_dir)
        totals = {name: [0.0, 0.0, 0.0] for name in ways}
        for round_ in range(options.rounds):
            order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
            for name in order:
                write, git_dir = ways[name]
                bodies = _bodies(round_, options.objects)
                wall, (cpu, system) = time.perf_counter(), _cpu()
                write(git_dir, bodies)
                cpu_after, system_after = _cpu()
                total = totals[name]
                total[0] += time.perf_counter() - wall
                total[1] += cpu_after - cpu
                total[2] += system_after - system
        for name, (wall, cpu, system) in totals.items():
            per = 1000 / options.rounds
            print(f"{name}: wall {wall * per:.2f} ms, CPU {cpu * per:.2f} ms (system {system * per:.2f}) "
                  f"per {options.objects} objects")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
