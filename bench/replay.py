"""Replay a real project's history as agent turns against a real daemon, checked against git.

``python -m bench.replay REPO --turns N --start REV`` clones REPO (any local git
repository, bare or not) into a scratch folder checked out at REV, starts
``snapshotd serve`` on a socket of its own, and plays the next N first-parent
commits as turns. Each turn moves the worktree's files the way an agent's
edits would, through a private index of the replay's own and never the
worktree's index or HEAD::

    GIT_DIR=<REPO's git dir> GIT_WORK_TREE=<worktree> GIT_INDEX_FILE=<private>
        git read-tree --reset -u <commit>          # --move reset (default)
        git read-tree -m -u <previous> <commit>    # --move merge: keeps stat data

In reset mode the private index starts without stat data, so the first turn
rewrites every file (a burst of events); merge mode starts from a copy of the
worktree's index and writes only what differs.

After each turn the replay checkpoints through the socket (warm: the watcher
is live after the first capture) and, every ``--exact-every`` turns, once more
with ``exact: true`` in another session; each tree must equal git's
(``tests/oracle.py``: ``git add -A && git write-tree`` on a copy of the
worktree's index). An exact capture starts the warm state afresh, so
``--exact-every 0`` tests the warm path alone over the whole window.

Then it restores a sample of earlier turns and compares the worktree, file by
file and byte for byte, with a checkout of that turn's commit made the same
way into another folder. Paths the worktree ignores are left out (a restore
never touches them, and git's capture holds none of them), and a path whose
content git normalizes when it captures (``text=auto``, ``eol``) counts as
equal when git's clean of the file gives the checkpoint's blob. Last, it runs
``verify`` when the daemon has that method, and checks that the worktree's
own index and HEAD are byte for byte as they were.

``--config KEY=VALUE`` and ``--attributes LINE`` (both repeatable) give the
scratch clone settings and an ``info/attributes`` of its own, which outrank
the project's ``.gitattributes``: ``--config core.autocrlf=true --attributes
'* !text !eol'`` plays the project as a user with that setting would, every
path's line endings left to it. The clone's git dir then moves the files and
checks out the copies restores are compared with, so git applies the same
rules there.

It prints each difference as it finds it and one summary line (``--json``:
the summary as JSON on stdout), and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import json
import os
import random
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from snapshotd.client.rpc import Client
from snapshotd.errors import MethodNotFound, SnapshotdError

from .common import REPO_ROOT, git, summarize

sys.path.insert(0, str(REPO_ROOT / "tests"))
from daemon_helpers import child_env, start_daemon
from oracle import oracle_tree

MOVES = ("reset", "merge")
WARM_SESSION = "replay"
EXACT_SESSION = "replay-exact"
CALL_TIMEOUT_S = 900.0
DAEMON_STOP_TIMEOUT_S = 30.0


@dataclass
class Options:
    """What to replay and how."""

    repo: str
    start: str
    turns: int
    move: str = "reset"
    exact_every: int = 1
    restores: int = 10
    seed: int = 0
    work: str | None = None
    keep: bool = False
    verbose: bool = False
    size_cap: int | None = None
    config: tuple[str, ...] = ()  # KEY=VALUE set in the scratch clone
    attributes: tuple[str, ...] = ()  # lines of the scratch clone's info/attributes


@dataclass
class Difference:
    """One capture, restore or check that disagreed with git."""

    kind: str  # warm | exact | restore | after-restore | verify | worktree
    turn: int
    commit: str
    paths: list[str]
    detail: str = ""

    def line(self) -> str:
        """One line for a person, naming at most ten paths."""
        shown = ", ".join(self.paths[:10]) + (f" (+{len(self.paths) - 10} more)" if len(self.paths) > 10 else "")
        return f"turn {self.turn} {self.commit[:10]}: {self.kind} differs from git: {self.detail} {shown}".rstrip()


@dataclass
class Summary:
    """The figures of one replay."""

    repo: str
    start: str
    move: str
    turns: int = 0
    warm_captures: int = 0
    warm_diffs: int = 0
    exact_captures: int = 0
    exact_diffs: int = 0
    restores: int = 0
    restore_diffs: int = 0
    normalized_paths: int = 0
    verify_diffs: int | None = None
    verify_note: str = ""
    watch_miss: int = 0
    scans: dict[str, int] = field(default_factory=dict)
    cold_reasons: dict[str, int] = field(default_factory=dict)
    warm_ms: dict[str, Any] = field(default_factory=dict)
    warm_processes: dict[str, int] = field(default_factory=dict)  # git processes the warm captures started, by scan
    seconds: float = 0.0
    differences: list[Difference] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.differences)

    def line(self) -> str:
        """The final summary line."""
        verify = "n/a" if self.verify_diffs is None else str(self.verify_diffs)
        first = f"; first: {self.differences[0].line()}" if self.differences else ""
        return (
            f"replay {self.repo} from {self.start[:10]} ({self.move}): {self.turns} turns, "
            f"warm diffs {self.warm_diffs}/{self.warm_captures}, exact diffs {self.exact_diffs}/{self.exact_captures}, "
            f"restore diffs {self.restore_diffs}/{self.restores}, verify diffs {verify}, "
            f"watch_miss {self.watch_miss}, git processes of warm captures {sum(self.warm_processes.values())}, "
            f"{self.seconds:.1f} s{first}"
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["failed"] = self.failed
        return data


# --------------------------------------------------------------------------- git plumbing


def git_dir_of(repo: str | Path) -> Path:
    """The absolute git dir of a repository (a worktree or a bare one)."""
    return Path(os.fsdecode(git(repo, "rev-parse", "--absolute-git-dir").strip()))


def first_parent_commits(git_dir: Path, start: str, turns: int) -> list[str]:
    """``start`` and up to ``turns`` commits after it on HEAD's first-parent line, oldest first.

    Raises ValueError when ``start`` is not on that line.
    """
    start_id = git(git_dir, "rev-parse", "--verify", f"{start}^{{commit}}").decode().strip()
    later = git(git_dir, "rev-list", "--first-parent", "--reverse", f"{start_id}..HEAD").decode().split()
    if later:
        first_parent = git(git_dir, "rev-parse", f"{later[0]}^").decode().strip()
        if first_parent != start_id:
            raise ValueError(f"{start} is not on the first-parent line of HEAD; pick a commit of `git log --first-parent`.")
    return [start_id, *later[:turns]]


def tree_of(git_dir: Path, commit: str) -> str:
    return git(git_dir, "rev-parse", f"{commit}^{{tree}}").decode().strip()


def changed_paths(repo: str | Path, old: str, new: str) -> list[str]:
    """``<status>\\t<path>`` for every path that differs between two trees (git's own diff)."""
    out = git(repo, "diff-tree", "-r", "-z", "--no-renames", "--name-status", old, new)
    items = [os.fsdecode(p) for p in out.split(b"\0") if p]
    return [f"{status}\t{path}" for status, path in zip(items[::2], items[1::2], strict=True)]


def tree_entries(repo: str | Path, tree: str) -> dict[str, tuple[str, str]]:
    """Path -> (mode, oid) of every blob, link and gitlink in a tree."""
    entries = {}
    for item in git(repo, "ls-tree", "-r", "-z", "--full-tree", tree).split(b"\0"):
        if item:
            meta, path = item.split(b"\t", 1)
            mode, _, oid = meta.decode().split()
            entries[os.fsdecode(path)] = (mode, oid)
    return entries


class Mover:
    """Moves a worktree's files from one commit to the next through a private index."""

    def __init__(self, source: Path, worktree: Path, index: Path, mode: str) -> None:
        self.source, self.worktree, self.index, self.mode = source, worktree, index, mode

    def _git(self, *args: str) -> None:
        env = {"GIT_DIR": str(self.source), "GIT_WORK_TREE": str(self.worktree), "GIT_INDEX_FILE": str(self.index)}
        git(self.worktree, *args, env_extra=env)

    def prepare(self, first: str, worktree_index: Path) -> None:
        """Reset mode: the first commit read without stat data; merge mode: the worktree's index copied."""
        if self.mode == "merge":
            shutil.copy2(worktree_index, self.index)
        else:
            self._git("read-tree", first)

    def move(self, old: str, new: str) -> None:
        if self.mode == "merge":
            self._git("read-tree", "-m", "-u", old, new)
        else:
            self._git("read-tree", "--reset", "-u", new)


def check_out_copy(source: Path, commit: str, dest: Path, index: Path) -> None:
    """The files of ``commit`` as git checks them out (attributes and filters applied) into ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with contextlib.suppress(FileNotFoundError):
        index.unlink()
    env = {"GIT_DIR": str(source), "GIT_WORK_TREE": str(dest), "GIT_INDEX_FILE": str(index)}
    git(dest, "read-tree", "--reset", "-u", commit, env_extra=env)


# --------------------------------------------------------------------------- file comparison


def file_kinds(root: Path) -> dict[str, str]:
    """Path -> "link", "exec" or "file" for everything but folders under ``root`` (its .git left out)."""
    found = {}
    for folder, dirs, names in os.walk(root):
        if Path(folder) == root:
            dirs[:] = [d for d in dirs if d != ".git"]
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
            full = os.path.join(folder, name)
            mode = os.lstat(full).st_mode
            rel = os.path.relpath(full, root)
            if stat.S_ISLNK(mode):
                found[rel] = "link"
            elif stat.S_ISREG(mode):
                found[rel] = "exec" if mode & 0o100 else "file"
    return found


def same_entry(a: Path, b: Path, kind: str) -> bool:
    """Same link target, or the same bytes."""
    if kind == "link":
        return os.readlink(a) == os.readlink(b)
    return filecmp.cmp(a, b, shallow=False)


def ignored(worktree: Path, paths: list[str]) -> set[str]:
    """The paths git ignores in ``worktree`` (tracked paths never are)."""
    if not paths:
        return set()
    data = b"".join(os.fsencode(p) + b"\0" for p in paths)
    out = git(worktree, "check-ignore", "-z", "--stdin", input=data, ok=(0, 1))
    return {os.fsdecode(p) for p in out.split(b"\0") if p}


def cleaned_oid(worktree: Path, path: str) -> str:
    """The blob git's clean (attributes, eol) makes of a worktree file."""
    return git(worktree, "hash-object", f"--path={path}", "--", path).decode().strip()


def restore_differences(
    worktree: Path, expected: Path, captured: dict[str, tuple[str, str]], committed: dict[str, tuple[str, str]]
) -> tuple[list[str], int]:
    """Paths where the restored worktree differs from the commit's checkout; and how many git normalized.

    ``captured`` and ``committed`` are the entries of the restored
    checkpoint's tree and of the commit's. Where git's capture cleaned a file
    into another blob than the commit's (``text=auto``, ``eol``), the worktree
    file counts as equal when git's clean of it gives the captured blob.
    """
    have, want = file_kinds(worktree), file_kinds(expected)
    differ = sorted(
        p for p in have.keys() | want.keys()
        if have.get(p) != want.get(p) or not same_entry(worktree / p, expected / p, have[p])
    )
    skip = ignored(worktree, differ)
    differ = [p for p in differ if p not in skip]
    normalized = [
        p for p in differ
        if have.get(p) == want.get(p) and p in captured and captured[p] != committed.get(p)
        and cleaned_oid(worktree, p) == captured[p][1]
    ]
    return [p for p in differ if p not in normalized], len(normalized)


def fingerprint(paths: list[Path]) -> list[bytes | None]:
    """The bytes of each file (None when absent): the worktree's own index and HEAD."""
    out: list[bytes | None] = []
    for path in paths:
        try:
            out.append(path.read_bytes())
        except FileNotFoundError:
            out.append(None)
    return out


# --------------------------------------------------------------------------- the replay


@contextlib.contextmanager
def serving(home: Path, socket_path: Path, log: Path) -> Iterator[Client]:
    """A real ``snapshotd serve`` with its own home, and one connection to it; shut down at the end."""
    daemon = start_daemon(socket_path, log, env=child_env(SNAPSHOTD_HOME=str(home)))
    try:
        with Client(str(socket_path), timeout=CALL_TIMEOUT_S) as client:
            yield client
            with contextlib.suppress(OSError, ConnectionError, SnapshotdError):
                client.call("shutdown")
        daemon.wait(DAEMON_STOP_TIMEOUT_S)
    finally:
        daemon.kill()


class Replay:
    """One replay: a worktree, a mover, a daemon connection, and the figures so far."""

    def __init__(self, options: Options, scratch: Path, client: Client, commits: list[str]) -> None:
        self.options, self.scratch, self.client, self.commits = options, scratch, client, commits
        self.worktree = scratch / "worktree"
        # With rules of its own, the clone's git dir moves and checks out files, so git applies them there too.
        self.source = git_dir_of(self.worktree) if options.config or options.attributes else git_dir_of(options.repo)
        self.mover = Mover(self.source, self.worktree, scratch / "mover.index", options.move)
        self.summary = Summary(repo=options.repo, start=commits[0], move=options.move)
        self.checkpoints: dict[int, str] = {}  # turn -> a checkpoint whose tree equals git's
        self.warm_ms: list[float] = []
        self.scans: Counter[str] = Counter()
        self.warm_processes: Counter[str] = Counter()

    def report(self, difference: Difference) -> None:
        self.summary.differences.append(difference)
        print(difference.line(), file=sys.stderr, flush=True)

    def capture(self, turn: int, kind: str) -> None:
        """Checkpoint (warm, or exact), compare with git's tree, remember a good checkpoint of the turn."""
        params: dict[str, Any] = {"path": str(self.worktree), "label": f"turn {turn}"}
        params["session"] = EXACT_SESSION if kind == "exact" else WARM_SESSION
        if kind == "exact":
            params["exact"] = True
        result = self.client.call("checkpoint", params)
        got = result["checkpoint"]["tree"]
        want = oracle_tree(self.worktree, size_cap=self.options.size_cap, trust_stat=True)
        stats = result["stats"]
        if kind == "exact":
            self.summary.exact_captures += 1
        else:
            self.summary.warm_captures += 1
            self.scans[stats["scan"]] += 1
            self.warm_processes[stats["scan"]] += int(stats.get("processes", 0))
            self.warm_ms.append(float(stats["ms"]))
        if self.options.verbose:
            print(f"turn {turn} {kind}: scan {stats['scan']}, hashed {stats['hashed']}, "
                  f"{stats['ms']:.0f} ms, {'ok' if got == want else 'DIFFERS'}", file=sys.stderr, flush=True)
        if got == want:
            self.checkpoints.setdefault(turn, result["checkpoint"]["id"])
            return
        paths = changed_paths(self.worktree, want, got)
        self.report(Difference(kind, turn, self.commits[turn], paths,
                               f"scan {stats['scan']}, hashed {stats['hashed']}; paths (git's -> capture):"))

    def play(self) -> None:
        """Every turn: move the files, capture warm (and exact when due), compare."""
        summary = self.summary
        for turn, commit in enumerate(self.commits):
            if turn:
                self.mover.move(self.commits[turn - 1], commit)
                summary.turns += 1
            self.capture(turn, "warm")
            every = self.options.exact_every
            if every and turn % every == 0:
                self.capture(turn, "exact")

    def restore_sample(self) -> list[int]:
        """Which earlier turns to restore: spread over the window, in a shuffled order."""
        candidates = sorted(t for t in self.checkpoints if t < len(self.commits) - 1)
        count = min(self.options.restores, len(candidates))
        if count <= 0:
            return []
        step = len(candidates) / count
        chosen = [candidates[int(i * step)] for i in range(count)]
        random.Random(self.options.seed).shuffle(chosen)
        return chosen

    def restore(self, turn: int) -> None:
        """Restore one earlier turn, compare its files with the commit's checkout, capture once more."""
        checkpoint = self.checkpoints[turn]
        commit = self.commits[turn]
        expected = self.scratch / "expected"
        check_out_copy(self.source, commit, expected, self.scratch / "expected.index")
        self.summary.restores += 1
        try:
            result = self.client.call("restore", {"checkpoint": checkpoint, "path": str(self.worktree)})
        except SnapshotdError as exc:
            self.report(Difference("restore", turn, commit, [], f"restore failed: {exc.message}"))
            return
        left_alone = sorted(item["path"] for item in result.get("skipped", []))
        if left_alone:  # nothing else writes to the worktree here, so nothing may be left as a conflict
            self.report(Difference("restore", turn, commit, left_alone, "the restore left paths alone:"))
        captured = tree_entries(self.worktree, f"{checkpoint}^{{tree}}")
        committed = tree_entries(self.source, commit)
        differ, normalized = restore_differences(self.worktree, expected, captured, committed)
        self.summary.normalized_paths += normalized
        if differ:
            self.report(Difference("restore", turn, commit, differ, "files differ from the commit's checkout:"))
        self.capture(turn, "after-restore")

    def verify(self) -> None:
        """The daemon's ``verify``, when it has one: its warm state against a full scan."""
        try:
            result = self.client.call("verify", {"path": str(self.worktree)})
        except MethodNotFound:
            self.summary.verify_note = "this daemon has no verify method; skipped"
            print(f"note: {self.summary.verify_note}", file=sys.stderr, flush=True)
            return
        found = result.get("differences", [])
        self.summary.verify_diffs = len(found)
        if found:
            paths = [f"{d.get('path')} ({d.get('cause')})" for d in found]
            self.report(Difference("verify", len(self.commits) - 1, self.commits[-1], paths, "warm state vs full scan:"))

    def finish_figures(self) -> None:
        """Counters from the daemon and the capture-time statistics."""
        counters = self.client.call("status").get("counters", {})
        self.summary.watch_miss = int(counters.get("watch_miss", 0))
        self.summary.cold_reasons = {
            k.removeprefix("cold_reasons."): v for k, v in sorted(counters.items()) if k.startswith("cold_reasons.")
        }
        self.summary.scans = dict(self.scans)
        self.summary.warm_processes = dict(self.warm_processes)
        self.summary.warm_ms = summarize(self.warm_ms)
        self.summary.warm_diffs = sum(d.kind in ("warm", "after-restore") for d in self.summary.differences)
        self.summary.exact_diffs = sum(d.kind == "exact" for d in self.summary.differences)
        self.summary.restore_diffs = sum(d.kind == "restore" for d in self.summary.differences)


def make_worktree(source: Path, start: str, worktree: Path, config: tuple[str, ...] = (),
                  attributes: tuple[str, ...] = ()) -> None:
    """A clone of the source checked out (detached) at ``start`` under the given rules, its index refreshed."""
    git(worktree.parent, "clone", "-q", "--no-checkout", str(source), str(worktree))
    for setting in config:
        key, equals, value = setting.partition("=")
        if not equals:
            raise ValueError(f"--config takes KEY=VALUE, not {setting!r}.")
        git(worktree, "config", key, value)
    if attributes:
        info = git_dir_of(worktree) / "info"
        info.mkdir(exist_ok=True)
        (info / "attributes").write_text("".join(line + "\n" for line in attributes))
    git(worktree, "checkout", "-q", "--detach", start)
    git(worktree, "update-index", "-q", "--refresh", ok=(0, 1))


def replay(options: Options) -> Summary:
    """Run one replay; the scratch folder is removed afterwards unless ``keep``."""
    if options.move not in MOVES:
        raise ValueError(f"--move must be one of {', '.join(MOVES)}, not {options.move!r}.")
    started = time.monotonic()
    source = git_dir_of(options.repo)
    commits = first_parent_commits(source, options.start, options.turns)
    if options.work:
        os.makedirs(options.work, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="snapshotd-replay-", dir=options.work))
    try:
        worktree = scratch / "worktree"
        make_worktree(source, commits[0], worktree, options.config, options.attributes)
        own = [git_dir_of(worktree) / "index", git_dir_of(worktree) / "HEAD"]
        before = fingerprint(own)
        with serving(scratch / "home", scratch / "daemon.sock", scratch / "daemon.log") as client:
            run = Replay(options, scratch, client, commits)
            run.mover.prepare(commits[0], own[0])
            run.play()
            for turn in run.restore_sample():
                run.restore(turn)
            run.verify()
            run.finish_figures()
        if fingerprint(own) != before:
            run.report(Difference("worktree", len(commits) - 1, commits[-1], [str(p) for p in own],
                                  "the worktree's own index or HEAD changed:"))
        run.summary.seconds = round(time.monotonic() - started, 1)
        return run.summary
    finally:
        if options.keep:
            print(f"note: kept {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def parse_args(argv: list[str] | None) -> tuple[Options, bool]:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", help="a local git repository (a worktree or a bare git dir)")
    parser.add_argument("--start", default="HEAD~100", help="the first commit (on HEAD's first-parent line)")
    parser.add_argument("--turns", type=int, default=100, help="how many commits to play after --start")
    parser.add_argument("--move", choices=MOVES, default="reset",
                        help="read-tree --reset -u (default) or -m -u, which keeps stat data")
    parser.add_argument("--exact-every", type=int, default=1, metavar="K",
                        help="an exact capture every K turns (0: none); it starts the warm state afresh")
    parser.add_argument("--restores", type=int, default=10, help="how many earlier turns to restore")
    parser.add_argument("--seed", type=int, default=0, help="order of the restores")
    parser.add_argument("--work", help="folder for the scratch clone (default: the system's temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch clone, daemon log and home")
    parser.add_argument("--verbose", action="store_true", help="one line per capture")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the scratch clone (repeatable), e.g. core.autocrlf=true")
    parser.add_argument("--attributes", action="append", default=[], metavar="LINE",
                        help="a line of the scratch clone's info/attributes (repeatable), e.g. '* !text !eol'")
    args = parser.parse_args(argv)
    options = Options(repo=args.repo, start=args.start, turns=args.turns, move=args.move,
                      exact_every=args.exact_every, restores=args.restores, seed=args.seed,
                      work=args.work, keep=args.keep, verbose=args.verbose, config=tuple(args.config),
                      attributes=tuple(args.attributes))
    return options, args.json


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the daemon is stopped and the scratch folder removed."""
    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 when every capture, restore and check agreed with git, 1 otherwise."""
    options, as_json = parse_args(argv)
    _stop_on_sigterm()
    try:
        summary = replay(options)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary.to_json(), indent=1) if as_json else summary.line(), flush=True)
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
