"""The page of ``snapshotd ui`` on a long history and a wide turn: what each request and each click costs.

    python -m bench.ui_paging [--checkpoints 20000] [--files 5000] [--repeat 5] [--no-browser]

One worktree holds ``--checkpoints`` checkpoints in one session, labelled as
the hooks label them (``before: prompt N`` then ``after turn``, so half as
many turns), written by :mod:`bench.history_build`; another holds one turn
that adds ``--files`` files, captured by a real daemon. A real ``snapshotd
ui`` process serves both. Reported, median and max of ``--repeat`` (ms, and
bytes of the answer): the worktree list (first: every checkpoint listed
once; then kept), the first timeline page and one 10,000 entries down, the
first and the last page of the wide turn's files, one file's patch (each a new file: nothing kept); then, in
headless Chromium, the clicks a person makes: open the long timeline, load
one more page, open the wide turn (its first 200 files and the first patch
drawn). Written to ``bench/results/<date>-ui-paging.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .common import REPO_ROOT, RESULTS, WORK, git

sys.path.insert(0, str(REPO_ROOT / "tests"))
from daemon_helpers import call, child_env, start_daemon

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "-c", "user.name=Bench", "-c", "user.email=bench@example.invalid", "commit", "-q", "-m", "base")
    return path


def _long_history(root: Path, home: Path, count: int) -> Path:
    from .history_build import build_history

    path = _repo(root / "long", {f"src/f{i}.txt": f"file {i}\n" * 20 for i in range(50)} | {"turn.txt": "0\n"})
    opened = subprocess.run(
        [sys.executable, "-m", "snapshotd", "--embedded", "--json", "open", str(path)],
        env={**os.environ, "SNAPSHOTD_HOME": str(home)}, check=True, capture_output=True, text=True,
    )
    worktree_id = json.loads(opened.stdout)["worktree"]["id"]
    build_history(path, worktree_id, "bench", count,
                  label=lambda seq: f"before: prompt {seq // 2 + 1}" if seq % 2 else "after turn")
    return path


def _timed(url: str, cookie: dict[str, str], repeat: int) -> dict[str, float]:
    times, size = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        with urllib.request.urlopen(urllib.request.Request(url, headers=cookie), timeout=600) as answer:
            size = len(answer.read())
        times.append((time.perf_counter() - started) * 1000)
    return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1),
            "first_ms": round(times[0], 1), "bytes": size}


def _browser(url: str, wide_prompt: str) -> dict[str, float]:
    from playwright.sync_api import expect, sync_playwright

    out = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.set_default_timeout(600_000)
            started = time.perf_counter()
            page.goto(url)
            expect(page.locator("#entries > li")).to_have_count(50)
            out["open_long_timeline_ms"] = round((time.perf_counter() - started) * 1000, 1)
            started = time.perf_counter()
            page.get_by_role("button", name="Load more").click()
            expect(page.locator("#entries > li")).to_have_count(100)
            out["load_more_ms"] = round((time.perf_counter() - started) * 1000, 1)
            page.get_by_role("button", name="wide").first.click()
            expect(page.locator("#entries > li")).to_have_count(1)
            started = time.perf_counter()
            page.get_by_role("button", name=f"Open turn 1: {wide_prompt}").click()
            expect(page.locator("#files > li")).to_have_count(200)
            expect(page.locator("table.diff")).to_have_count(1)
            out["open_wide_turn_ms"] = round((time.perf_counter() - started) * 1000, 1)
        finally:
            browser.close()
    return out


def run(options: argparse.Namespace) -> dict:
    root = WORK / f"ui-paging-{options.checkpoints}-{options.files}"
    shutil.rmtree(root, ignore_errors=True)
    home = root / "home"
    long_path = _long_history(root, home, options.checkpoints)
    sock = root / "run" / "s.sock"
    env = child_env(sock, SNAPSHOTD_HOME=str(home))
    daemon = start_daemon(sock, root / "daemon.log", env=env)
    ui = None
    try:
        wide = _repo(root / "wide", {"README": "wide\n"})
        prompt = f"add {options.files} files"
        before = call(sock, "checkpoint", {"path": str(wide), "session": "w", "label": f"before: {prompt}"})
        for number in range(options.files):
            folder = wide / "gen" / f"d{number // 100}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"f{number}.py").write_text(f"def f{number}():\n    return {number}\n")
        after = call(sock, "checkpoint", {"path": str(wide), "session": "w", "label": "after turn"})
        call(sock, "open", {"path": str(long_path)})
        ui = subprocess.Popen([sys.executable, "-m", "snapshotd", "--json", "ui", "--no-open", str(long_path)],
                              stdout=subprocess.PIPE, text=True, env=env)
        assert ui.stdout is not None
        url = json.loads(ui.stdout.readline())["url"]
        base, token = url.split("/?token=")
        cookie = {"Cookie": f"snapshotd_ui={token}"}
        found: dict[str, object] = {"checkpoints": options.checkpoints, "files": options.files}
        started = time.perf_counter()
        with urllib.request.urlopen(urllib.request.Request(base + "/api/worktrees", headers=cookie)) as answer:
            listed = json.loads(answer.read())
        found["worktrees_cold_ms"] = round((time.perf_counter() - started) * 1000, 1)  # every checkpoint listed
        ids = {Path(w["path"]).name: w["id"] for w in listed["worktrees"]}
        sides = f"worktree={ids['wide']}&from={before['checkpoint']['id']}&to={after['checkpoint']['id']}"
        found["worktrees"] = _timed(base + "/api/worktrees", cookie, options.repeat)
        found["timeline_first_page"] = _timed(f"{base}/api/timeline?worktree={ids['long']}", cookie, options.repeat)
        deep = min(10000, options.checkpoints // 2 - 50)
        found[f"timeline_page_at_{deep}"] = _timed(f"{base}/api/timeline?worktree={ids['long']}&offset={deep}",
                                                   cookie, options.repeat)
        found["files_first_page"] = _timed(f"{base}/api/files?{sides}", cookie, options.repeat)
        found["files_last_page"] = _timed(f"{base}/api/files?{sides}&offset={options.files - 200}", cookie, options.repeat)
        patches = [_timed(f"{base}/api/patch?{sides}&path=gen/d{n}/f{n * 100}.py", cookie, 1) for n in range(options.repeat)]
        found["one_patch"] = {"median_ms": statistics.median(p["median_ms"] for p in patches),
                              "max_ms": max(p["max_ms"] for p in patches), "bytes": patches[0]["bytes"]}
        if not options.no_browser and os.access(CHROMIUM, os.X_OK):
            found["browser"] = _browser(url, prompt)
        return found
    finally:
        if ui is not None:
            ui.terminate()
            ui.wait(timeout=30)
        daemon.terminate()


def main() -> int:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--checkpoints", type=int, default=20000)
    parse.add_argument("--files", type=int, default=5000)
    parse.add_argument("--repeat", type=int, default=5)
    parse.add_argument("--no-browser", action="store_true")
    options = parse.parse_args()
    found = run(options)
    print(json.dumps(found, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{time.strftime('%Y-%m-%d')}-ui-paging.json").write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
