"""The cases: what changes between captures, and how every method is timed on it.

Every case starts from the same state: the tree reset to its branch's commit,
no untracked files, and the user's index refreshed past git's racy window.
Then each method that keeps state between calls captures once (not timed),
and the timed iterations follow. In an iteration the case changes the tree
once and every method captures that same state, one after the other; the
order rotates by one method each iteration (A B C D, B C D A, ...), so drift
hits every method alike and none is always the first to write the new
objects into the object database. Captures must agree: every method's tree
id is compared in every iteration.

Restore cases change the tree again before each method's restore (a restore
undoes the change). Whole-tree restore runs method by method (each in its own
block, from a fresh reset), because one peer rewrites every file of the tree
and would change what the next method measures.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from .common import git, refresh_index, summarize
from .methods import Method, Sample
from .ours import Daemon
from .trees import MAIN_BRANCH, OTHER_BRANCH, Tree, apply_release

QUIESCE_STEP_S = 0.1
QUIESCE_IDLE_CPU_S = 0.005  # less than 5 % of a CPU over a step: idle
QUIESCE_LIMIT_S = 10.0
RESTORE_ALL_ITERATIONS = 3
BIG_FILE = "big/data.csv"
BIG_SIZE = 100 * 1024 * 1024


@dataclass
class Case:
    """One scenario: its name, kind and a few words for the report."""

    name: str
    kind: str  # "capture" | "restore" | "diff"
    title: str


CAPTURE_CASES = [
    Case("clean", "capture", "clean capture (nothing changed since the last one)"),
    Case("changed-1", "capture", "1 file changed"),
    Case("changed-10", "capture", "10 files changed"),
    Case("changed-1000", "capture", "1,000 files changed"),
    Case("big-100MiB", "capture", "a 100 MiB tracked file changed"),
    Case("checkout", "capture", "`git checkout` of another branch between captures"),
]
OTHER_CASES = [
    Case("restore-10", "restore", "restore 10 changed files"),
    Case("restore-all", "restore", "restore the whole tree (10 changed, 5 deleted, 5 new files)"),
    Case("diff-10", "diff", "diff of a 10-file turn, with patch"),
]
REAL_CASES = [
    Case("clean", "capture", "clean capture"),
    Case("release-turn", "capture", "one release applied over the tree (a real diff)"),
]
ALL_CASES = {c.name: c for c in CAPTURE_CASES + OTHER_CASES + REAL_CASES}


def reset_tree(tree: Tree) -> None:
    """Back to the main branch's commit: no changes, no untracked files, index fresh."""
    git(tree.path, "checkout", "-q", "-f", MAIN_BRANCH)
    git(tree.path, "reset", "-q", "--hard", "HEAD")
    git(tree.path, "clean", "-fdq")
    refresh_index(tree.path)


def pick(tracked: Sequence[str], k: int, salt: int = 0) -> list[str]:
    """``k`` tracked paths spread over the tree (never ``.gitignore``)."""
    candidates = [p for p in tracked if not p.endswith(".gitignore")]
    if k >= len(candidates):
        return list(candidates)
    step = len(candidates) / k
    return [candidates[int(i * step + salt) % len(candidates)] for i in range(k)]


def edit(root: str, paths: Sequence[str], token: str) -> None:
    for rel in paths:
        with open(os.path.join(root, rel), "ab") as fh:
            fh.write(f"\n// bench edit {token}\n".encode())


def _big_block(seed: int = 7) -> bytes:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "value", "count", "north", "south", "0.125", "42"]
    lines = []
    size = 0
    while size < 1 << 20:
        line = ",".join(rng.choice(words) for _ in range(8)) + "\n"
        lines.append(line)
        size += len(line)
    return "".join(lines).encode()[: 1 << 20]


def write_big(root: str) -> None:
    path = Path(root, BIG_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    block = _big_block()
    with open(path, "wb") as fh:
        for i in range(BIG_SIZE // len(block)):
            fh.write(f"block,{i}\n".encode())
            fh.write(block[len(f"block,{i}\n") :])


def touch_big(root: str, token: int) -> None:
    """Change 4 KiB somewhere inside the big file (a new blob of 100 MiB to hash)."""
    offset = (token * 4096 * 97) % (BIG_SIZE - 8192)
    with open(os.path.join(root, BIG_FILE), "r+b") as fh:
        fh.seek(offset)
        fh.write((f"edit {token} " * 400).encode()[:4096])


@dataclass
class Collected:
    """Samples of one method in one case."""

    samples: list[Sample] = field(default_factory=list)
    wrong: int = 0  # restores that did not give the expected files, diffs with the wrong count
    daemon_cpu_ms: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        ms = [s.ms for s in self.samples]
        procs = [s.processes for s in self.samples]
        out: dict[str, Any] = {
            "ms": summarize(ms),
            "processes": {"min": min(procs), "max": max(procs), "median": sorted(procs)[len(procs) // 2]}
            if procs
            else {},
            "samples_ms": [round(v, 2) for v in ms],
            "wrong": self.wrong,
        }
        engine = [s.engine_ms for s in self.samples if s.engine_ms is not None]
        if engine:
            out["engine_ms"] = summarize(engine)
        scans = Counter(s.scan for s in self.samples if s.scan)
        if scans:
            out["scans"] = dict(scans)
        hashed = [s.hashed for s in self.samples if s.hashed is not None]
        if hashed:
            out["hashed_max"] = max(hashed)
        if self.daemon_cpu_ms:
            out["daemon_cpu_ms_mean"] = round(sum(self.daemon_cpu_ms) / len(self.daemon_cpu_ms), 2)
        return out


class CaseRunner:
    """Runs the cases on one tree with a given set of methods."""

    def __init__(
        self,
        tree: Tree,
        methods: Sequence[Method],
        iterations: int,
        daemon: Daemon | None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.tree = tree
        self.methods = list(methods)
        self.iterations = iterations
        self.daemon = daemon
        self.log = log
        self.tracked = tree.tracked()

    # --- timing helpers ----------------------------------------------------------

    async def _quiesce(self) -> None:
        """Wait until the daemon is idle, so no method is timed while it digests the last one's events.

        The daemon watches each tree, git dir included, so a peer's ``git add -A``
        (which touches every stored object it finds again) or a full checkout
        leaves it thousands of events to read, and after 5 s without captures it
        reconciles the worktree with a full scan. Both would otherwise land in
        the next method's time.
        """
        if self.daemon is None:
            return
        deadline = trio.current_time() + QUIESCE_LIMIT_S
        while trio.current_time() < deadline:
            cpu = self.daemon.cpu_seconds()
            await trio.sleep(QUIESCE_STEP_S)
            if self.daemon.cpu_seconds() - cpu < QUIESCE_IDLE_CPU_S:
                return

    async def _timed(self, method: Method, collected: Collected, call: Callable[[], Awaitable[Sample]]) -> Sample:
        await self._quiesce()
        cpu = self.daemon.cpu_seconds() if self.daemon is not None else 0.0
        sample = await call()
        if self.daemon is not None and method.family != "snapshotd":
            collected.daemon_cpu_ms.append((self.daemon.cpu_seconds() - cpu) * 1000)
        collected.samples.append(sample)
        return sample

    def _order(self, methods: Sequence[Method], iteration: int) -> list[Method]:
        shift = iteration % len(methods)
        return list(methods[shift:]) + list(methods[:shift])

    def _result(self, case: Case, collected: dict[str, Collected], mode: str, notes: list[str],
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
        out = {
            "tree": self.tree.name,
            "files": self.tree.files,
            "case": case.name,
            "title": case.title,
            "kind": case.kind,
            "iterations": self.iterations,
            "mode": mode,
            "methods": {name: c.to_json() for name, c in collected.items()},
            "notes": notes,
        }
        if extra:
            out.update(extra)
        return out

    # --- capture cases -------------------------------------------------------------

    async def capture_case(
        self,
        case: Case,
        *,
        setup: Callable[[], None] | None = None,
        mutate: Callable[[int], dict[str, Any] | None] | None = None,
        teardown: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        methods = [m for m in self.methods if m.can_capture]
        reset_tree(self.tree)
        if setup is not None:
            setup()
        for method in methods:
            if method.family != "baseline" and method.name not in ("naive", "t3-style"):
                await method.capture(self.tree)  # state-keeping methods start from a capture
        collected = {m.name: Collected() for m in methods}
        disagreements: list[dict[str, Any]] = []
        turns: list[dict[str, Any]] = []
        for it in range(self.iterations):
            if mutate is not None:
                info = mutate(it)
                if info:
                    turns.append(info)
            trees: dict[str, str] = {}
            for method in self._order(methods, it):
                sample = await self._timed(method, collected[method.name], lambda m=method: m.capture(self.tree))
                if sample.tree is not None:
                    trees[method.name] = sample.tree
            if len(set(trees.values())) > 1:
                disagreements.append({"iteration": it, "trees": trees})
        if teardown is not None:
            teardown()
        notes = []
        if disagreements:
            notes.append(f"captures disagreed in {len(disagreements)} iteration(s)")
        extra: dict[str, Any] = {"agree": not disagreements, "disagreements": disagreements[:5]}
        if turns:
            extra["turns"] = turns
        return self._result(case, collected, "interleaved", notes, extra)

    # --- restore cases -------------------------------------------------------------

    async def restore_10(self, case: Case) -> dict[str, Any]:
        methods = [m for m in self.methods if m.can_restore]
        reset_tree(self.tree)
        paths = pick(self.tracked, 10, salt=3)
        originals = {p: Path(self.tree.path, p).read_bytes() for p in paths}
        anchors = {m.name: (await m.capture(self.tree)).ref for m in methods}
        collected = {m.name: Collected() for m in methods}
        for it in range(self.iterations):
            for method in self._order(methods, it):
                edit(self.tree.path, paths, f"restore {it} {method.name}")
                ref = anchors[method.name]
                assert ref is not None
                await self._timed(method, collected[method.name],
                                  lambda m=method, r=ref: m.restore(self.tree, r, paths))
                collected[method.name].wrong += sum(
                    Path(self.tree.path, p).read_bytes() != data for p, data in originals.items()
                )
        return self._result(case, collected, "interleaved", [])

    async def restore_all(self, case: Case) -> dict[str, Any]:
        methods = [m for m in self.methods if m.can_restore]
        changed = pick(self.tracked, 10, salt=5)
        deleted = [p for p in pick(self.tracked, 15, salt=11) if p not in changed][:5]
        created = [f"bench_new/n{i}.txt" for i in range(5)]
        collected = {m.name: Collected() for m in methods}
        notes: list[str] = []
        # One peer rewrites every file of the tree on each restore (over a minute at
        # 200k files on 2 CPUs), so this case runs at most RESTORE_ALL_ITERATIONS times.
        iterations = min(self.iterations, RESTORE_ALL_ITERATIONS)
        for method in methods:
            reset_tree(self.tree)
            originals = {p: Path(self.tree.path, p).read_bytes() for p in changed + deleted}
            ref = (await method.capture(self.tree)).ref
            assert ref is not None
            for it in range(iterations):
                edit(self.tree.path, changed, f"restore-all {it}")
                for rel in deleted:
                    Path(self.tree.path, rel).unlink(missing_ok=True)
                for rel in created:
                    target = Path(self.tree.path, rel)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(f"new file {it}\n")
                await self._timed(method, collected[method.name],
                                  lambda m=method, r=ref: m.restore(self.tree, r, None))
                wrong = 0
                for rel, data in originals.items():
                    full = Path(self.tree.path, rel)
                    wrong += (not full.exists()) or full.read_bytes() != data
                wrong += sum(Path(self.tree.path, rel).exists() for rel in created)
                collected[method.name].wrong += wrong
            if collected[method.name].wrong:
                notes.append(
                    f"{method.name}: {collected[method.name].wrong} path(s) not as in the checkpoint "
                    f"after restore over {iterations} iteration(s)"
                )
        reset_tree(self.tree)
        result = self._result(case, collected, "blocks", notes)
        result["iterations"] = iterations
        return result

    # --- diff case -----------------------------------------------------------------

    async def diff_10(self, case: Case) -> dict[str, Any]:
        methods = [m for m in self.methods if m.can_diff]
        reset_tree(self.tree)
        paths = pick(self.tracked, 10, salt=7)
        before = {m.name: (await m.capture(self.tree)).ref for m in methods}
        edit(self.tree.path, paths, "turn")
        after = {m.name: (await m.capture(self.tree)).ref for m in methods}
        collected = {m.name: Collected() for m in methods}
        for it in range(self.iterations):
            for method in self._order(methods, it):
                old, new = before[method.name], after[method.name]
                assert old is not None and new is not None
                sample = await self._timed(method, collected[method.name],
                                           lambda m=method, a=old, b=new: m.diff(self.tree, a, b))
                collected[method.name].wrong += sample.files != len(paths)
        reset_tree(self.tree)
        return self._result(case, collected, "interleaved", [])

    # --- the standard set ------------------------------------------------------------

    async def run_case(self, case: Case) -> dict[str, Any]:
        root = self.tree.path
        if case.name == "clean":
            return await self.capture_case(case)
        if case.name.startswith("changed-"):
            k = int(case.name.split("-")[1])
            paths = pick(self.tracked, k, salt=1)
            return await self.capture_case(case, mutate=lambda it: edit(root, paths, f"{case.name} {it}"))
        if case.name == "big-100MiB":

            def setup() -> None:
                write_big(root)
                git(root, "update-index", "--add", "--", BIG_FILE)
                refresh_index(root)

            def teardown() -> None:
                git(root, "rm", "-q", "-f", "--cached", "--", BIG_FILE)
                Path(root, BIG_FILE).unlink()

            return await self.capture_case(case, setup=setup, mutate=lambda it: touch_big(root, it),
                                           teardown=teardown)
        if case.name == "checkout":

            def switch(it: int) -> dict[str, Any]:
                branch = OTHER_BRANCH if it % 2 == 0 else MAIN_BRANCH
                git(root, "checkout", "-q", branch)
                return {"branch": branch}

            result = await self.capture_case(case, mutate=switch,
                                             teardown=lambda: git(root, "checkout", "-q", MAIN_BRANCH))
            result["changes_per_switch"] = {k: v for k, v in self.tree.extra.items() if k.startswith("branch_")}
            return result
        if case.name == "restore-10":
            return await self.restore_10(case)
        if case.name == "restore-all":
            return await self.restore_all(case)
        if case.name == "diff-10":
            return await self.diff_10(case)
        raise ValueError(f"no case {case.name} for a synthetic tree")

    async def release_turns(self, case: Case, releases: Sequence[Path]) -> dict[str, Any]:
        versions = [r.name for r in releases]

        def turn(it: int) -> dict[str, Any]:
            target = releases[(it + 1) % len(releases)]
            counts = apply_release(self.tree.path, target)
            return {"to": target.name, **counts}

        result = await self.capture_case(case, mutate=turn)
        result["versions"] = versions
        return result


async def finish_tree(tree: Tree, methods: Sequence[Method]) -> None:
    """Drop what the methods kept for this tree (shadow indexes, refs, benchmark sessions)."""
    for method in methods:
        await method.forget(tree)
        drop = getattr(method, "drop_session", None)
        if drop is not None:
            await drop(tree)
