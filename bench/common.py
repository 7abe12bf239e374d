"""Shared helpers of the benchmark: where things live, git for set-up work, statistics."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
WORK = BENCH_DIR / "work"
RESULTS = BENCH_DIR / "results"

WORKLOAD_CPU = """
TICK = os.sysconf("SC_CLK_TCK")

def cpu_s():  # this process's threads and the children it has reaped (git), from /proc
    with open("/proc/self/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return sum(int(value) for value in fields[11:15]) / TICK
"""
"""The CPU reader of a workload script run in its own interpreter (it may run another checkout's snapshotd)."""

# Variables of the caller that would point git somewhere else than the tree under test.
_REDIRECTING = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
)

IDENTITY = {
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
}

# Every git the benchmark runs (set-up and peer methods alike) gets these: no
# automatic gc in the middle of a timing, no fsmonitor or untracked cache that
# only some machines have.
GIT_CONFIG = (
    "-c", "gc.auto=0",
    "-c", "maintenance.auto=false",
    "-c", "core.fsmonitor=false",
    "-c", "core.untrackedCache=false",
    "-c", "commit.gpgsign=false",
    "-c", "advice.detachedHead=false",
)


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A git environment with nothing inherited that redirects git, and a fixed identity.

    ``GIT_OPTIONAL_LOCKS=0`` keeps read-only commands (``status``, ``diff``)
    from rewriting the user's index to refresh it, so no method changes the
    state that the next one measures.
    """
    env = {k: v for k, v in os.environ.items() if k not in _REDIRECTING}
    env.update(IDENTITY)
    env["LC_ALL"] = "C"
    env["GIT_OPTIONAL_LOCKS"] = "0"
    if extra:
        env.update(extra)
    return env


def git(
    cwd: str | os.PathLike[str],
    *args: str,
    env_extra: Mapping[str, str] | None = None,
    input: bytes | None = None,
    ok: Sequence[int] = (0,),
) -> bytes:
    """Run one git command for set-up work (not counted); raise on failure."""
    proc = subprocess.run(
        ["git", *GIT_CONFIG, *args],
        cwd=cwd,
        env=git_env(env_extra),
        input=input,
        capture_output=True,
        check=False,
    )
    if proc.returncode not in ok:
        raise RuntimeError(
            f"git {' '.join(args)} in {cwd} exited {proc.returncode}: "
            f"{proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout


def refresh_index(cwd: str | os.PathLike[str]) -> None:
    """Bring the user's index up to date with the files, past git's racy window.

    Files written in the same second as the index are "racily clean": git
    re-reads them on every later ``status``. Waiting past the timestamp
    granularity first makes every entry trustworthy again, as on a real
    worktree whose files were not all written a moment ago.
    """
    time.sleep(1.05)
    git(cwd, "update-index", "-q", "--refresh", ok=(0, 1))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def summarize(values: Iterable[float]) -> dict[str, Any]:
    """n, median, p90, p99, min and max of ``values`` (milliseconds, rounded)."""
    data = [float(v) for v in values]
    if not data:
        return {"n": 0}
    return {
        "n": len(data),
        "median": round(percentile(data, 50), 3),
        "p90": round(percentile(data, 90), 3),
        "p99": round(percentile(data, 99), 3),
        "min": round(min(data), 3),
        "max": round(max(data), 3),
    }


def human_count(n: int) -> str:
    """5000 -> '5k', 200000 -> '200k'."""
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    import platform

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus_usable": len(os.sched_getaffinity(0)),
    }
    try:
        info["git"] = subprocess.run(
            ["git", "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["git"] = None
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as fh:
            info["mem_total_kib"] = int(fh.readline().split()[1])
    except OSError:
        pass
    try:
        import pygit2

        info["pygit2"] = pygit2.__version__
        info["libgit2"] = pygit2.LIBGIT2_VERSION
    except ImportError:
        pass
    return info


SETTLE_S = 6.0  # past ext4's 5 s "recently deleted" window once the deletions are written back


def settle_deletions() -> None:
    """Let the file system forget the files just deleted before the next run creates its own.

    ext4 without a journal skips, at each new file, every inode freed in the
    last 5 s, or in the last 305 s while the freed inode's table block is not
    yet written back: after the scale run's prune of its sessions, each file the
    next daemon made scanned past tens of thousands of them, and whichever daemon
    ran second showed a p99 2 to 4 times the first's. Writing back and waiting out the
    5 s makes the runs start alike (and costs nothing elsewhere).
    """
    os.sync()
    time.sleep(SETTLE_S)


def two_checkouts_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments of a bench that runs two checkouts side by side on one synthetic repository:
    OLD [NEW], ``--rounds``, ``--files`` and ``--work``; the caller adds its own."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path, nargs="?", default=REPO_ROOT)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--work", type=Path, default=WORK, help="where the repository goes (default: bench/work)")
    return parser
