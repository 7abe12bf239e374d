"""A checkpoint's record on a busy disk: ``syncfs`` of the store's file system against an fsync of what it wrote.

One repository, one session. Each round writes a new blob (a turn's edit),
edits it into the tree and records one checkpoint (``Store.record_many``: the
commit, the pin, the flush, the ref), timing the record's wall time and the
flush inside it. The rounds alternate between the two flushes: ``syncfs``
(what ``make_durable`` did before: the whole file system, other processes'
dirty data too) and ``fsync`` (the files the record wrote, then their
folders: ``git/loose.make_durable`` now). A quiet phase first, then a busy
one, with another process writing 50 MB files without fsync in the same file
system the whole time (the disk's dirty data, as 250 sessions writing files).

    .venv/bin/python -m bench.durability [--rounds 150] [--quiet-rounds 30] [--name NAME]

Writes ``bench/results/<date>-<name>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pygit2

from snapshotd.capture.treeedit import edit_tree
from snapshotd.git import loose
from snapshotd.git.flush import sync_filesystem
from snapshotd.git.libgit import LibgitRepository
from snapshotd.git.modes import MODE_FILE
from snapshotd.store.checkpoints import Store

RESULTS = Path(__file__).resolve().parent / "results"
WRITER = """
import os, sys, time
folder, size, rate, keep = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
chunk = os.urandom(1 << 20)
written, start, n = 0, time.monotonic(), 0
while not os.path.exists(os.path.join(folder, "stop")):
    with open(os.path.join(folder, f"busy-{n}"), "wb") as handle:  # new files: their dirty pages stay
        for _ in range(size):
            handle.write(chunk)
            written += 1
            time.sleep(max(0.0, start + written / rate - time.monotonic()))
    if n >= keep:
        os.unlink(os.path.join(folder, f"busy-{n - keep}"))
    n += 1
with open(os.path.join(folder, "written"), "w") as handle:
    handle.write(f"{written} {time.monotonic() - start}")
"""


def _syncfs_flush(git_dir: str) -> None:
    """The flush before: what was written is dropped from the list and the whole file system flushed."""
    loose._written.take()
    sync_filesystem(git_dir)


def _dirty_kb() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("Dirty:"):
                return int(line.split()[1])
    return 0


class Bench:
    def __init__(self, folder: Path) -> None:
        root = folder / "repo"
        root.mkdir()
        for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
            subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
        self.repo = LibgitRepository(str(root / ".git"))
        self.store = Store(self.repo)
        self.tree = self.repo.head.peel(pygit2.Tree).id
        self.real_flush = loose._flush
        self.round = 0

    def record(self, mode: str) -> tuple[float, float]:
        """One checkpoint of a new edit under ``mode``: (record ms, flush ms)."""
        self.round += 1
        blob = loose.write_object(self.repo.path, "blob", f"turn {self.round} {time.time_ns()}\n".encode())
        tree, _ = edit_tree(self.repo, self.tree, {f"src/turn-{self.round % 50}.txt": (blob, MODE_FILE)})
        self.tree = self.repo.oid(tree)
        flushed: list[float] = []
        inner = self.real_flush if mode == "fsync" else (lambda: _syncfs_flush(self.repo.path))

        def timed() -> None:
            start = time.perf_counter()
            inner()
            flushed.append((time.perf_counter() - start) * 1000)

        loose._flush = timed
        try:
            start = time.perf_counter()
            self.store.record_many(worktree_id="w", requests=[("s", None, ())], tree=tree, base=None)
            took = (time.perf_counter() - start) * 1000
        finally:
            loose._flush = self.real_flush
        return took, sum(flushed)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _phase(bench: Bench, rounds: int, pause: float, seconds: float) -> dict[str, dict[str, list[float]]]:
    samples: dict[str, dict[str, list[float]]] = {m: {"record": [], "flush": []} for m in ("syncfs", "fsync")}
    end = time.monotonic() + seconds
    for index in range(rounds * 2):
        if time.monotonic() > end and index % 2 == 0:
            break
        mode = ("syncfs", "fsync")[index % 2]
        took, flushed = bench.record(mode)
        samples[mode]["record"].append(took)
        samples[mode]["flush"].append(flushed)
        time.sleep(pause)  # a turn's think time: the writer's dirty data builds up between checkpoints
    return samples


def _rows(name: str, samples: dict[str, dict[str, list[float]]]) -> list[str]:
    rows = []
    for mode, each in samples.items():
        record, flush = each["record"], each["flush"]
        rows.append(
            f"| {name} | {mode} | {len(record)} | {statistics.median(record):.2f} | {_quantile(record, 0.99):.2f} "
            f"| {max(record):.2f} | {statistics.median(flush):.2f} | {_quantile(flush, 0.99):.2f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150, help="busy rounds of each flush")
    parser.add_argument("--quiet-rounds", type=int, default=30, help="rounds of each before the writer starts")
    parser.add_argument("--file-mb", type=int, default=50, help="size of each file the busy writer writes")
    parser.add_argument("--writer-mbps", type=float, default=200, help="the busy writer's rate, MB/s")
    parser.add_argument("--keep-files", type=int, default=160, help="files the writer keeps before deleting the oldest")
    parser.add_argument("--seconds", type=float, default=120, help="the busy phase's longest")
    parser.add_argument("--pause", type=float, default=0.1, help="seconds between checkpoints")
    parser.add_argument("--name", default="durability")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="snapshotd-durability-") as tmp:
        folder = Path(tmp)
        bench = Bench(folder)
        quiet = _phase(bench, args.quiet_rounds, args.pause, args.seconds)
        busy_dir = folder / "busy"
        busy_dir.mkdir()
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(busy_dir), str(args.file_mb), str(args.writer_mbps), str(args.keep_files)])
        try:
            time.sleep(5)  # the writer's dirty data builds up
            dirty_before = _dirty_kb()
            load_before = os.getloadavg()[0]
            began = time.monotonic()
            busy = _phase(bench, args.rounds, args.pause, args.seconds)
            dirty_after, load_after = _dirty_kb(), os.getloadavg()[0]
            elapsed = time.monotonic() - began
        finally:
            (busy_dir / "stop").touch()
            writer.wait(timeout=120)
        written, seconds = (float(x) for x in (busy_dir / "written").read_text().split())
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"# A checkpoint's record on a busy disk: syncfs against fsync of what it wrote ({args.name})",
        "",
        f"`.venv/bin/python -m bench.durability --rounds {args.rounds} --quiet-rounds {args.quiet_rounds} "
        f"--file-mb {args.file_mb} --writer-mbps {args.writer_mbps:g}` at {commit}, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs; the rounds alternate between the two flushes.",
        f"Busy writer: {written / seconds:.0f} MB/s (asked {args.writer_mbps:g}) of {args.file_mb} MB files without fsync in the same file system; "
        f"Dirty {dirty_before // 1024}-{dirty_after // 1024} MB; load {load_before:.1f} -> {load_after:.1f}; "
        f"busy phase {elapsed:.0f} s.",
        "",
        "| disk | flush | records | record p50 ms | p99 ms | max ms | flush p50 ms | flush p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *_rows("quiet", quiet),
        *_rows("busy", busy),
        "",
    ]
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"{datetime.date.today():%Y-%m-%d}-{args.name}"
    stem.with_suffix(".md").write_text("\n".join(lines))
    stem.with_suffix(".json").write_text(json.dumps({"quiet": quiet, "busy": busy, "args": vars(args)}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
