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

from pathlib import Path

import pytest
from conversion_cases import Example, examples, run_example
from hypothesis import HealthCheck, given, settings, strategies as st

RUNS = [("sha1", True), ("sha1", False), ("sha256", True), ("sha256", False)]


@pytest.mark.parametrize(("object_format", "watched"), RUNS, ids=["sha1-warm", "sha1-cold", "sha256-warm", "sha256-cold"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
async def test_conversion_matches_git(tmp_path: Path, object_format: str, watched: bool, data: st.DataObject) -> None:
    example: Example = data.draw(examples(object_format))
    differences = await run_example(tmp_path, example, watched=watched)
    assert not differences, differences[0]
