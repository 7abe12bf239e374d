"""Many sessions at once, after T3 Code's method: every session captures before and after each turn.

N sessions (trio tasks in this process) are spread over K linked worktrees,
each with a daemon connection of its own, or (``pool``) sharing a few
connections, session ``i`` on connection ``i mod pool``, as an agent server
would. Sessions connect all at once, as a fleet's hooks do; a connection that
fails is counted apart (``connect_failures``). A session loops: ``checkpoint`` (before the turn),
think, edit one to three files (its own notes file and tracked files), then
``checkpoint`` (after the turn), think again. Captures that start inside a
fixed window, after a warm-up, are counted; every one must be answered (a
failure is an error or no answer within the call timeout). Meanwhile another
connection pings the daemon every 50 ms, and the daemon's CPU time and
resident memory are sampled with psutil.

With ``checkouts``, each level runs once per checkout's daemon (the order
alternating from level to level), so two versions are measured side by side
on the same trees and the same machine load. With ``profile``, py-spy records
the daemon during each window (``py-spy record --pid``, all threads, idle
ones left out) into a flame graph beside the results.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from snapshotd.client.rpc import AsyncClient

from .cases import edit, pick
from .common import git, settle_deletions, summarize
from .ours import Daemon, running_daemon
from .trees import Tree

CALL_TIMEOUT_S = 60.0
PING_EVERY_S = 0.05
RECONCILE_WAIT_S = 2.0
SLOWEST_SHOWN = 5


@dataclass
class Window:
    start: float = 0.0
    end: float = 0.0
    stop: bool = False
    latencies: list[float] = field(default_factory=list)
    scans: Counter[str] = field(default_factory=Counter)
    processes: int = 0
    failures: list[str] = field(default_factory=list)
    pings: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    started_in_window: int = 0
    connect_failures: list[str] = field(default_factory=list)
    pool: list[AsyncClient] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)  # the daemon's split of each capture's time
    halves: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))  # latencies by when they began
    late: list[dict[str, Any]] = field(default_factory=list)  # the second half's captures: what a slow one waited for

    def half(self, t: float) -> list[float]:
        """The latencies of captures begun in the window's first or second half (is the start's work still felt?)."""
        return self.halves[0] if t < self.start + (self.end - self.start) / 2 else self.halves[1]

    def inside(self, t: float) -> bool:
        return self.start <= t < self.end


@asynccontextmanager
async def _connection(index: int, daemon: Daemon, window: Window) -> AsyncIterator[AsyncClient | None]:
    """The session's connection: its own (None if it could not connect), or its share of the pool."""
    if window.pool:
        yield window.pool[index % len(window.pool)]
        return
    connected = False
    try:
        async with AsyncClient.connect(daemon.socket_path, connect_timeout=CALL_TIMEOUT_S) as client:
            connected = True
            yield client
    except Exception as exc:
        if connected:
            raise
        window.connect_failures.append(f"{type(exc).__name__}: {exc}"[:200])
        yield None


async def _session(
    index: int, tree: Tree, tracked: list[str], daemon: Daemon, window: Window, think: tuple[float, float]
) -> None:
    rng = random.Random(index)
    notes = Path(tree.path, "agent", f"s{index:03}.md")
    targets = pick(tracked, 2, salt=index * 7)
    session = f"scale-{index:03}"
    async with _connection(index, daemon, window) as client:
        if client is None:
            return

        async def capture(label: str) -> None:
            t0 = trio.current_time()
            counted = window.inside(t0)
            if counted:
                window.started_in_window += 1
            try:
                with trio.fail_after(CALL_TIMEOUT_S):
                    result = await client.call("checkpoint", path=tree.path, session=session, label=label)
            except Exception as exc:  # every failure is reported, none is retried
                if counted:
                    window.failures.append(f"{type(exc).__name__}: {exc}"[:200])
                return
            if counted:
                window.latencies.append((trio.current_time() - t0) * 1000)
                window.half(t0).append(window.latencies[-1])
                if window.half(t0) is window.halves[1]:
                    window.late.append({"ms": round(window.latencies[-1], 1), "began_s": round(t0 - window.start, 1),
                                        "scan": result["stats"]["scan"], "phases": result["stats"].get("phases", {})})
                window.scans[result["stats"]["scan"]] += 1
                for phase, ms in result["stats"].get("phases", {}).items():  # absent from an older daemon
                    window.phases.setdefault(phase, []).append(ms)
                window.processes += int(result["stats"]["processes"])

        await trio.sleep(rng.uniform(0, 2.0))  # sessions do not all start at once
        turn = 0
        while not window.stop:
            await capture(f"before turn {turn}")
            await trio.sleep(rng.uniform(*think))
            notes.parent.mkdir(parents=True, exist_ok=True)
            with open(notes, "a") as fh:
                fh.write(f"turn {turn}\n")
            edit(tree.path, targets[: rng.randint(0, 2)], f"s{index} t{turn}")
            await capture(f"after turn {turn}")
            await trio.sleep(rng.uniform(*think))
            turn += 1


async def _pinger(daemon: Daemon, window: Window) -> None:
    async with AsyncClient.connect(daemon.socket_path) as client:
        while not window.stop:
            t0 = trio.current_time()
            await client.call("ping")
            if window.inside(t0):
                window.pings.append((trio.current_time() - t0) * 1000)
            await trio.sleep(PING_EVERY_S)


async def _sampler(daemon: Daemon, window: Window) -> None:
    while not window.stop:
        if window.inside(trio.current_time()):
            window.rss.append(daemon.rss())
        await trio.sleep(0.25)


async def run_level(
    trees: list[Tree],
    sessions: int,
    *,
    window_s: float,
    warmup_s: float,
    think: tuple[float, float],
    pool: int = 0,
    checkout: str | None = None,
    profile: str | None = None,
    profile_gil: bool = False,
    log: Any = print,
) -> dict[str, Any]:
    """One run with ``sessions`` sessions over ``trees`` (sharing ``pool`` connections if set); its window's figures.

    ``checkout``: the daemon runs that checkout's code; ``profile``: py-spy records it during the window there.
    """
    tracked = {t.path: t.tracked() for t in trees}
    window = Window()
    spy: subprocess.Popen[bytes] | None = None
    async with running_daemon(f"scale-{sessions}", checkout=checkout) as daemon:
        now = trio.current_time()
        window.start = now + warmup_s
        window.end = window.start + window_s
        cpu_start = system_start = proc_start = own_start = None
        measured_for = window_s  # the CPU figures' own span: a starved loop wakes late from the window's end
        async with contextlib.AsyncExitStack() as shared:
            for _ in range(pool):  # closed only once every session has ended
                window.pool.append(await shared.enter_async_context(AsyncClient.connect(daemon.socket_path)))
            async with trio.open_nursery() as nursery:
                for i in range(sessions):
                    tree = trees[i % len(trees)]
                    nursery.start_soon(_session, i, tree, tracked[tree.path], daemon, window, think)
                nursery.start_soon(_pinger, daemon, window)
                nursery.start_soon(_sampler, daemon, window)
                await trio.sleep_until(window.start)
                if profile:
                    spy = _py_spy(daemon.pid, window_s, profile, profile_gil)
                cpu_start, system_start = daemon.cpu_seconds(), daemon.system_cpu_seconds()
                own_start, measured_from = time.process_time(), time.monotonic()
                proc_start = await daemon.processes_started()
                await trio.sleep_until(window.end)
                cpu_end, system_end = daemon.cpu_seconds(), daemon.system_cpu_seconds()
                own_end, measured_for = time.process_time(), time.monotonic() - measured_from
                proc_end = await daemon.processes_started()
                window.stop = True
        if spy is not None:
            await trio.to_thread.run_sync(spy.wait)
        log(f"    {sessions} sessions: window done, verifying each worktree ...")
        await trio.sleep(RECONCILE_WAIT_S)  # the sessions' last checkpoints answered
        for tree in trees:  # a full scan against the warm tree: each difference counts as a watch_miss
            await daemon.call("verify", {"path": str(tree.path)})
        status = await daemon.call("status")
        peak = daemon.peak_rss()
    objects = count_objects(trees[0].path)
    counters = status["counters"]
    completed = len(window.latencies)
    return {
        "checkout": checkout or "this",
        "profile": profile,
        "sessions": sessions,
        "connections": pool or sessions,
        "worktrees": len(trees),
        "files_per_worktree": trees[0].files,
        "window_s": window_s,
        "warmup_s": warmup_s,
        "think_s": list(think),
        "captures_started": window.started_in_window,
        "captures_completed": completed,
        "captures_per_s": round(completed / window_s, 2),
        "failures": len(window.failures),
        "failure_examples": window.failures[:5],
        "connect_failures": len(window.connect_failures),
        "connect_failure_examples": window.connect_failures[:5],
        "latency_ms": summarize(window.latencies),
        "latency_ms_by_half": [summarize(half) for half in window.halves],
        "phases_ms": {phase: summarize(values) for phase, values in window.phases.items()},
        "slowest_second_half": sorted(window.late, key=lambda each: -each["ms"])[:SLOWEST_SHOWN],
        "scans": dict(window.scans),
        "processes_in_window": proc_end - proc_start,
        "processes_per_capture": round((proc_end - proc_start) / max(completed, 1), 4),
        "stats_processes_in_window": window.processes,
        "daemon_cpu_cores": round((cpu_end - cpu_start) / measured_for, 3),
        "daemon_system_cpu_cores": round((system_end - system_start) / measured_for, 3),
        "bench_cpu_cores": round((own_end - own_start) / measured_for, 3),  # the sessions' own share of the 2 cores
        "daemon_rss_peak_in_window": max(window.rss) if window.rss else None,
        "daemon_rss_hwm": peak,
        "ping_ms": summarize(window.pings),
        "watch_miss": counters.get("watch_miss", 0),
        "packing": status.get("packing"),
        "store_objects": objects,  # git count-objects -v of the worktrees' one store at the end: loose, packs  # the daemon's background packing of loose objects, to the end
        "cold_reasons": {k: v for k, v in counters.items() if k.startswith("cold_reasons.")},
    }


PROFILE_FORMATS = {".svg": "flamegraph", ".txt": "raw", ".json": "speedscope"}


def _py_spy(pid: int, seconds: float, out: str, gil: bool = False) -> subprocess.Popen[bytes]:
    """py-spy recording ``pid`` for ``seconds`` into ``out`` (py-spy next to this Python, or on PATH).

    The format follows the suffix: ``.svg`` a flame graph, ``.txt`` collapsed stacks, ``.json`` speedscope.
    ``gil``: only the thread holding the GIL is sampled, so the profile is where the daemon's one
    Python core goes (without it, a thread waiting for the GIL counts where it waits).
    """
    import sys
    from pathlib import Path as _Path

    exe = _Path(sys.executable).with_name("py-spy")
    spy = str(exe) if exe.exists() else shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("--profile needs py-spy: .venv/bin/pip install py-spy")
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
         "--threads", "--nonblocking", *(["--gil"] if gil else []), "--format", PROFILE_FORMATS[_Path(out).suffix], "--output", out],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def count_objects(path: str) -> dict[str, int]:
    """``git count-objects -v`` of the repository at ``path``: its loose objects (count, KiB) and packs."""
    out = git(path, "count-objects", "-v").decode()
    fields = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    return {name: int(fields[name]) for name in ("count", "size", "in-pack", "packs", "size-pack") if name in fields}


def clear_sessions(trees: list[Tree]) -> None:
    """Remove the scale sessions' refs, objects and files, so the next run starts alike.

    The objects go from the packs too (``repack -a -d`` keeps only what a ref
    names): the daemon packs every loose object in the background, so each run
    left its 50,000 in the store's packs, and the later runs of a day met a store
    of 700,000 objects whose geometric roll-up could merge a big pack mid-window.
    """
    base = trees[0]
    refs = [r for r in git(base.path, "for-each-ref", "--format=%(refname)", "refs/snapshotd/").decode().split()]
    if refs:
        git(base.path, "update-ref", "--stdin", input="".join(f"delete {r}\n" for r in refs).encode())
    git(base.path, "repack", "-a", "-d", "-q")
    git(base.path, "prune", "--expire=now")
    for tree in trees:
        git(tree.path, "reset", "-q", "--hard", "HEAD")
        git(tree.path, "clean", "-fdq")
    settle_deletions()



async def run(
    trees: list[Tree],
    levels: list[int],
    *,
    window_s: float,
    warmup_s: float,
    think: tuple[float, float] = (1.0, 2.0),
    pool: int = 0,
    checkouts: list[str | None] | None = None,
    profile: str | None = None,
    profile_gil: bool = False,
    log: Any = print,
) -> list[dict[str, Any]]:
    """Every level, once per checkout (None: this one), alternating the order; ``profile``: a stem for flame graphs."""
    out = []
    runs = checkouts or [None]
    clear_sessions(trees)
    for n, sessions in enumerate(levels):
        order = runs if n % 2 == 0 else runs[::-1]
        for checkout in order:
            shared = f", sharing {pool} connections" if pool else ", a connection each"
            who = f" [{checkout}]" if checkout else ""
            log(f"  scale{who}: {sessions} sessions over {len(trees)} worktrees{shared}, {window_s:.0f} s window ...")
            svg = None
            if profile:
                tag = "this" if checkout is None else str(runs.index(checkout))
                stem, dot, suffix = profile.rpartition(".")
                svg = f"{stem}-{sessions}-{tag}.{suffix}" if dot and f".{suffix}" in PROFILE_FORMATS else (
                    f"{profile}-{sessions}-{tag}.svg")
            result = await run_level(
                trees, sessions, window_s=window_s, warmup_s=warmup_s, think=think, pool=pool,
                checkout=checkout, profile=svg, profile_gil=profile_gil, log=log,
            )
            log(
                f"    {result['captures_completed']} captures, p50 {result['latency_ms'].get('median')} ms, "
                f"p99 {result['latency_ms'].get('p99')} ms, failures {result['failures']}, "
                f"connect failures {result['connect_failures']}, ping p99 {result['ping_ms'].get('p99')} ms, "
                f"loose objects at the end {result['store_objects'].get('count')}, "
                f"CPU {result['daemon_cpu_cores']} cores (system {result['daemon_system_cpu_cores']}; the sessions' own {result['bench_cpu_cores']})"
            )
            first, second = result["latency_ms_by_half"]
            log(f"      p99 of the captures begun in the window's first half {first.get('p99')} ms, "
                f"second half {second.get('p99')} ms")
            if result["phases_ms"]:
                log("      the daemon's split, p50 / p99 ms: " + ", ".join(
                    f"{phase} {figures.get('median')} / {figures.get('p99')}"
                    for phase, figures in result["phases_ms"].items()
                ))
            for slow in result["slowest_second_half"]:
                log(f"      slow in the second half: {slow['ms']} ms, begun at {slow['began_s']} s, {slow['scan']}, "
                    + ", ".join(f"{phase} {ms:.1f}" for phase, ms in slow["phases"].items()))
            out.append(result)
            clear_sessions(trees)
    return out
