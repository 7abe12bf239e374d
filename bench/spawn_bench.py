"""Spawn latency of ``git --version``, every way snapshotd could start a process.

Each way runs the command N times (after a warm-up; the ways take turns so that
drift on a busy machine hits them all alike) at the current process size, then
again after the process has allocated and touched a large bytearray (2 GiB by
default), because a real fork copies page tables and grows with memory while
vfork-style starts should not. Prints a markdown table of median and p99
latencies and writes everything to the JSON file given by --out.

    python bench/spawn_bench.py --runs 300 --out /tmp/spawn.json

On a machine busy with other work, ``chrt -f 10 python bench/spawn_bench.py ...``
keeps that work from dominating the figures (the scheduler is recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from snapshotd.git import child, spawn

ARGV = ["git", "--version"]


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def summarize(samples_ns: list[int]) -> dict[str, float]:
    ms = sorted(s / 1e6 for s in samples_ns)
    p99 = ms[max(0, -(-99 * len(ms) // 100) - 1)]
    return {
        "n": len(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": p99,
        "mean_ms": statistics.fmean(ms),
        "min_ms": ms[0],
        "max_ms": ms[-1],
    }


def make_sync_ways(env: dict[str, str], cwd: str) -> dict[str, Callable[[], object]]:
    git = shutil.which("git", path=env["PATH"])
    assert git is not None, "git is not on PATH"

    def snapshotd_native() -> None:
        result = spawn.run_sync(ARGV, cwd=cwd, env=env)
        assert result.returncode == 0 and result.stdout.startswith(b"git version")

    def snapshotd_fallback() -> None:
        saved = child._lib
        child._lib = None
        try:
            result = spawn.run_sync(ARGV, cwd=cwd, env=env)
        finally:
            child._lib = saved
        assert result.returncode == 0 and result.stdout.startswith(b"git version")

    def subprocess_run() -> None:
        result = subprocess.run(ARGV, cwd=cwd, env=env, capture_output=True)
        assert result.returncode == 0

    def posix_spawn_waitpid() -> None:
        pid = os.posix_spawn(
            git,
            ARGV,
            env,
            file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)],
        )
        _, status = os.waitpid(pid, 0)
        assert status == 0

    def fork_exec() -> None:
        pid = os.fork()
        if pid == 0:  # child
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.execve(git, ARGV, env)
            finally:
                os._exit(127)
        _, status = os.waitpid(pid, 0)
        assert status == 0

    ways: dict[str, Callable[[], object]] = {}
    if spawn.NATIVE:
        ways["snapshotd.git.spawn.run_sync (native helper)"] = snapshotd_native
    ways["snapshotd.git.spawn.run_sync (subprocess fallback)"] = snapshotd_fallback
    ways["subprocess.run(capture_output=True)"] = subprocess_run
    ways["os.posix_spawn + waitpid (no pipes)"] = posix_spawn_waitpid
    ways[FORK] = fork_exec
    return ways


def make_trio_ways(env: dict[str, str], cwd: str) -> dict[str, Callable[[], Awaitable[object]]]:
    ways: dict[str, Callable[[], Awaitable[object]]] = {}
    if spawn.NATIVE:
        ways["snapshotd.git.spawn.run (trio, native helper)"] = lambda: spawn.run(
            ARGV, cwd=cwd, env=env
        )
    ways["trio.run_process(capture_stdout=True)"] = lambda: trio.run_process(
        ARGV, cwd=cwd, env=env, capture_stdout=True
    )
    return ways


FORK = "os.fork + execve + waitpid (reference)"


def measure(runs: int, warmup: int) -> dict[str, dict[str, float]]:
    """Time every way.

    The vfork-style ways take turns (in rotating order) so drift hits them all
    alike. The fork reference runs on its own afterwards: a fork write-protects
    every page of the parent, so whatever ran right after it would pay page
    faults that are not its own.
    """
    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"}
    cwd = os.getcwd()
    sync_ways = make_sync_ways(env, cwd)
    fork_exec = sync_ways.pop(FORK)
    trio_ways = make_trio_ways(env, cwd)
    names = [*sync_ways, *trio_ways]
    samples: dict[str, list[int]] = {name: [] for name in [*names, FORK]}

    async def main() -> None:
        for i in range(warmup + runs):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter_ns()
                if name in sync_ways:
                    sync_ways[name]()
                else:
                    await trio_ways[name]()
                if i >= warmup:
                    samples[name].append(time.perf_counter_ns() - start)

    trio.run(main)
    for i in range(warmup + runs):
        start = time.perf_counter_ns()
        fork_exec()
        if i >= warmup:
            samples[FORK].append(time.perf_counter_ns() - start)
    return {name: summarize(samples[name]) for name in [*names, FORK]}


def touch_memory(gib: float) -> bytearray:
    size = int(gib * (1 << 30))
    block = bytearray(size)
    block[::4096] = b"\x01" * len(range(0, size, 4096))  # fault in every page
    return block


def markdown(stages: list[dict[str, Any]]) -> str:
    header = "| way |" + "".join(
        f" median ms ({s['label']}) | p99 ms ({s['label']}) |" for s in stages
    )
    rule = "|---|" + "---:|---:|" * len(stages)
    rows = []
    for name in stages[0]["results"]:
        cells = "".join(
            f" {s['results'][name]['median_ms']:.3f} | {s['results'][name]['p99_ms']:.3f} |"
            for s in stages
        )
        rows.append(f"| {name} |{cells}")
    return "\n".join([header, rule, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="timed runs per way and size")
    parser.add_argument("--warmup", type=int, default=20, help="untimed runs first")
    parser.add_argument(
        "--memory-gib", type=float, default=2.0, help="memory to allocate and touch"
    )
    parser.add_argument("--out", required=True, help="where to write the JSON results")
    args = parser.parse_args()

    load_before = os.getloadavg()
    stages = []
    rss = rss_mib()
    stages.append(
        {"label": f"RSS {rss:.0f} MiB", "rss_mib": rss, "results": measure(args.runs, args.warmup)}
    )
    block = touch_memory(args.memory_gib)
    rss = rss_mib()
    stages.append(
        {"label": f"RSS {rss:.0f} MiB", "rss_mib": rss, "results": measure(args.runs, args.warmup)}
    )
    del block

    git_version = subprocess.run(ARGV, capture_output=True, text=True).stdout.strip()
    report = {
        "command": ARGV,
        "runs": args.runs,
        "warmup": args.warmup,
        "memory_gib": args.memory_gib,
        "native": spawn.NATIVE,
        "native_error": spawn.NATIVE_ERROR,
        "python": sys.version.split()[0],
        "libc": " ".join(platform.libc_ver()),
        "kernel": platform.release(),
        "cpus": len(os.sched_getaffinity(0)),
        "git": git_version,
        # Latencies are only comparable on a quiet machine; this says how quiet.
        "loadavg_1min": {"before": load_before[0], "after": os.getloadavg()[0]},
        "scheduler": {
            os.SCHED_OTHER: "SCHED_OTHER",
            os.SCHED_FIFO: "SCHED_FIFO",
            os.SCHED_RR: "SCHED_RR",
        }.get(os.sched_getscheduler(0), str(os.sched_getscheduler(0))),
        "stages": stages,
    }
    with open(args.out, "w") as out:
        json.dump(report, out, indent=2)
        out.write("\n")
    print(markdown(stages))
    print(
        f"\n{git_version}; Python {report['python']}; {report['libc']}; {report['cpus']} CPUs;"
        f" load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )


if __name__ == "__main__":
    main()
