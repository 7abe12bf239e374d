"""What resolving a checkpoint reference costs, against the length of the session's history.

One worktree, one session of N checkpoints (and a few other sessions), for
each N: the median time of ``reads.find_checkpoint`` for ``@``, ``@~10``,
``#N`` (the newest by seq), ``#1`` (the oldest: the walk down a session),
``#N`` with no session named (every session's head, then its walk), a full
id and a 12-digit prefix. ``@`` and an id should not grow with N; ``#1``
does, by the pins between the newest and the first.

    .venv/bin/python bench/refs.py [--sizes 100,1000,5000] [--repeat 50]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from snapshotd.contract.refs import ref_param
from snapshotd.engine import reads
from snapshotd.git.repository import repository
from snapshotd.store.checkpoints import Store
from snapshotd.store.identity import Records, WorktreeInfo, identify, locate

OTHER_SESSIONS = 5


def _worktree(folder: Path, size: int) -> tuple[WorktreeInfo, list[str]]:
    """A repository whose session ``s`` holds ``size`` checkpoints (the same tree: nothing to sync)."""
    repo = folder / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    info = identify(locate(str(repo)), Records(folder / "home"))
    tree = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD^{tree}"], check=True, capture_output=True, text=True
    ).stdout.strip()
    ids = []
    with repository(info.store_dir) as store_repo:
        store = Store(store_repo)
        for index in range(OTHER_SESSIONS):
            store.record(worktree_id=info.id, session=f"other-{index}", label=None, tree=tree, base=None)
        for _ in range(size):
            ids.append(store.record(worktree_id=info.id, session="s", label=None, tree=tree, base=None).id)
    return info, ids


def _median_ms(info: WorktreeInfo, params: dict[str, object], repeat: int) -> float:
    ref = ref_param(params)
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        reads.find_checkpoint(ref, [info.store_dir], info)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    sizes = [int(each) for each in args.sizes.split(",")]
    rows = []
    for size in sizes:
        with tempfile.TemporaryDirectory() as folder:
            info, ids = _worktree(Path(folder), size)
            cases = {
                "@": {"checkpoint": "@", "session": "s"},
                "@~10": {"checkpoint": "@~10", "session": "s"},
                f"#{size} (newest)": {"checkpoint": f"#{size}", "session": "s"},
                "#1 (oldest)": {"checkpoint": "#1", "session": "s"},
                "#N, no session": {"checkpoint": f"#{size}"},
                "full id": {"checkpoint": ids[size // 2]},
                "12-digit prefix": {"checkpoint": ids[size // 2][:12]},
            }
            rows.append((size, {name: _median_ms(info, params, args.repeat) for name, params in cases.items()}))
    names = [name.replace(str(sizes[0]), "N") for name in rows[0][1]]
    print("| reference | " + " | ".join(f"N = {size}" for size, _ in rows) + " |")
    print("| --- |" + " --- |" * len(rows))
    for column, name in enumerate(names):
        cells = [f"{list(timings.values())[column]:.2f} ms" for _, timings in rows]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
