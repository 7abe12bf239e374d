"""The longer run of the content-conversion differential fuzz (tests/test_conversion_fuzz.py).

``python -m bench.conversion_fuzz --examples N [--seconds S] [--seed K]`` plays
N random examples (tests/conversion_cases.py) on each of the four runs (SHA-1 on
libgit2, SHA-256 on the git command back-end, each watched: warm and ``exact``
captures, and unwatched: cold), and a fifth of rules of line endings alone with only
the worktree changing between warm captures (their files with a CR byte converted
in-process), stopping a run early after S seconds, and prints each
difference from git, shrunk, with the example that gives it. Exits 1 on any.
The environment is isolated as the test suite's is (a private HOME, no system
config). Keep shrunk failures as named tests in tests/test_conversion.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

import trio  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings, strategies as st  # noqa: E402

RUNS = [("sha1", True), ("sha1", False), ("sha256", True), ("sha256", False)]


def _isolate(home: Path) -> None:
    """The test suite's git environment: a private home and no system configuration."""
    (home / "run").mkdir(parents=True, mode=0o700)
    (home / ".gitconfig").write_text("[init]\n\tdefaultBranch = main\n")
    os.environ.update(
        HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_RUNTIME_DIR=str(home / "run"),
        SNAPSHOTD_HOME=str(home / "snapshotd-home"), GIT_CONFIG_NOSYSTEM="1", LC_ALL="C",
        GIT_AUTHOR_NAME="Fuzz", GIT_AUTHOR_EMAIL="fuzz@example.invalid",
        GIT_COMMITTER_NAME="Fuzz", GIT_COMMITTER_EMAIL="fuzz@example.invalid",
    )
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG_GLOBAL", "SNAPSHOTD_SOCKET"):
        os.environ.pop(name, None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100, help="examples per run")
    parser.add_argument("--seconds", type=float, default=120.0, help="at most this long per run")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--min-ops", type=int, default=6, help="operations per example, at least")
    parser.add_argument("--max-ops", type=int, default=20, help="operations per example, at most")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="convfuzz-"))
    _isolate(scratch / "home")
    from conversion_cases import examples, line_ending_examples, run_example

    failures: list[str] = []
    for object_format, watched in RUNS:
        failure = _run(scratch, object_format, watched, args, examples, run_example)
        if failure:
            failures.append(failure)
    failure = _run(scratch, "sha1", True, args, line_ending_examples, run_example, "sha1 line endings (warm, in-process)")
    return 1 if failures or failure else 0


def _run(
    scratch: Path, object_format: str, watched: bool, args: argparse.Namespace, examples, run_example, name: str = ""
) -> str:
    """One run of examples; the shrunk difference it found, or "" for none."""
    played = 0
    found = False
    deadline = time.monotonic() + args.seconds

    @settings(max_examples=args.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate, Phase.shrink])
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        nonlocal played, found
        # Draw before looking at the clock: hypothesis calls a test that draws less
        # from the data it drew more from before flaky. Past the deadline an example
        # is drawn and passed over, unless a difference was found: then its shrinking
        # runs on to the end, or the shrunk example would not fail when replayed.
        example = data.draw(examples(object_format, args.max_ops, args.min_ops))
        if time.monotonic() > deadline and not found:
            return
        played += 1
        differences = trio.run(partial(run_example, watched=watched), scratch, example)
        found = found or bool(differences)
        assert not differences, differences[0]

    test = seed(args.seed)(one) if args.seed is not None else one
    started = time.monotonic()
    failure = ""
    try:
        test()
        outcome = "0 differences"
    except AssertionError as exc:
        failure = str(exc)
        outcome = f"DIFFERENCE\n{exc}"
    name = name or f"{object_format} {'watched (warm, exact)' if watched else 'unwatched (cold)'}"
    print(f"{name}: {played} examples in {time.monotonic() - started:.0f} s: {outcome}", flush=True)
    return failure


if __name__ == "__main__":
    sys.exit(main())
