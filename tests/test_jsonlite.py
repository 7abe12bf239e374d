"""The hook's JSON (snapshotd.jsonlite) reads and writes exactly as the json module does."""

from __future__ import annotations

import json

import pytest

from snapshotd.jsonlite import dumps, loads

TEXTS = ['{"a": [1, 2.5, "x\\u00e9", null, true, false]}', '  {"a":1}\n', '"s"', "1e400", '{"a":"\\ud800"}', "[]", "-0", '{"a":{"b":[{}]}}']
BAD = ["[1,2", "nope", '{"a":1} x', "", "\ufeff{}", "{'a': 1}"]


@pytest.mark.parametrize("text", TEXTS)
def test_loads_reads_what_json_reads(text: str) -> None:
    assert loads(text) == json.loads(text)


@pytest.mark.parametrize("text", BAD)
def test_loads_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(ValueError):
        loads(text)


@pytest.mark.parametrize(
    "value",
    [{"path": "/a b/\u00e9\ud800", "session": None, "label": 'x\n"y"', "n": [1, 2.5, True, False, -3, 1e300], "d": {}}, [], "x", 10**20, {1: 2}],
)
def test_dumps_writes_what_json_writes(value: object) -> None:
    assert dumps(value) == json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def test_dumps_refuses_what_json_refuses() -> None:
    for value in (float("nan"), object()):
        with pytest.raises((ValueError, TypeError)):
            dumps(value)
