"""Differential fuzz of content conversion against git: attributes, settings, contents and index states.

Each example (tests/conversion_cases.py) is a random repository whose index
holds blobs with and without CR under rules that convert, played through random
operations with captures in between, each compared with ``git add -A`` +
``write-tree`` on a copy of the user's index. SHA-1 repositories run on the
libgit2 back-end, SHA-256 ones on the git-command back-end, each watched (warm
and ``exact`` captures) and unwatched (cold). The longer run is ``python -m
bench.conversion_fuzz``; what either found is kept in tests/test_conversion.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from conversion_cases import Example, examples, line_ending_examples, run_example
from hypothesis import HealthCheck, given, settings, strategies as st

RUNS = [("sha1", True), ("sha1", False), ("sha256", True), ("sha256", False)]


@pytest.mark.parametrize(("object_format", "watched"), RUNS, ids=["sha1-warm", "sha1-cold", "sha256-warm", "sha256-cold"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
async def test_conversion_matches_git(tmp_path: Path, object_format: str, watched: bool, data: st.DataObject) -> None:
    example: Example = data.draw(examples(object_format))
    differences = await run_example(tmp_path, example, watched=watched)
    assert not differences, differences[0]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
async def test_line_endings_converted_on_the_warm_path_match_git(tmp_path: Path, data: st.DataObject) -> None:
    example: Example = data.draw(line_ending_examples("sha1"))
    differences = await run_example(tmp_path, example, watched=True)
    assert not differences, differences[0]


class Clock:
    """A stand-in for the longer run's clock: past any deadline once ``late`` is set."""

    def __init__(self) -> None:
        self.late = False

    def monotonic(self) -> float:
        return 1e9 if self.late else 0.0


def longer_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, play: Any) -> str:
    """bench.conversion_fuzz's run of 50 examples with ``play`` for run_example; the difference it reports."""
    from bench import conversion_fuzz

    clock = Clock()
    monkeypatch.setattr(conversion_fuzz, "time", clock)
    args = argparse.Namespace(examples=50, seconds=1.0, seed=1, min_ops=1, max_ops=3)

    async def played(scratch: Path, example: Example, *, watched: bool) -> list[str]:
        clock.late = True  # the run's time is up after its first example
        return play(example)

    return conversion_fuzz._run(tmp_path, "sha1", True, args, examples, played)


def test_the_longer_run_stops_at_its_deadline_without_calling_itself_flaky(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # It returned before drawing once past the deadline: hypothesis, replaying an
    # example it drew before, raised FlakyStrategyDefinition and the run died.
    assert longer_run(monkeypatch, tmp_path, lambda example: []) == ""


def test_a_difference_found_near_the_deadline_is_shrunk_and_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Shrinking runs past the deadline: an example passed over there would not fail
    # when replayed, and the difference would be lost to a flaky error.
    found = longer_run(monkeypatch, tmp_path, lambda example: ["a difference"] if example.ops else [])
    assert found == "a difference"
