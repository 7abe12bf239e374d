"""The wire param validators of contract/params.py, called directly: paths, text and integer bounds."""

from __future__ import annotations

import os

import pytest

from snapshotd.contract.params import (
    INT_PARAM_MAX,
    PATH_MAX,
    check_text,
    optional_int,
    optional_path,
    optional_path_list,
)
from snapshotd.errors import InvalidParams


def test_a_path_one_byte_under_path_max_is_taken_and_path_max_is_refused() -> None:
    longest = "/" + "a" * (PATH_MAX - 2)
    assert optional_path({"path": longest}, "path") == longest
    with pytest.raises(InvalidParams) as refused:
        optional_path({"path": longest + "a"}, "path")
    assert refused.value.message == (
        f"The parameter 'path' is a path of {PATH_MAX} bytes, over the system's limit of {PATH_MAX - 1}."
    )
    assert refused.value.data == {"param": "path"}


def test_path_max_counts_bytes_not_characters() -> None:
    wide = "é" * (PATH_MAX // 2)  # two bytes each in UTF-8
    with pytest.raises(InvalidParams, match="over the system's limit"):
        optional_path({"path": wide}, "path")


def test_every_item_of_a_path_list_is_checked() -> None:
    assert optional_path_list({"paths": ["a", "b/c"]}, "paths") == ["a", "b/c"]
    assert optional_path_list({}, "paths") is None
    with pytest.raises(InvalidParams, match="'paths' is a path of"):
        optional_path_list({"paths": ["a", "x" * PATH_MAX]}, "paths")
    with pytest.raises(InvalidParams, match="NUL"):
        optional_path_list({"paths": ["a", "b\0"]}, "paths")


def test_integers_stop_at_int_param_max_unless_the_validator_allows_less() -> None:
    assert optional_int({"n": INT_PARAM_MAX}, "n") == 2**31 - 1
    with pytest.raises(InvalidParams, match=f"at most {INT_PARAM_MAX}, not {INT_PARAM_MAX + 1}"):
        optional_int({"n": INT_PARAM_MAX + 1}, "n")
    with pytest.raises(InvalidParams, match="at most 10, not 11"):
        optional_int({"n": 11}, "n", max=10)
    assert optional_int({"n": 3.0}, "n") == 3


def test_file_name_escapes_pass_and_other_lone_surrogates_do_not() -> None:
    undecodable = os.fsdecode(b"caf\xe9")
    assert check_text("path", undecodable) == undecodable
    with pytest.raises(InvalidParams) as refused:
        check_text("label", "a\ud800b")
    assert "U+D800" in refused.value.message and refused.value.data == {"param": "label"}
