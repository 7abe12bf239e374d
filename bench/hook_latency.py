"""What an agent waits for at each hook event, per hook program, side by side.

Each sample is one real hook process, fed a recorded Claude Code payload on
stdin (a prompt, a Bash tool call, the end of a turn, in turn), timed from
spawn to exit, with a running daemon and the default budgets (a "before"
waits for its checkpoint, an "after" hands it off), and a file edited before
each event so that every checkpoint records a change, and a short pause before
each prompt, as a person takes between turns. The programs compared:

- ``hook program``: the Python entry, ``python -I -S .../hookentry.py``;
- ``integrate's entries``: what ``integrate`` writes for each event: the native entry
  (``snapshotd-hook``, relayed to the daemon's ``hook`` method) for the prompt when it was built,
  the Python entry for the others;
- ``snapshotd hook``: the command line's ``hook`` command (click and the package);
- ``--old CHECKOUT``: that checkout's ``python -m snapshotd hook`` with its own
  venv (run ``./scripts/setup`` there), as its settings ran it;
- ``--old-program CHECKOUT``: that checkout's hook program, with this interpreter,
  waited for at every event (as its ``integrate`` wrote it).

A hook that ``integrate`` now writes as ``"async": true`` (after a tool) is
started as the agent starts it, ``sh -c`` with the payload on stdin, and not
waited for: its sample is what the agent waits for (the spawn and the write of
the payload), and a second row gives the hook process's own time to its exit.

Each program has its own worktree and session (one daemon serves them all),
and the runs alternate between the programs turn by turn, so a busy machine
slows each alike. For scale, the table also times a bare interpreter (``-I -S`` and with
site-packages) and a direct ``checkpoint`` call on a connection held open
(the capture alone, which a "before" hook cannot be faster than). Cold
samples start from no daemon: the hook starts one.

    .venv/bin/python bench/hook_latency.py [--events 300] [--cold 3] [--files 2000] [--old ../main]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO_ROOT, git, summarize
from snapshotd.agents.hookserve import native_entry
from snapshotd.agents.integrate import HOOK_PROGRAM, wanted_entries
from snapshotd.client.rpc import Client

PAYLOADS = REPO_ROOT / "tests" / "hook_payloads" / "claude-code"
RECORDED_CWD = "/home/user/project"
RECORDED_SESSION = "2f6a9c1e-8b4d-4e0f-9a37-5c1d2e3f4a5b"
EVENTS = ("1-user-prompt-submit.json", "3-post-tool-use-bash.json", "5-stop.json")
EVENT_NAMES = ("UserPromptSubmit", "PostToolUse", "Stop")
BACKGROUND = tuple(bool(group["hooks"][0].get("async")) for group in (wanted_entries("claude-code", "tools")[name] for name in EVENT_NAMES))
"""Per event, whether ``integrate`` writes its hook as one the agent runs in the background."""
START_TIMEOUT_S = 30
PROMPT_PAUSE_S = 0.3
"""The pause before each prompt, as between turns: the "before" then waits for its own checkpoint only."""


class Sample(float):
    """A wall-time sample (ms) that also carries the run's CPU time (ms)."""

    cpu: float = math.nan


def _timed(argv: list[str], env: dict[str, str], data: bytes | None = None) -> Sample:
    """Milliseconds from spawning ``argv`` to its exit; it must exit 0, and a hook (given ``data``) print nothing.

    The sample also carries the CPU time of the process (and of what it waited for): on a busy
    machine that says what the wall time cannot.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, input=data, capture_output=True, env=env, check=False)
    elapsed = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or (data is not None and (proc.stdout or proc.stderr)):
        raise RuntimeError(f"{argv} exited {proc.returncode}: {proc.stdout!r} {proc.stderr!r}")
    sample = Sample(elapsed)
    sample.cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return sample


class Background:
    """Hooks started as an agent starts a background one: timed to the payload's write, then to their exit."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def start(self, argv: list[str], env: dict[str, str], data: bytes, exits: list[float]) -> Sample:
        started = time.perf_counter()
        proc = subprocess.Popen(["sh", "-c", shlex.join(argv)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        proc.stdin.write(data)
        proc.stdin.close()
        sample = Sample((time.perf_counter() - started) * 1000)

        def reap() -> None:
            assert proc.stdout is not None and proc.stderr is not None
            with proc.stdout, proc.stderr:
                out, err = proc.stdout.read(), proc.stderr.read()
            proc.wait()
            exits.append((time.perf_counter() - started) * 1000)
            if proc.returncode != 0 or out or err:
                raise RuntimeError(f"{argv} exited {proc.returncode}: {out!r} {err!r}")

        thread = threading.Thread(target=reap)
        thread.start()
        self.threads.append(thread)
        return sample

    def join(self) -> None:
        for thread in self.threads:
            thread.join()


def make_repo(root: Path, files: int, name: str = "project") -> Path:
    """A committed repository of ``files`` small files in folders of 100."""
    repo = root / name
    for i in range(files):
        path = repo / f"pkg{i // 100}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"value = {i}\n")
    git(repo.parent, "init", "-q", str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    return repo


def payloads(repo: Path, session: str) -> list[bytes]:
    """The recorded prompt, Bash and Stop payloads, placed in ``repo`` under ``session``."""
    return [
        (PAYLOADS / name).read_text().replace(RECORDED_CWD, str(repo)).replace(RECORDED_SESSION, session).encode()
        for name in EVENTS
    ]


def programs(old: Path | None, old_program: Path | None = None) -> dict[str, list[str] | dict[str, list[str]]]:
    """Name -> argv of each hook program compared (or event name -> argv)."""
    found: dict[str, list[str] | dict[str, list[str]]] = {
        "hook program (-I -S hookentry.py)": [sys.executable, "-I", "-S", HOOK_PROGRAM, "claude-code"],
        "snapshotd hook (command line)": [sys.executable, "-m", "snapshotd", "hook", "claude-code"],
    }
    if native_entry() is not None:
        entries = wanted_entries("claude-code", "tools")
        found["integrate's entries (native for the prompt)"] = {
            event: shlex.split(entries[event]["hooks"][0]["command"]) for event in EVENT_NAMES
        }
    if old is not None:
        python = old / ".venv" / "bin" / "python"
        if not python.exists():
            raise SystemExit(f"{old} has no .venv: run ./scripts/setup there first.")
        found[f"old snapshotd hook ({old.name})"] = [str(python), "-m", "snapshotd", "hook", "claude-code"]
    if old_program is not None:
        program = old_program / "snapshotd" / "agents" / "hookentry.py"
        if not program.exists():
            raise SystemExit(f"{old_program} has no snapshotd/agents/hookentry.py.")
        found[f"old hook program ({old_program.name}, waited for)"] = [sys.executable, "-I", "-S", str(program), "claude-code"]
    return found


def argv_for(argv: list[str] | dict[str, list[str]], kind: int) -> list[str]:
    """The program's argv for the event of ``EVENTS[kind]``."""
    return argv[EVENT_NAMES[kind]] if isinstance(argv, dict) else argv


def warm_samples(
    root: Path, env: dict[str, str], argvs: dict[str, list[str] | dict[str, list[str]]], files: int, count: int,
    exits: dict[str, list[float]],
) -> dict[str, list[list[float]]]:
    """Per program, per event kind, ``count`` hook runs against the running daemon, alternating programs;
    a background hook's time to its exit goes to ``exits`` (per program)."""
    base = make_repo(root, files, "base")
    repos, events = {}, {}
    for n, name in enumerate(argvs):
        repos[name] = root / f"project{n}"
        shutil.copytree(base, repos[name], symlinks=True)
        events[name] = payloads(repos[name], f"bench-{n}")
        start_daemon(env, repos[name])
    samples: dict[str, list[list[float]]] = {name: [[] for _ in EVENTS] for name in argvs}
    background = Background()
    # A turn of one program, then the same turn of the next: this process plays every program's agent, and a
    # turn's end waits for the agent's earlier hooks still starting (its own turn's background hook).
    for turn in range(0, count, len(EVENTS)):
        time.sleep(PROMPT_PAUSE_S)  # a person types the next prompt: the last turn's checkpoint is done
        for name, argv in argvs.items():
            for kind in range(min(len(EVENTS), count - turn)):
                (repos[name] / "pkg0" / "mod0.py").write_text(f"value = {turn + kind}\n")
                program = argv_for(argv, kind)
                if BACKGROUND[kind] and not name.startswith("old"):
                    samples[name][kind].append(background.start(program, env, events[name][kind], exits.setdefault(name, [])))
                else:
                    samples[name][kind].append(_timed(program, env, events[name][kind]))
    background.join()
    for n, name in enumerate(argvs):
        got = recorded(repos[name], env, f"bench-{n}", count)
        if got != count:
            raise RuntimeError(f"{name}: {count} hook runs recorded {got} checkpoints")
    return samples


def capture_samples(root: Path, env: dict[str, str], files: int, count: int) -> list[float]:
    """Direct checkpoint calls after one edit, on a connection held open: the capture alone."""
    repo = make_repo(root, files, "direct")
    start_daemon(env, repo)
    samples = []
    with Client(env["SNAPSHOTD_SOCKET"]) as client:
        for i in range(count):
            (repo / "pkg0" / "mod0.py").write_text(f"value = {i}\n")
            started = time.perf_counter()
            client.call("checkpoint", path=str(repo), session="direct")
            samples.append((time.perf_counter() - started) * 1000)
    return samples


def cold_samples(repo: Path, base_env: dict[str, str], argv: list[str] | dict[str, list[str]], count: int) -> list[float]:
    """Hook runs (the prompt, which waits) that each find no daemon and start one (stopped again after each)."""
    samples = []
    for i in range(count):
        with tempfile.TemporaryDirectory(prefix="snapshotd-cold-") as folder:
            env = dict(base_env, SNAPSHOTD_SOCKET=os.path.join(folder, "s.sock"), SNAPSHOTD_HOME=os.path.join(folder, "home"))
            try:
                (repo / "cold.txt").write_text(str(i))
                samples.append(_timed(argv_for(argv, 0), env, payloads(repo, "cold")[0]))
            finally:
                subprocess.run([sys.executable, "-m", "snapshotd", "stop"], env=env, capture_output=True, check=False)
    return samples


def start_daemon(env: dict[str, str], repo: Path) -> None:
    """Start the daemon (if none runs) through a first checkpoint, which also opens and watches the worktree."""
    subprocess.run(
        [sys.executable, "-m", "snapshotd", "checkpoint", str(repo)], env=env, capture_output=True, check=True, timeout=START_TIMEOUT_S
    )


def recorded(repo: Path, env: dict[str, str], session: str, count: int) -> int:
    """How many checkpoints ``session`` has, once ``count`` are there (some finish in the background) or after 30 s."""
    deadline = time.monotonic() + 30
    while True:
        listed = subprocess.run(
            [sys.executable, "-m", "snapshotd", "list", "--json", "--limit", "100000", "--session", session, str(repo)],
            env=env, capture_output=True, check=True,
        ).stdout
        found = len(json.loads(listed)["checkpoints"])
        if found >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def table(rows: dict[str, list[float]]) -> str:
    lines = ["| what | n | median ms | p99 ms | min ms | max ms | CPU median ms |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, values in rows.items():
        s = summarize(values)
        cpu = [value.cpu for value in values if isinstance(value, Sample) and not math.isnan(value.cpu)]
        cpu_text = f"{summarize(cpu)['median']:.1f}" if cpu else "-"
        lines.append(f"| {name} | {s['n']} | {s['median']:.1f} | {s['p99']:.1f} | {s['min']:.1f} | {s['max']:.1f} | {cpu_text} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300, help="hook runs per program with a running daemon")
    parser.add_argument("--cold", type=int, default=3, help="hook runs per program that start the daemon")
    parser.add_argument("--files", type=int, default=2000, help="files in each worktree")
    parser.add_argument("--old", type=Path, help="another checkout whose `snapshotd hook` to compare")
    parser.add_argument("--old-program", type=Path, help="another checkout whose hook program to compare (waited for)")
    parser.add_argument("--json", action="store_true", help="also print every sample as JSON")
    args = parser.parse_args()
    argvs = programs(args.old.resolve() if args.old else None, args.old_program.resolve() if args.old_program else None)

    with tempfile.TemporaryDirectory(prefix="snapshotd-hook-bench-") as folder:
        root = Path(folder)
        env = dict(os.environ, SNAPSHOTD_SOCKET=str(root / "run" / "s.sock"), SNAPSHOTD_HOME=str(root / "home"))
        for variable in ("SNAPSHOTD_HOOK_BUDGET", "SNAPSHOTD_HOOK_BEFORE_BUDGET", "SNAPSHOTD_HOOK_START_BUDGET"):
            env.pop(variable, None)  # the defaults: what an agent waits for
        rows: dict[str, list[float]] = {
            "python -I -S -c pass": [_timed([sys.executable, "-I", "-S", "-c", "pass"], env) for _ in range(30)],
            "python -c pass": [_timed([sys.executable, "-c", "pass"], env) for _ in range(30)],
        }
        exits: dict[str, list[float]] = {}
        try:
            warm = warm_samples(root, env, argvs, args.files, args.events, exits)
            rows["checkpoint call alone (capture, one edit)"] = capture_samples(root, env, args.files, 60)
        finally:
            subprocess.run([sys.executable, "-m", "snapshotd", "stop"], env=env, capture_output=True, check=False)
        for name, kinds in warm.items():
            for n, (kind, values) in enumerate(zip(EVENTS, kinds, strict=True)):
                event = kind.split("-", 1)[1].removesuffix(".json")
                if BACKGROUND[n] and name in exits:
                    rows[f"{name}: {event} (async: spawn and payload)"] = values
                    rows[f"{name}: {event}, the hook process to its exit"] = exits[name]
                else:
                    rows[f"{name}: {event}"] = values
        for name, argv in argvs.items():
            if args.cold:
                rows[f"{name}: user-prompt-submit, no daemon (autostart)"] = cold_samples(root / "base", env, argv, args.cold)

    print(table(rows))
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
