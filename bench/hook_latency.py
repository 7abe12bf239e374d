"""What an agent waits for at each hook event: ``snapshotd hook claude-code``, end to end.

Each sample is one real hook process, fed a recorded Claude Code payload on
stdin (a prompt, a Bash tool call, the end of a turn, in turn), timed from
spawn to exit, with a running daemon; a file is edited before each event so
that every checkpoint records a change. Cold samples start from no daemon:
the hook starts one and waits for its first capture. For scale, the table
also times a bare interpreter and ``snapshotd --version`` (the command line's
own start-up), which every hook pays before it does any work.

    .venv/bin/python bench/hook_latency.py [--events 200] [--cold 5] [--files 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO_ROOT, git, summarize

PAYLOADS = REPO_ROOT / "tests" / "hook_payloads" / "claude-code"
RECORDED_CWD = "/home/user/project"
EVENTS = ("1-user-prompt-submit.json", "3-post-tool-use-bash.json", "5-stop.json")
START_TIMEOUT_S = 30


def _timed(argv: list[str], env: dict[str, str], data: bytes | None = None) -> float:
    """Milliseconds from spawning ``argv`` to its exit; it must exit 0, and a hook (given ``data``) print nothing."""
    started = time.perf_counter()
    proc = subprocess.run(argv, input=data, capture_output=True, env=env, check=False)
    elapsed = (time.perf_counter() - started) * 1000
    if proc.returncode != 0 or (data is not None and (proc.stdout or proc.stderr)):
        raise RuntimeError(f"{argv} exited {proc.returncode}: {proc.stdout!r} {proc.stderr!r}")
    return elapsed


def make_repo(root: Path, files: int) -> Path:
    """A committed repository of ``files`` small files in folders of 100."""
    repo = root / "project"
    for i in range(files):
        path = repo / f"pkg{i // 100}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"value = {i}\n")
    git(repo.parent, "init", "-q", str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    return repo


def payloads(repo: Path) -> list[bytes]:
    """The recorded prompt, Bash and Stop payloads, placed in ``repo``."""
    return [(PAYLOADS / name).read_text().replace(RECORDED_CWD, str(repo)).encode() for name in EVENTS]


def hook_samples(repo: Path, env: dict[str, str], count: int, edit: Callable[[int], None]) -> list[float]:
    """``count`` hook runs against the running daemon, cycling through the event kinds."""
    events = payloads(repo)
    argv = [sys.executable, "-m", "snapshotd", "hook", "claude-code"]
    samples = []
    for i in range(count):
        edit(i)
        samples.append(_timed(argv, env, events[i % len(events)]))
    return samples


def cold_samples(repo: Path, base_env: dict[str, str], count: int) -> list[float]:
    """Hook runs that each find no daemon and start one (stopped again after each)."""
    samples = []
    for i in range(count):
        with tempfile.TemporaryDirectory(prefix="snapshotd-cold-") as folder:
            env = dict(base_env, SNAPSHOTD_SOCKET=os.path.join(folder, "s.sock"), SNAPSHOTD_HOME=os.path.join(folder, "home"))
            try:
                samples.append(hook_samples(repo, env, 1, lambda _i, n=i: (repo / "cold.txt").write_text(str(n)))[0])
            finally:
                subprocess.run([sys.executable, "-m", "snapshotd", "stop"], env=env, capture_output=True, check=False)
    return samples


def start_daemon(env: dict[str, str], repo: Path) -> None:
    """Start the daemon through a first checkpoint (which also opens and watches the worktree)."""
    subprocess.run(
        [sys.executable, "-m", "snapshotd", "checkpoint", str(repo)], env=env, capture_output=True, check=True, timeout=START_TIMEOUT_S
    )


def table(rows: dict[str, list[float]]) -> str:
    lines = ["| what | n | median ms | p99 ms | min ms | max ms |", "| --- | --- | --- | --- | --- | --- |"]
    for name, values in rows.items():
        s = summarize(values)
        lines.append(f"| {name} | {s['n']} | {s['median']:.1f} | {s['p99']:.1f} | {s['min']:.1f} | {s['max']:.1f} |")
    return "\n".join(lines)


def recorded(repo: Path, env: dict[str, str], count: int) -> list[dict]:
    """The session's checkpoints, once ``count`` are there (some may finish in the background) or after 30 s."""
    deadline = time.monotonic() + 30
    while True:
        checkpoints = json.loads(
            subprocess.run(
                [sys.executable, "-m", "snapshotd", "list", "--json", "--limit", "100000", "--session", "2f6a9c1e-8b4d-4e0f-9a37-5c1d2e3f4a5b", str(repo)],
                env=env, capture_output=True, check=True,
            ).stdout
        )["checkpoints"]
        if len(checkpoints) >= count or time.monotonic() > deadline:
            return checkpoints
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200, help="hook runs with a running daemon")
    parser.add_argument("--cold", type=int, default=5, help="hook runs that start the daemon")
    parser.add_argument("--files", type=int, default=2000, help="files in the worktree")
    parser.add_argument("--json", action="store_true", help="also print every sample as JSON")
    parser.add_argument(
        "--agent-wait", action="store_true",
        help="keep the default budgets: time what the agent waits for, not the whole checkpoint",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="snapshotd-hook-bench-") as folder:
        root = Path(folder)
        repo = make_repo(root, args.files)
        env = dict(os.environ, SNAPSHOTD_SOCKET=str(root / "run" / "s.sock"), SNAPSHOTD_HOME=str(root / "home"))
        if not args.agent_wait:  # measure the whole checkpoint, not the budget
            env.update(SNAPSHOTD_HOOK_BUDGET="30", SNAPSHOTD_HOOK_START_BUDGET="30")
        interpreter = [_timed([sys.executable, "-c", "pass"], env) for _ in range(20)]
        version = [_timed([sys.executable, "-m", "snapshotd", "--version"], env) for _ in range(20)]
        start_daemon(env, repo)
        try:
            warm = hook_samples(repo, env, args.events, lambda i: (repo / "pkg0" / "mod0.py").write_text(f"value = {i}\n"))
            checkpoints = recorded(repo, env, args.events)
        finally:
            subprocess.run([sys.executable, "-m", "snapshotd", "stop"], env=env, capture_output=True, check=False)
        if len(checkpoints) != args.events:
            raise RuntimeError(f"{args.events} hook runs recorded {len(checkpoints)} checkpoints")
        cold = cold_samples(repo, env, args.cold)

    rows = {
        "python -c pass": interpreter,
        "snapshotd --version": version,
        f"hook, daemon running ({args.files} files)": warm,
        **{f"  {name.split('-', 1)[1].removesuffix('.json')}": warm[i :: len(EVENTS)] for i, name in enumerate(EVENTS)},
        "hook, no daemon (autostart, first capture)": cold,
    }
    print(table(rows))
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
