"""What a warm capture's own steps cost in CPU, two checkouts side by side, as ratios.

Usage: ``python -m bench.tree_edit OLD_CHECKOUT [NEW_CHECKOUT] [--rounds 6] [--edits 600] [--files 2000]
[--work DIR]``

Each round runs, in a fresh interpreter importing each checkout's ``snapshotd``
(the checkouts alternating first), on one synthetic repository of ``--files``
files (built in ``--work``):

- ``edit_tree``: ``--edits`` one-file edits, each of the tree the last one
  wrote, the files taken in turn from 40 tracked ones (what warm captures after
  an agent's edits do, the trees written as loose objects, new in every round);
- ``locate``: finding the worktree of a linked worktree's path, 3,000 times
  (every request naming a path does it).

The figure is the interpreter's CPU (user and system, ``time.process_time``)
per operation; the report gives the medians and new ÷ old.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import REPO_ROOT, git, two_checkouts_parser

sys.path.insert(0, str(REPO_ROOT / "fixtures" / "repos"))
from make_synthetic import make_synthetic

LOCATES = 3000
HOT_FILES = 40

_WORKLOAD = r"""
import json, os, sys, time
import pygit2
from snapshotd.capture.treeedit import edit_tree
from snapshotd.store.identity import locate

repo_path, linked, edits, locates, hot = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
repo = pygit2.Repository(repo_path)
tree = str(repo.head.peel(pygit2.Tree).id)
nonce = os.urandom(8).hex().encode()  # new trees each round: none found written by an earlier one
blobs = [repo.create_blob(b"edit %d %s\n" % (index, nonce)) for index in range(edits)]
out = {}
started = time.process_time()
for index in range(edits):
    tree, _ = edit_tree(repo, tree, {hot[index % len(hot)]: (blobs[index], 0o100644)})
out["edit_tree"] = (time.process_time() - started) / edits
started = time.process_time()
for _ in range(locates):
    locate(linked)
out["locate"] = (time.process_time() - started) / locates
print(json.dumps(out))
"""


def one_round(checkout: Path, repo: Path, linked: Path, edits: int, hot: list[str]) -> dict[str, float]:
    """CPU seconds per operation of each kind, in an interpreter running ``checkout``'s snapshotd."""
    python = checkout / ".venv" / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([str(python), "-c", _WORKLOAD, str(repo), str(linked), str(edits), str(LOCATES), *hot],
                          env=env, cwd=checkout, check=True, capture_output=True, text=True)
    return {name: float(value) for name, value in json.loads(done.stdout).items()}


def main() -> None:
    parser = two_checkouts_parser(__doc__)
    parser.add_argument("--edits", type=int, default=600)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tree-edit-", dir=args.work))
    try:
        repo = work / "repo"
        make_synthetic(repo, args.files, commit=True)
        git(repo, "worktree", "add", "-q", "--detach", str(work / "linked"))
        folders: dict[str, str] = {}
        for name in os.fsdecode(git(repo, "ls-files", "-z")).split("\0"):
            if name and len(folders) < HOT_FILES:
                folders.setdefault(os.path.dirname(name), name)
        hot = list(folders.values())
        checkouts = [args.old.resolve(), args.new.resolve()]
        results: dict[Path, dict[str, list[float]]] = {checkout: {} for checkout in checkouts}
        for index in range(args.rounds):
            for checkout in checkouts if index % 2 == 0 else checkouts[::-1]:
                for name, value in one_round(checkout, repo, work / "linked", args.edits, hot).items():
                    results[checkout].setdefault(name, []).append(value)
        old, new = checkouts
        print(f"CPU per operation (µs), medians of {args.rounds} rounds; old {old}, new {new}")
        for name in results[old]:
            before = statistics.median(results[old][name]) * 1e6
            after = statistics.median(results[new][name]) * 1e6
            print(f"  {name:10} old {before:7.1f}  new {after:7.1f}  new/old {after / before:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
