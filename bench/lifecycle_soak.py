"""A lifecycle soak: worktrees created, edited, moved, deleted and recreated under a running daemon.

    python -m bench.lifecycle_soak --duration 180 [--worktrees 20] [--sessions 10] [--settle 20] [--json out.json]

Starts ``snapshotd serve`` in a user namespace of its own (``unshare -U -r``),
so that part way through the kernel's watch limit can be lowered for the
daemon alone (``/proc/sys/user/max_inotify_watches`` of that namespace, set
through ``nsenter``; the machine's sysctls are never touched). Without user
namespaces the run goes on with the limit unchanged, and says so.

Meanwhile: one thread edits, moves, deletes and recreates worktrees at random
(separate repositories, some with a submodule and a ``.gitattributes``,
linked worktrees of one repository, plain folders; each writes a build's
output into folders its ``.gitignore`` names, a rule now and then taken back
and given again); session threads
checkpoint them, a share of those under the worktree's lock with the tree
compared with git's (``tests/oracle.py``); another thread pings every 20 ms.

Reported: daemon restarts (0), captures compared with git and the
differences (0), ping p50/p99/max, failed requests by kind, the requests that
failed with anything but a clear error about their own worktree (0, each with
its whole sentence; a clear one names the worktree's
path or id, kind ``not_found``, ``not_a_directory``, ``path_outside_worktree``
or ``git_error``: a repository deleted under a capture lacks objects), the daemon's RSS and descriptors at start and
end, the worktrees that went cold at the lowered limit, and tracebacks in the
daemon's log. Exits 1 when a bound is broken.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapshotd.client.rpc import Client
from snapshotd.errors import SnapshotdError

from .common import REPO_ROOT, git, summarize

sys.path.insert(0, str(REPO_ROOT / "tests"))
from oracle import oracle_tree

CLEAR_KINDS = {"not_found", "not_a_directory", "path_outside_worktree", "git_error"}
KINDS = ("separate", "submodule", "linked", "plain")
CALL_TIMEOUT_S = 60.0
IGNORED_BUILD = "build/\n*.log\n"


@dataclass
class Slot:
    """One worktree's place in the soak: where it is now (None while deleted), under its own lock."""

    index: int
    kind: str
    path: Path | None = None
    generation: int = 0
    ids: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def differing_paths(path: Path, ours: str, git_tree: str) -> str:
    """``git diff-tree`` of the two trees, read now (the worktree and its objects may be gone by the report)."""
    try:
        return os.fsdecode(git(path, "diff-tree", "-r", ours, git_tree)).strip().replace("\n", "; ")
    except (RuntimeError, OSError) as error:
        return f"(not read: {error})"


class Soak:
    def __init__(self, root: Path, options: argparse.Namespace) -> None:
        self.root = root
        self.options = options
        self.rng = random.Random(options.seed)
        self.sock = root / "run" / "s.sock"
        self.base = root / "base"  # the repository the linked worktrees belong to
        self.upstream = root / "upstream"  # the submodules' source
        self.slots = [Slot(i, KINDS[i % len(KINDS)]) for i in range(options.worktrees)]
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.unclear: list[str] = []
        self.clear: dict[str, list[str]] = {}  # the clear failures' sentences, by kind
        self.differences: list[str] = []
        self.pings: list[float] = []
        self.pids: set[int] = set()
        self.proc: subprocess.Popen[bytes] | None = None
        self.namespace = False
        self.limit: int | None = None

    # --- worktrees ---------------------------------------------------------------

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def prepare(self) -> None:
        for folder in (self.base, self.upstream):
            folder.mkdir(parents=True)
            git(folder, "init", "-q", "-b", "main")
            (folder / "README").write_text(f"{folder.name}\n")
            git(folder, "add", "-A")
            git(folder, "commit", "-qm", "init")
        for slot in self.slots:
            self.create(slot)

    def create(self, slot: Slot) -> None:
        slot.generation += 1
        path = self.root / "trees" / f"wt{slot.index}-{slot.generation}"
        path.parent.mkdir(exist_ok=True)
        if slot.kind == "linked":
            git(self.base, "worktree", "add", "-q", "-b", f"b{slot.index}-{slot.generation}", str(path))
        else:
            path.mkdir()
        self.fill(path, slot)
        if slot.kind in ("separate", "submodule"):
            git(path, "init", "-q", "-b", "main")
            if slot.kind == "submodule":
                (path / ".gitattributes").write_text("*.txt text eol=lf\n*.bin binary\n")
                git(path, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(self.upstream), "vendor/up")
            git(path, "add", "-A")
            git(path, "commit", "-qm", "init")
        slot.path = path

    def fill(self, path: Path, slot: Slot) -> None:
        for folder in range(self.options.folders):
            target = path / f"d{folder % 5}" / f"e{folder}"
            target.mkdir(parents=True, exist_ok=True)
            (target / "f.txt").write_text(f"{slot.index} {folder}\n")
        (path / ".gitignore").write_text(IGNORED_BUILD)
        for folder in range(3):
            (path / "build" / f"o{folder}").mkdir(parents=True, exist_ok=True)

    def mutate(self) -> None:
        """The mutator thread: one random change to one random worktree at a time."""
        while not self.stop.is_set():
            slot = self.rng.choice(self.slots)
            with slot.lock:
                try:
                    self.change(slot)
                except (OSError, RuntimeError) as exc:  # set-up git failing is the harness's problem, noted
                    self.count("mutations.failed")
                    print(f"mutation of wt{slot.index} failed: {exc}", file=sys.stderr)
            self.stop.wait(self.options.pace)

    def change(self, slot: Slot) -> None:
        if slot.path is None:
            self.create(slot)
            self.count("mutations.recreate")
            return
        roll = self.rng.random()
        if roll < 0.65:
            self.edit(slot.path)
            self.count("mutations.edit")
        elif roll < 0.85:
            slot.generation += 1
            new = slot.path.parent / f"wt{slot.index}-{slot.generation}"
            if slot.kind == "linked":
                git(self.base, "worktree", "move", str(slot.path), str(new))
            else:
                slot.path.rename(new)
            slot.path = new
            self.count("mutations.move")
        else:
            for attempt in range(50):  # the daemon may write objects while they go: as for rm -rf, again
                try:
                    shutil.rmtree(slot.path)
                    break
                except OSError:
                    if attempt == 49:
                        raise
                    time.sleep(0.02)
            if slot.kind == "linked":
                git(self.base, "worktree", "prune")
            slot.path = None
            self.count("mutations.delete")

    def edit(self, path: Path) -> None:
        rng = self.rng
        for _ in range(rng.randrange(1, 4)):
            target = path / f"d{rng.randrange(5)}" / f"e{rng.randrange(self.options.folders)}"
            if target.is_dir():
                (target / f"n{rng.randrange(5)}.txt").write_text(f"{rng.random()}\n")
        if rng.random() < 0.2:
            fresh = path / f"new{rng.randrange(1000)}" / "inner"
            fresh.mkdir(parents=True, exist_ok=True)
            (fresh / "x.txt").write_text("new\n")
        if rng.random() < 0.3:  # a build's output, in folders git ignores (and so the watch leaves out)
            output = path / "build" / f"o{rng.randrange(3)}" / f"p{rng.randrange(20)}"
            output.mkdir(parents=True, exist_ok=True)
            (output / "x.o").write_text(f"{rng.random()}\n")
        if rng.random() < 0.05:  # the rule taken back, or given again
            rules = path / ".gitignore"
            rules.write_text("*.log\n" if rules.read_text() == IGNORED_BUILD else IGNORED_BUILD)
        if rng.random() < 0.1 and (path / ".gitattributes").exists():
            with open(path / ".gitattributes", "a") as rules:
                rules.write(f"*.n{rng.randrange(9)} -text\n")

    # --- clients -----------------------------------------------------------------

    def session(self, number: int) -> None:
        rng = random.Random(self.options.seed * 1000 + number)
        with Client(str(self.sock), timeout=CALL_TIMEOUT_S) as client:
            while not self.stop.is_set():
                slot = rng.choice(self.slots)
                if rng.random() < self.options.verify_share:
                    with slot.lock:
                        self.checkpoint(client, slot, f"s{number}", verify=True)
                else:
                    self.checkpoint(client, slot, f"s{number}", verify=False)
                self.stop.wait(rng.uniform(0, 0.2))

    def checkpoint(self, client: Client, slot: Slot, session: str, *, verify: bool) -> None:
        path = slot.path
        if path is None:
            return
        self.count("requests")
        try:
            done = client.call("checkpoint", {"path": str(path), "session": session})
        except SnapshotdError as error:
            kind = error.to_dict().get("data", {}).get("kind")
            about_it = str(path) in error.message or any(i in error.message for i in slot.ids)
            self.count(f"failed_kind.{kind or 'internal'}")
            if kind in CLEAR_KINDS and about_it and not verify:
                self.count("failed.clear")
                with self.lock:
                    self.clear.setdefault(str(kind), []).append(error.message)
            else:
                self.count("failed.unclear")
                with self.lock:
                    self.unclear.append(f"{path} (verify={verify}): {kind}: {error.message}")
            return
        except OSError as error:
            self.count("failed.unclear")
            with self.lock:
                self.unclear.append(f"{path}: connection: {error}")
            return
        slot.ids.add(done["checkpoint"]["worktree"])
        self.count(f"scan.{done['stats']['scan']}")
        if verify:
            want = oracle_tree(path, fresh_index=slot.kind == "plain")
            self.count("compared")
            if done["checkpoint"]["tree"] != want:
                paths = differing_paths(path, done["checkpoint"]["tree"], want)
                with self.lock:
                    self.differences.append(f"{path} ({slot.kind}, {done['stats']['scan']} capture): snapshotd "
                                            f"{done['checkpoint']['tree']}, git {want}: {paths}")

    def pinger(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                with Client(str(self.sock), timeout=CALL_TIMEOUT_S) as client:
                    pid = client.call("ping")["pid"]
                self.pings.append((time.perf_counter() - started) * 1000)
                with self.lock:
                    self.pids.add(pid)
            except (OSError, SnapshotdError) as error:
                self.count("ping.failed")
                print(f"ping failed: {error}", file=sys.stderr)
            self.stop.wait(0.02)

    # --- the daemon --------------------------------------------------------------

    def start_daemon(self) -> None:
        self.sock.parent.mkdir(mode=0o700)
        env = dict(os.environ, SNAPSHOTD_HOME=str(self.root / "home"), HOME=str(self.root / "userhome"))
        (self.root / "userhome").mkdir()
        serve = [sys.executable, "-m", "snapshotd", "serve", "--socket", str(self.sock)]
        self.namespace = shutil.which("unshare") is not None and shutil.which("nsenter") is not None and (
            subprocess.run(["unshare", "-U", "-r", "true"], capture_output=True, check=False).returncode == 0
        )
        argv = ["unshare", "-U", "-r", *serve, "--allow-root"] if self.namespace else serve
        with open(self.root / "daemon.log", "wb") as log:  # the daemon holds its own copy of the descriptor
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, SnapshotdError), Client(str(self.sock), timeout=5) as client:
                self.pids.add(client.call("ping")["pid"])
                return
            time.sleep(0.05)
        raise RuntimeError(f"the daemon did not start:\n{(self.root / 'daemon.log').read_text()}")

    def sample(self) -> dict[str, int]:
        assert self.proc is not None
        pid = self.proc.pid
        with open(f"/proc/{pid}/status") as status:
            rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        return {"rss_kib": rss, "fds": len(os.listdir(f"/proc/{pid}/fd")), "watches": daemon_watches(pid)}

    def lower_limit(self) -> None:
        """Set the namespace's watch limit to about half of what the daemon holds now."""
        assert self.proc is not None
        if not self.namespace:
            return
        self.limit = max(20, daemon_watches(self.proc.pid) // 2)
        subprocess.run(
            ["nsenter", "-t", str(self.proc.pid), "-U", "sh", "-c",
             f"echo {self.limit} > /proc/sys/user/max_inotify_watches"],
            check=True,
        )

    def stop_daemon(self) -> float:
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return round(time.monotonic() - started, 3)


def daemon_watches(pid: int) -> int:
    held = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{name}") == "anon_inode:inotify":
                with open(f"/proc/{pid}/fdinfo/{name}", "rb") as info:
                    held += info.read().count(b"\ninotify wd:")
    return held


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (empty where /proc has none)."""
    try:
        with open("/proc/loadavg") as loadavg:
            return [float(part) for part in loadavg.read().split()[:3]]
    except OSError:
        return []


def run(options: argparse.Namespace) -> dict[str, Any]:
    """One soak in a fresh folder; the report (``ok`` says whether every bound held)."""
    root = Path(tempfile.mkdtemp(prefix="soak-"))
    soak = Soak(root, options)
    load_start = load_average()
    try:
        soak.prepare()
        soak.start_daemon()
        start = soak.sample()
        threads = [threading.Thread(target=soak.mutate), threading.Thread(target=soak.pinger)]
        threads += [threading.Thread(target=soak.session, args=(n,)) for n in range(options.sessions)]
        for thread in threads:
            thread.start()
        soak.stop.wait(options.duration * options.lower_at)
        before = soak.sample()
        soak.lower_limit()
        soak.stop.wait(options.duration * (1 - options.lower_at))
        soak.stop.set()
        for thread in threads:
            thread.join(timeout=CALL_TIMEOUT_S)
        time.sleep(options.settle)  # left alone: what its supervisors do late shows in the log
        end = soak.sample()
        with Client(str(soak.sock), timeout=CALL_TIMEOUT_S) as client:
            status = client.call("status")
        stop_s = soak.stop_daemon()
    finally:
        soak.stop.set()
        if soak.proc is not None and soak.proc.poll() is None:
            soak.proc.kill()
            soak.proc.wait()
    log = (root / "daemon.log").read_text(errors="replace")
    cold_at_limit = [w["path"] for w in status["worktrees"] if "max_user_watches" in (w.get("watch_error") or "")]
    report = {
        "duration_s": options.duration,
        "worktrees": options.worktrees,
        "sessions": options.sessions,
        "restarts": len(soak.pids) - 1,
        "compared_with_git": soak.counts["compared"],
        "differences": len(soak.differences),
        "requests": soak.counts["requests"],
        "failed_clear": soak.counts["failed.clear"],
        "failed_unclear": soak.counts["failed.unclear"],
        "failed_by_kind": {k[12:]: v for k, v in sorted(soak.counts.items()) if k.startswith("failed_kind.")},
        "ping_ms": summarize(soak.pings),
        "ping_failed": soak.counts["ping.failed"],
        "daemon_start": start,
        "daemon_before_limit": before,
        "daemon_end": end,
        "watch_limit_lowered_to": soak.limit,
        "user_namespace": soak.namespace,
        "cold_at_watch_limit": len(cold_at_limit),
        "scans": {k[5:]: v for k, v in soak.counts.items() if k.startswith("scan.")},
        "mutations": {k[10:]: v for k, v in soak.counts.items() if k.startswith("mutations.")},
        "daemon_counters": {
            k: v for k, v in status["counters"].items()
            if k.startswith(("watch_given_up", "worktrees_", "worktree_task", "watch_miss", "captures."))
        },
        "settle_s": options.settle,
        "stop_s": stop_s,
        "load_average": {"start": load_start, "end": load_average()},  # the machine is shared
        "log_tracebacks": log.count("Traceback"),
        "log_errors": sum(" ERROR " in line for line in log.splitlines()),
        "unclear": soak.unclear,  # each in full: every one is a bug to find
        "clear_samples": {kind: messages[:3] for kind, messages in sorted(soak.clear.items())},
        "difference_samples": soak.differences[:10],
    }
    report["ok"] = (
        report["restarts"] == 0 and report["differences"] == 0 and report["failed_unclear"] == 0
        and report["ping_failed"] == 0 and report["log_tracebacks"] == 0 and stop_s < 10
    )
    if report["ok"]:
        shutil.rmtree(root, ignore_errors=True)
    else:
        report["kept"] = str(root)
    return report


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--duration", type=float, default=180.0, help="seconds (default 180)")
    parse.add_argument("--worktrees", type=int, default=20)
    parse.add_argument("--sessions", type=int, default=10, help="checkpointing client threads")
    parse.add_argument("--folders", type=int, default=30, help="folders in each new worktree")
    parse.add_argument("--pace", type=float, default=0.05, help="seconds between two mutations")
    parse.add_argument("--verify-share", type=float, default=0.3, help="share of checkpoints compared with git")
    parse.add_argument("--lower-at", type=float, default=0.5, help="when to lower the watch limit (share of the run)")
    parse.add_argument("--seed", type=int, default=1)
    parse.add_argument("--settle", type=float, default=0.0, help="seconds the daemon is left alone before it is stopped")
    parse.add_argument("--json", type=Path, help="also write the report here")
    return parse


def main() -> int:
    options = parser().parse_args()
    report = run(options)
    text = json.dumps(report, indent=2)
    print(text)
    if options.json is not None:
        options.json.write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
