"""A fleet's start: every worktree's first checkpoints at once, on a daemon just started.

```sh
.venv/bin/python -m bench.fleet_start [--old CHECKOUT] [--worktrees 25] [--files 100000] [--per-worktree 10] [--rounds 2]
```

The trees are the scale bench's linked worktrees (``bench/work/linked-<N>x<k>``,
built by it if missing). Each round starts a daemon (each checkout's in turn,
the order alternating), sends ``per-worktree`` checkpoints for every worktree at
once, one connection each, then one more checkpoint per worktree after a
one-file edit. It prints when the answers came (median, p90, the last), the
full scans the daemon ran, and whether the second checkpoints were warm.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import trio

from snapshotd.client.rpc import AsyncClient

from .cases import edit, pick
from .ours import running_daemon
from .scale import clear_sessions
from .trees import linked_worktrees


async def _first(socket: str, path: str, session: str, began: float, answers: list[float]) -> None:
    async with AsyncClient.connect(socket, connect_timeout=120) as client:
        await client.call("checkpoint", path=path, session=session, label="first")
    answers.append(time.monotonic() - began)


async def one_round(trees: list[Any], per_worktree: int, checkout: str | None) -> dict[str, Any]:
    answers: list[float] = []
    async with running_daemon("fleet-start", checkout=checkout) as daemon:
        began = time.monotonic()
        async with trio.open_nursery() as nursery:
            for index in range(per_worktree * len(trees)):
                tree = trees[index % len(trees)]
                nursery.start_soon(_first, daemon.socket_path, str(tree.path), f"s{index:04}", began, answers)
        scans = []
        for tree in trees:
            edit(tree.path, pick(tree.tracked(), 1, salt=7), "fleet start")
            result = await daemon.call("checkpoint", {"path": str(tree.path), "session": "second"})
            scans.append(result["stats"]["scan"])
        counters = (await daemon.call("status"))["counters"]
    clear_sessions(trees)
    ordered = sorted(answers)
    return {
        "median_s": round(statistics.median(ordered), 2),
        "p90_s": round(ordered[int(len(ordered) * 0.9) - 1], 2),
        "last_s": round(ordered[-1], 2),
        "full_scans": counters.get("captures.full", 0),
        "second_warm": scans.count("watch"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", help="another checkout, run in the same rounds")
    parser.add_argument("--worktrees", type=int, default=25)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--per-worktree", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    trees = linked_worktrees(args.worktrees, args.files)
    checkouts: list[str | None] = [None] + ([args.old] if args.old else [])
    for round_ in range(args.rounds):
        order = checkouts if round_ % 2 == 0 else checkouts[::-1]
        for checkout in order:
            figures = trio.run(one_round, trees, args.per_worktree, checkout)
            print(f"round {round_ + 1} {checkout or 'this'}: " + ", ".join(f"{k} {v}" for k, v in figures.items()),
                  flush=True)


if __name__ == "__main__":
    main()
