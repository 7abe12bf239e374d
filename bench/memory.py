"""Resident memory of the daemon per tracked file, with 1 and with 10 open worktrees.

For each configuration a fresh daemon is started and its resident set size
(RSS) read once it answers. Then every worktree of the configuration is
opened by a ``checkpoint`` (cold: scan, watcher started), followed by a warm
one; after a short settle the RSS is read again. The figure is the growth
divided by the number of tracked files open.
"""

from __future__ import annotations

from typing import Any

import trio

from .ours import running_daemon
from .trees import Tree


async def measure(label: str, trees: list[Tree], log: Any = print) -> dict[str, Any]:
    async with running_daemon(f"memory-{len(trees)}") as daemon:
        await trio.sleep(0.5)
        base = daemon.rss()
        for tree in trees:
            await daemon.call("checkpoint", path=tree.path, session="bench-memory")
        for tree in trees:
            await daemon.call("checkpoint", path=tree.path, session="bench-memory")
        await trio.sleep(1.0)
        rss = daemon.rss()
        hwm = daemon.peak_rss()
        for tree in trees:
            await daemon.call("delete", path=tree.path, session="bench-memory")
    files = sum(t.files for t in trees)
    result = {
        "label": label,
        "worktrees": len(trees),
        "tracked_files": files,
        "rss_idle": base,
        "rss_open": rss,
        "rss_peak": hwm,
        "bytes_per_file": round((rss - base) / files, 1),
        "peak_bytes_per_file": round((hwm - base) / files, 1),
    }
    log(f"  memory, {label}: {result['bytes_per_file']} B per tracked file (peak {result['peak_bytes_per_file']})")
    return result


async def run(configs: list[tuple[str, list[Tree]]], log: Any = print) -> list[dict[str, Any]]:
    return [await measure(label, trees, log) for label, trees in configs]
