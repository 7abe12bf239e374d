"""Ping and another worktree's checkpoints while a 200,000-folder tree arrives in a watched worktree.

    python -m bench.big_tree_ping [--folders 200000] [--ceiling 50000]

A real daemon watches a small repository and a big one; a tree of
``--folders`` folders is renamed into the big one in one step, so the watcher
walks it (on a worker thread, up to the ceiling, past which the worktree goes
cold). Meanwhile one client pings every 10 ms and another checkpoints the
small repository; reported: their latencies while the walk runs, how long the
walk took to end (the watch given up or complete), and the big worktree's
``watch_error``. Each folder watched is one of the user's inotify watches, so
the ceiling is kept well under the machine's ``fs.inotify.max_user_watches``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from snapshotd.client.rpc import Client

from .common import REPO_ROOT, git, summarize

sys.path.insert(0, str(REPO_ROOT / "tests"))
from daemon_helpers import child_env, start_daemon


def make_tree(root: Path, folders: int) -> None:
    """``folders`` folders, 100 to a parent, with one file in every hundredth."""
    for index in range(folders):
        folder = root / f"p{index // 100}" / f"c{index % 100}"
        os.makedirs(folder)
        if index % 100 == 0:
            (folder / "f.txt").write_text(f"{index}\n")


def run(options: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bigtree-"))
    try:
        small, big = work / "small", work / "big"
        for repo in (small, big):
            repo.mkdir()
            git(repo, "init", "-q", "-b", "main")
            (repo / "a.txt").write_text("a\n")
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", "init")
        make_tree(work / "incoming", options.folders)
        env = child_env(SNAPSHOTD_HOME=str(work / "home"), SNAPSHOTD_WATCH_CEILING=str(options.ceiling))
        daemon = start_daemon(work / "run" / "s.sock", work / "daemon.log", env=env)
        pings: list[float] = []
        captures: list[float] = []
        stop = threading.Event()
        try:
            with Client(str(daemon.socket), timeout=120) as client:
                for repo in (small, big):
                    client.call("checkpoint", {"path": str(repo)})

                def pinger() -> None:
                    with Client(str(daemon.socket), timeout=120) as pinging:
                        while not stop.is_set():
                            started = time.perf_counter()
                            pinging.call("ping")
                            pings.append((time.perf_counter() - started) * 1000)
                            time.sleep(0.01)

                def capturer() -> None:
                    with Client(str(daemon.socket), timeout=120) as capturing:
                        while not stop.is_set():
                            (small / "a.txt").write_text(f"{time.time()}\n")
                            started = time.perf_counter()
                            capturing.call("checkpoint", {"path": str(small)})
                            captures.append((time.perf_counter() - started) * 1000)
                            time.sleep(0.05)

                threads = [threading.Thread(target=pinger), threading.Thread(target=capturer)]
                for thread in threads:
                    thread.start()
                time.sleep(0.5)
                moved = time.monotonic()
                (work / "incoming").rename(big / "incoming")
                ended = None
                while time.monotonic() - moved < options.timeout:
                    shown = client.call("open", {"path": str(big)})["worktree"]
                    if not shown["watching"] or shown["watch_error"]:
                        ended = time.monotonic() - moved
                        break
                    time.sleep(0.2)
                stop.set()
                for thread in threads:
                    thread.join()
                status = client.call("status")["counters"]
        finally:
            daemon.terminate()
        return {
            "folders": options.folders,
            "ceiling": options.ceiling,
            "walk_ended_s": None if ended is None else round(ended, 2),
            "big_watch_error": shown["watch_error"],
            "ping_ms": summarize(pings),
            "other_worktree_checkpoint_ms": summarize(captures),
            "watch_given_up": {k: v for k, v in status.items() if k.startswith("watch_given_up")},
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--folders", type=int, default=200_000)
    parse.add_argument("--ceiling", type=int, default=50_000)
    parse.add_argument("--timeout", type=float, default=120.0)
    report = run(parse.parse_args())
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
