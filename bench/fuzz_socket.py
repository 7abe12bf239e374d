"""Fuzz a real daemon's socket for a while, with its memory and descriptors watched.

    python -m bench.fuzz_socket --duration 600 [--json results.json]

Starts ``snapshotd serve`` on a private socket with its own home and a small
git repository, then runs at once: clients calling every method (but
``shutdown``) with params of every JSON type and odd strings (lone
surrogates, NUL, very long paths, huge numbers), clients sending random
bytes and malformed JSON, slow clients that send a byte at a time, clients
that pipeline big diffs and never read, and clients that only hold idle
connections, a client that subscribes again and again on one connection
(past the per-connection cap), and a renamer that moves a tree of many
folders in and out of the worktree. A sampler reads the daemon's VmRSS and
``/proc/<pid>/fd`` every half second (kept every 30 s as ``rss_timeline``:
seconds, MiB, descriptors) and pings it; the load average and the
time the daemon's loop thread waited for a CPU (its schedstat) say how much
of a slow ping was the machine's other work. Exits 1 if the daemon
dies, stops answering ping, goes over the bounds (ping p99 included), or logs
a traceback; prints a JSON summary either way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from snapshotd.client.rpc import Client
from snapshotd.contract.framing import encode_message

METHODS = [
    "ping", "open", "worktrees", "checkpoint", "list", "show", "diff", "restore", "revert",
    "delete", "gc", "repair", "status", "subscribe", "unsubscribe", "no_such_method",
]
PARAM_NAMES = [
    "path", "worktree", "session", "label", "exact", "limit", "checkpoint", "checkpoints", "from", "to",
    "paths", "patch", "context", "dry_run", "force", "allow_other_worktree", "keep", "older_than_s",
    "subscription", "offset", "max_patch_bytes", "all",
]
PING_TIMEOUT_S = 20.0


class Fuzz:
    """Shared state: the daemon, its repository, and counters the clients fill."""

    def __init__(self, sock: Path, repo: Path, seed: int) -> None:
        self.sock = sock
        self.repo = repo
        self.checkpoints: list[str] = []
        self.sent = Counter[str]()
        self.outcomes = Counter[str]()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.seed = seed

    def count(self, counter: Counter[str], key: str, n: int = 1) -> None:
        with self.lock:
            counter[key] += n

    def value(self, rng: random.Random) -> Any:
        """A param value of any JSON type, often one a method expects, often an odd one."""
        choices = [
            lambda: str(self.repo),
            lambda: str(self.repo / "sub"),
            lambda: rng.choice(self.checkpoints) if self.checkpoints else "abc1234",
            lambda: "worktree",
            lambda: "@",
            lambda: "s" + str(rng.randrange(5)),
            lambda: "\ud800" + str(self.repo),
            lambda: str(self.repo) + "\0x",
            lambda: "/" + "x" * rng.choice([255, 4096, 5000, 70_000]),
            lambda: "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(20))),
            lambda: rng.randrange(-(2**70), 2**70),
            lambda: rng.choice([0, 1, -1, 2**31, 2**63, 2**64]),
            lambda: rng.random() * 1e300,
            lambda: rng.choice([True, False, None]),
            lambda: [self.value(rng) for _ in range(rng.randrange(4))],
            lambda: {"k": self.value(rng)},
            lambda: ["a.txt", "big.txt", "sub"],
        ]
        return rng.choice(choices)()

    def message(self, rng: random.Random) -> bytes:
        method = rng.choice(METHODS)
        params = {name: self.value(rng) for name in rng.sample(PARAM_NAMES, rng.randrange(5))}
        if rng.random() < 0.5:
            params["path"] = str(self.repo)
        self.count(self.sent, method)
        return encode_message({"jsonrpc": "2.0", "id": rng.randrange(2**31), "method": method, "params": params})


def garbage(rng: random.Random) -> bytes:
    """Random bytes or broken JSON, one line."""
    kinds = [
        lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(200))).replace(b"\n", b""),
        lambda: b'{"jsonrpc":"2.0","id":1,"method":',
        lambda: b"[" * 100_000,
        lambda: b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}',
        lambda: b'{"jsonrpc":"2.0","id":1,"method":"ping","params":[1,2]}',
        lambda: b'{"jsonrpc":"1.0","id":{},"method":7}',
        lambda: b"\xff\xfe\xfd",
        lambda: b'"\\ud800"',
        lambda: b"NaN",
    ]
    return rng.choice(kinds)() + b"\n"


def read_replies(conn: socket.socket, fuzz: Fuzz, buffer: bytearray) -> None:
    """Count the kinds of whatever complete lines have arrived."""
    with contextlib.suppress(BlockingIOError, TimeoutError, OSError):
        while chunk := conn.recv(1 << 20):
            buffer += chunk
            if len(buffer) > 64 << 20:
                del buffer[:]
    *lines, rest = bytes(buffer).split(b"\n")
    buffer[:] = rest
    for line in lines:
        try:
            reply = json.loads(line)
        except ValueError:
            fuzz.count(fuzz.outcomes, "unreadable reply")
            continue
        error = reply.get("error")
        if error is None:
            fuzz.count(fuzz.outcomes, "notification" if "method" in reply else "result")
        else:
            kind = (error.get("data") or {}).get("kind")
            fuzz.count(fuzz.outcomes, f"error {error['code']}" + (f" {kind}" if kind else ""))


def connect(fuzz: Fuzz) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(fuzz.sock))
    return conn


def caller(fuzz: Fuzz, index: int) -> None:
    """Pipelines random requests and garbage, reading what comes back."""
    rng = random.Random(fuzz.seed + index)
    while not fuzz.stop.is_set():
        with contextlib.suppress(OSError), connect(fuzz) as conn:
            conn.settimeout(2)
            buffer = bytearray()
            for _ in range(rng.randrange(1, 50)):
                data = garbage(rng) if rng.random() < 0.2 else fuzz.message(rng)
                conn.sendall(data)
                if rng.random() < 0.3:
                    read_replies(conn, fuzz, buffer)
            conn.settimeout(5)
            read_replies(conn, fuzz, buffer)


def slow(fuzz: Fuzz, index: int) -> None:
    """Sends a request a byte at a time, then hangs up."""
    rng = random.Random(fuzz.seed + 1000 + index)
    while not fuzz.stop.is_set():
        with contextlib.suppress(OSError), connect(fuzz) as conn:
            for byte in fuzz.message(rng):
                conn.send(bytes([byte]))
                time.sleep(0.01)
                if fuzz.stop.is_set():
                    return


def hog(fuzz: Fuzz, index: int) -> None:
    """Pipelines big diffs and a subscription and never reads; reconnects now and then."""
    rng = random.Random(fuzz.seed + 2000 + index)
    while not fuzz.stop.is_set():
        with contextlib.suppress(OSError), connect(fuzz) as conn:
            conn.setblocking(False)
            lines = [
                encode_message({"jsonrpc": "2.0", "id": 0, "method": "subscribe", "params": {"path": str(fuzz.repo)}})
            ]
            if fuzz.checkpoints:
                lines += [
                    encode_message({"jsonrpc": "2.0", "id": n, "method": "diff",
                                    "params": {"from": fuzz.checkpoints[0], "path": str(fuzz.repo), "patch": True}})
                    for n in range(1, 60)
                ]
            with contextlib.suppress(BlockingIOError):
                conn.sendall(b"".join(lines))
            fuzz.count(fuzz.sent, "diff (unread)", len(lines) - 1)
            fuzz.stop.wait(rng.uniform(5, 30))


def idler(fuzz: Fuzz, count: int) -> None:
    """Holds many idle connections, renewing some."""
    held: list[socket.socket] = []
    while not fuzz.stop.is_set():
        while len(held) < count:
            with contextlib.suppress(OSError):
                held.append(connect(fuzz))
        for conn in held[: count // 10]:
            conn.close()
        del held[: count // 10]
        fuzz.stop.wait(2)
    for conn in held:
        conn.close()


def churn(fuzz: Fuzz) -> None:
    """Edits the repository so that captures, diffs and notifications have work."""
    rng = random.Random(fuzz.seed + 3000)
    while not fuzz.stop.is_set():
        (fuzz.repo / f"churn{rng.randrange(50)}.txt").write_text(str(rng.random()) * rng.randrange(1, 1000))
        fuzz.stop.wait(0.2)


def subscriber(fuzz: Fuzz) -> None:
    """Subscribes on one connection over and over, reading the answers: the cap must hold."""
    line = encode_message({"jsonrpc": "2.0", "id": 1, "method": "subscribe", "params": {"path": str(fuzz.repo)}})
    while not fuzz.stop.is_set():
        with contextlib.suppress(OSError), connect(fuzz) as conn:
            conn.settimeout(5)
            buffer = bytearray()
            for _ in range(20):
                conn.sendall(line * 100)
                fuzz.count(fuzz.sent, "subscribe (loop)", 100)
                read_replies(conn, fuzz, buffer)
                if fuzz.stop.is_set():
                    return


def make_tree(root: Path, folders: int) -> None:
    """``folders`` folders, ten to a level, with a file in every tenth."""
    made = 0
    level = [root]
    root.mkdir()
    while made < folders:
        below = []
        for parent in level:
            for n in range(10):
                if made >= folders:
                    break
                child = parent / f"d{n}"
                child.mkdir()
                if made % 10 == 0:
                    (child / "f.txt").write_text("x\n")
                below.append(child)
                made += 1
        level = below


def renamer(fuzz: Fuzz, outside: Path) -> None:
    """Moves a large tree into the worktree and out again, as a neighbour might, every few seconds."""
    inside = fuzz.repo / "bigtree"
    while not fuzz.stop.is_set():
        with contextlib.suppress(OSError):
            os.rename(outside, inside)
            fuzz.count(fuzz.sent, "tree moved in")
            fuzz.stop.wait(3)
            os.rename(inside, outside)
        fuzz.stop.wait(3)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def sample(pid: int) -> tuple[int, int]:
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def schedstat(pid: int) -> tuple[float, float]:
    """Seconds the daemon's main (trio) thread ran and waited for a CPU (the machine's own load)."""
    ran, waited, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    return int(ran) / 1e9, int(waited) / 1e9


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def make_repo(repo: Path) -> None:
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("alpha\n")
    (repo / "sub").mkdir()
    (repo / "sub" / "b.txt").write_text("beta\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=f", "-c", "user.email=f@f", "commit", "-qm", "one"], check=True
    )


def run(
    duration: float, rss_bound_mib: int, fd_bound: int, seed: int, tree_folders: int = 20_000, ping_p99_ms: float = 100.0
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="snapshotd-fuzz-") as tmp:
        root = Path(tmp)
        sock, repo = root / "run" / "s.sock", root / "repo"
        make_repo(repo)
        outside = root / "bigtree"
        if tree_folders:
            make_tree(outside, tree_folders)
        env = dict(os.environ, SNAPSHOTD_HOME=str(root / "home"), HOME=str(root), XDG_CONFIG_HOME=str(root / "cfg"))
        env.pop("SNAPSHOTD_SOCKET", None)
        with open(root / "daemon.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "snapshotd", "serve", "--socket", str(sock)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        fuzz = Fuzz(sock, repo, seed)
        summary: dict[str, Any] = {"duration_s": duration, "seed": seed, "failures": []}
        try:
            deadline = time.monotonic() + 15
            while not sock.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            with Client(str(sock), timeout=60) as client:
                first = client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]
                (repo / "big.txt").write_text("".join(f"line {n} of a big patch\n" for n in range(150_000)))
                fuzz.checkpoints = [first, client.call("checkpoint", {"path": str(repo)})["checkpoint"]["id"]]
            workers = [threading.Thread(target=caller, args=(fuzz, n), daemon=True) for n in range(4)]
            workers += [threading.Thread(target=slow, args=(fuzz, n), daemon=True) for n in range(2)]
            workers += [threading.Thread(target=hog, args=(fuzz, n), daemon=True) for n in range(3)]
            workers += [threading.Thread(target=idler, args=(fuzz, 200), daemon=True)]
            workers += [threading.Thread(target=churn, args=(fuzz,), daemon=True)]
            workers += [threading.Thread(target=subscriber, args=(fuzz,), daemon=True)]
            if tree_folders:
                workers += [threading.Thread(target=renamer, args=(fuzz, outside), daemon=True)]
            for worker in workers:
                worker.start()
            max_rss = max_fds = 0
            first_rss, first_fds = sample(proc.pid)
            first_sched, first_load = schedstat(proc.pid), loadavg()
            ping_ms: list[float] = []
            timeline: list[list[float]] = []  # [seconds, RSS MiB, descriptors] every 30 s: levelling off or growing?
            began = time.monotonic()
            end = began + duration
            while time.monotonic() < end:
                if proc.poll() is not None:
                    summary["failures"].append(f"the daemon exited with {proc.returncode}")
                    break
                rss, fds = sample(proc.pid)
                max_rss, max_fds = max(max_rss, rss), max(max_fds, fds)
                if time.monotonic() - began >= 30 * len(timeline):
                    timeline.append([round(time.monotonic() - began), round(rss / 1024, 1), fds])
                started = time.monotonic()
                try:
                    with Client(str(sock), timeout=PING_TIMEOUT_S) as client:
                        client.call("ping")
                except (OSError, ConnectionError) as exc:
                    summary["failures"].append(f"ping failed: {exc!r}")
                    break
                ping_ms.append((time.monotonic() - started) * 1000)
                time.sleep(0.5)
            fuzz.stop.set()
            last_rss, last_fds = sample(proc.pid)
            last_sched = schedstat(proc.pid)
            log_text = (root / "daemon.log").read_text(errors="replace")
            summary.update(
                rss_mib={"start": round(first_rss / 1024, 1), "max": round(max_rss / 1024, 1),
                         "end": round(last_rss / 1024, 1)},
                fds={"start": first_fds, "max": max_fds, "end": last_fds},
                rss_timeline=timeline,
                max_rss_mib=round(max_rss / 1024, 1),
                max_fds=max_fds,
                pings=len(ping_ms),
                ping_ms={"p50": round(percentile(ping_ms, 0.5), 1), "p99": round(percentile(ping_ms, 0.99), 1),
                         "max": round(max(ping_ms, default=0.0), 1)},
                loadavg={"start": first_load, "end": loadavg()},
                loop_thread_s={"ran": round(last_sched[0] - first_sched[0], 1),
                               "waited_for_cpu": round(last_sched[1] - first_sched[1], 1)},
                log_tracebacks=log_text.count("Traceback"),
                requests_sent=sum(fuzz.sent.values()),
                sent_by_method=dict(fuzz.sent),
                replies_by_kind=dict(fuzz.outcomes),
                internal_errors=fuzz.outcomes.get("error -32603", 0),
            )
            if max_rss > rss_bound_mib * 1024:
                summary["failures"].append(f"RSS reached {max_rss} KiB, over {rss_bound_mib} MiB")
            if max_fds > fd_bound:
                summary["failures"].append(f"{max_fds} descriptors open, over {fd_bound}")
            if percentile(ping_ms, 0.99) > ping_p99_ms:
                summary["failures"].append(f"ping p99 {percentile(ping_ms, 0.99):.1f} ms, over {ping_p99_ms:g} ms")
            if summary["log_tracebacks"]:
                summary["failures"].append(f"{summary['log_tracebacks']} tracebacks in the daemon's log")
            if summary["internal_errors"] or summary["log_tracebacks"]:
                summary["failures"].append(f"{summary['internal_errors']} internal errors")
                summary["log_tail"] = (root / "daemon.log").read_text(errors="replace")[-4000:]
        finally:
            fuzz.stop.set()
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                summary["failures"].append("the daemon did not stop within 30 s of SIGTERM")
                proc.kill()
                proc.wait()
        return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds to fuzz (default 600)")
    parser.add_argument("--rss-bound-mib", type=int, default=400, help="fail above this RSS (default 400)")
    parser.add_argument("--fd-bound", type=int, default=1500, help="fail above this many descriptors")
    parser.add_argument("--tree-folders", type=int, default=20_000, help="folders of the tree moved in and out (0: none)")
    parser.add_argument("--ping-p99-ms", type=float, default=100.0, help="fail when ping's p99 is above this")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    summary = run(args.duration, args.rss_bound_mib, args.fd_bound, args.seed, args.tree_folders, args.ping_p99_ms)
    text = json.dumps(summary, indent=2, sort_keys=True)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
