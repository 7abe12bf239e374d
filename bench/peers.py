"""The peer methods, as plain git commands, each process counted by construction.

They follow what the peers' public code does (docs field-notes.md), reduced to
the git commands that cost time; none of them touches the user's index, HEAD
or branches (every one works on its own ``GIT_INDEX_FILE``), and all run with
``GIT_OPTIONAL_LOCKS=0`` and ``gc.auto=0`` like the rest of the benchmark.

* ``git status``: the baseline a cold capture is held against (one process).
* naive shadow capture: ``git add -A`` into a fresh, empty index, then
  ``git write-tree``. Git has no stat data to trust, so it hashes every file.
* OpenCode-style: a shadow index of its own, seeded once by copying the
  user's index (stat data included); each capture runs a tagged ``ls-files``
  for changed, deleted and untracked paths, ``update-index`` for them (only
  when there are any) and ``write-tree``. Restore: per-file
  ``git checkout <tree> -- <file>`` for a few files, ``read-tree`` +
  ``checkout-index -a -f`` for the whole tree. Diff: ``--numstat`` and a
  ``git show`` of each side of each file.
* T3-style: a temporary index in the common dir, ``read-tree HEAD``,
  ``add -A``, ``write-tree``, ``commit-tree``, ``update-ref`` under
  ``refs/t3/``. T3 itself runs 7 processes a step (field notes); these are
  the 5 that do the work. ``read-tree HEAD`` leaves no stat data, so
  ``add -A`` re-reads every file. Restore: ``git restore --source=<commit>
  --worktree`` and ``git clean -fd`` (T3 also runs ``restore --staged`` and
  ``reset``, which rewrite the user's index; left out so that no method
  changes what the next one measures, so its figure is a lower bound).
  Diff: one ``git diff --patch``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .common import GIT_CONFIG, git, git_env
from .methods import Method, Sample, ms_since
from .trees import Tree


class GitCounter:
    """Runs git commands for one call of a method and counts them."""

    def __init__(self, cwd: str, index: str | None = None) -> None:
        self.cwd = cwd
        self.index = index
        self.processes = 0

    def __call__(self, *args: str, input: bytes | None = None, ok: Sequence[int] = (0,)) -> bytes:
        extra = {"GIT_INDEX_FILE": self.index} if self.index else None
        self.processes += 1
        proc = subprocess.run(
            ["git", *GIT_CONFIG, *args],
            cwd=self.cwd,
            env=git_env(extra),
            input=input,
            capture_output=True,
            check=False,
        )
        if proc.returncode not in ok:
            raise RuntimeError(
                f"git {args[0]} exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()}"
            )
        return proc.stdout


def _git_dirs(tree: Tree) -> tuple[str, str]:
    """(per-worktree git dir, common dir) of a tree."""
    out = git(tree.path, "rev-parse", "--absolute-git-dir", "--git-common-dir").decode().split("\n")
    git_dir = out[0].strip()
    common = out[1].strip()
    if not os.path.isabs(common):
        common = os.path.normpath(os.path.join(tree.path, common))
    return git_dir, common


def _parse_tagged(listing: bytes) -> list[str]:
    """Paths named by a tagged ``ls-files -t -m -d -o`` listing (each once)."""
    seen: dict[str, None] = {}
    for record in listing.split(b"\0"):
        if len(record) > 2:
            seen.setdefault(os.fsdecode(record[2:]), None)
    return list(seen)


class GitStatus(Method):
    name = "git status"
    family = "baseline"
    description = "`git status --porcelain -z` (1 process): the yardstick for a cold capture"

    async def capture(self, tree: Tree) -> Sample:
        run = GitCounter(tree.path)
        start = time.perf_counter()
        run("status", "--porcelain", "-z")
        return Sample(ms=ms_since(start), processes=run.processes)


class NaiveShadow(Method):
    name = "naive"
    description = "`git add -A` into a fresh empty index + `git write-tree` (2 processes)"

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch

    async def capture(self, tree: Tree) -> Sample:
        index = self.scratch / "naive.index"
        index.unlink(missing_ok=True)
        run = GitCounter(tree.path, str(index))
        start = time.perf_counter()
        run("add", "-A")
        tree_id = run("write-tree").decode().strip()
        ms = ms_since(start)
        index.unlink(missing_ok=True)
        return Sample(ms=ms, processes=run.processes, tree=tree_id, ref=tree_id)


class OpenCodeStyle(Method):
    name = "opencode-style"
    description = (
        "own shadow index (seeded once from a copy of the user's index); tagged `ls-files`, "
        "`update-index` (if anything changed), `write-tree`, each a process"
    )
    can_restore = True
    can_diff = True

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._index: dict[str, Path] = {}

    def _shadow(self, tree: Tree) -> Path:
        index = self._index.get(tree.path)
        if index is None:
            git_dir, _ = _git_dirs(tree)
            index = Path(tempfile.mkdtemp(prefix="opencode-", dir=self.scratch)) / "index"
            user_index = Path(git_dir, "index")
            if user_index.exists():
                shutil.copy2(user_index, index)  # keeps the mtime: git's racy check needs it
            self._index[tree.path] = index
        return index

    async def capture(self, tree: Tree) -> Sample:
        index = self._shadow(tree)
        run = GitCounter(tree.path, str(index))
        start = time.perf_counter()
        listing = run("ls-files", "-z", "-t", "-m", "-d", "-o", "--exclude-standard")
        paths = _parse_tagged(listing)
        if paths:
            run(
                "update-index", "-z", "--add", "--remove", "--stdin",
                input=b"".join(os.fsencode(p) + b"\0" for p in paths),
            )
        tree_id = run("write-tree").decode().strip()
        return Sample(ms=ms_since(start), processes=run.processes, tree=tree_id, ref=tree_id,
                      extra={"paths": len(paths)})

    async def restore(self, tree: Tree, ref: str, paths: Sequence[str] | None) -> Sample:
        index = self._shadow(tree)
        run = GitCounter(tree.path, str(index))
        start = time.perf_counter()
        if paths is None:
            run("read-tree", ref)
            run("checkout-index", "-a", "-f")
        else:
            for path in paths:
                run("checkout", ref, "--", path)
        return Sample(ms=ms_since(start), processes=run.processes)

    async def diff(self, tree: Tree, old: str, new: str) -> Sample:
        run = GitCounter(tree.path)
        start = time.perf_counter()
        numstat = run("diff", "--no-ext-diff", "--no-renames", "--numstat", "-z", old, new)
        files = [os.fsdecode(r.split(b"\t", 2)[2]) for r in numstat.split(b"\0") if r.count(b"\t") >= 2]
        for path in files:
            run("show", f"{old}:{path}", ok=(0, 128))
            run("show", f"{new}:{path}", ok=(0, 128))
        return Sample(ms=ms_since(start), processes=run.processes, files=len(files))

    async def forget(self, tree: Tree) -> None:
        index = self._index.pop(tree.path, None)
        if index is not None:
            shutil.rmtree(index.parent, ignore_errors=True)


class T3Style(Method):
    name = "t3-style"
    description = (
        "temp index in the common dir: `read-tree HEAD`, `add -A`, `write-tree`, "
        "`commit-tree`, `update-ref` (5 processes)"
    )
    can_restore = True
    can_diff = True

    def __init__(self) -> None:
        self._turn = 0
        self._refs: dict[str, list[str]] = {}

    async def capture(self, tree: Tree) -> Sample:
        _, common = _git_dirs(tree)
        index = os.path.join(common, f"t3-bench-index-{os.getpid()}-{self._turn}")
        run = GitCounter(tree.path, index)
        self._turn += 1
        ref = f"refs/t3/checkpoints/bench/turn/{self._turn}"
        start = time.perf_counter()
        try:
            run("read-tree", "HEAD")
            run("add", "-A")
            tree_id = run("write-tree").decode().strip()
            commit = run("commit-tree", tree_id, "-m", f"checkpoint turn {self._turn}").decode().strip()
            run("update-ref", ref, commit)
        finally:
            ms = ms_since(start)
            for leftover in (index, index + ".lock"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
        self._refs.setdefault(tree.path, []).append(ref)
        return Sample(ms=ms, processes=run.processes, tree=tree_id, ref=commit)

    async def restore(self, tree: Tree, ref: str, paths: Sequence[str] | None) -> Sample:
        run = GitCounter(tree.path)
        spec = list(paths) if paths is not None else ["."]
        start = time.perf_counter()
        run("restore", f"--source={ref}", "--worktree", "--", *spec)
        run("clean", "-fdq", "--", *spec)
        return Sample(ms=ms_since(start), processes=run.processes)

    async def diff(self, tree: Tree, old: str, new: str) -> Sample:
        run = GitCounter(tree.path)
        start = time.perf_counter()
        patch = run("diff", "--no-ext-diff", "--no-color", "--patch", old, new)
        files = patch.count(b"\ndiff --git ") + patch.startswith(b"diff --git ")
        return Sample(ms=ms_since(start), processes=run.processes, files=files)

    async def forget(self, tree: Tree) -> None:
        refs = self._refs.pop(tree.path, [])
        if refs:
            git(tree.path, "update-ref", "--stdin", input="".join(f"delete {r}\n" for r in refs).encode())
