"""Worktree-relative paths: normalization, escapes refused, selection by prefixes."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from snapshotd.errors import InvalidParams, PathOutsideWorktree
from snapshotd.paths import could_match_under, path_matches, to_worktree_relative

ROOT = "/home/user/project"


@pytest.mark.parametrize(
    ("user_path", "expected"),
    [
        ("src/a.py", "src/a.py"),
        ("./src//a.py", "src/a.py"),
        ("src/", "src"),
        (".", ""),
        ("./", ""),
        ("src/../lib/b.py", "lib/b.py"),
        ("a b/ü.txt", "a b/ü.txt"),
        ("-leading", "-leading"),
        ("new\nline", "new\nline"),
        (".gitignore", ".gitignore"),
        ("sub/.github/x", "sub/.github/x"),
        (ROOT, ""),
        (ROOT + "/", ""),
        (ROOT + "/src/a.py", "src/a.py"),
        (ROOT + "/src/../src/./a.py", "src/a.py"),
        ("//home/user/project/x", "x"),
    ],
)
def test_accepts_paths_inside(user_path: str, expected: str) -> None:
    assert to_worktree_relative(ROOT, user_path) == expected


@pytest.mark.parametrize(
    "user_path",
    [
        "..",
        "../x",
        "src/../../x",
        "./..",
        "/home/user/other/x",
        "/home/user/project-2/x",
        "/home/user",
        "/",
        ROOT + "/../project-2",
    ],
)
def test_refuses_escapes(user_path: str) -> None:
    with pytest.raises(PathOutsideWorktree) as info:
        to_worktree_relative(ROOT, user_path)
    message = info.value.message
    assert repr(user_path) in message and ROOT in message
    assert message.count(".") >= 1 and "\n" not in message.rstrip(".")
    assert info.value.kind == "path_outside_worktree"


@pytest.mark.parametrize(
    "user_path",
    [".git", ".git/config", "sub/.git/HEAD", ".GIT/hooks", ROOT + "/.git", "a/../.git"],
)
def test_refuses_paths_inside_git_folders(user_path: str) -> None:
    with pytest.raises(PathOutsideWorktree):
        to_worktree_relative(ROOT, user_path)


@pytest.mark.parametrize("user_path", ["", "a\0b", ROOT + "/\0"])
def test_invalid_params(user_path: str) -> None:
    with pytest.raises(InvalidParams):
        to_worktree_relative(ROOT, user_path)


def test_non_string_is_invalid() -> None:
    with pytest.raises(InvalidParams):
        to_worktree_relative(ROOT, None)  # type: ignore[arg-type]


def test_symlinks_are_not_resolved(tmp_path: Path) -> None:
    root = tmp_path / "wt"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    # Lexically inside: accepted as a tree path, whatever the link points at.
    assert to_worktree_relative(str(root), "link/file") == "link/file"
    # The outside folder named directly is refused even though a link reaches it.
    with pytest.raises(PathOutsideWorktree):
        to_worktree_relative(str(root), str(outside / "file"))
    # ".." after a symlink is taken lexically, never through the link's target.
    assert to_worktree_relative(str(root), "link/../x") == "x"


def test_root_reached_through_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(real)
    # The root as given, or its real path: both name the same folder.
    assert to_worktree_relative(str(alias), str(real / "a" / "b")) == "a/b"
    assert to_worktree_relative(str(alias), str(alias / "a")) == "a"
    # The client's own path is never resolved: through the alias it is outside ``real``.
    with pytest.raises(PathOutsideWorktree):
        to_worktree_relative(str(real), str(alias / "a" / "b"))
    with pytest.raises(PathOutsideWorktree):
        to_worktree_relative(str(alias), str(tmp_path / "elsewhere"))


def test_relative_root_is_taken_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert to_worktree_relative("wt", str(tmp_path / "wt" / "x")) == "x"


_PART = st.sampled_from(["a", "b", "..", ".", "", ".git", "c d", "ü", "-x", "..."])


@settings(max_examples=300, deadline=None)
@given(st.lists(_PART, min_size=1, max_size=6), st.booleans())
def test_result_never_escapes(parts: list[str], absolute: bool) -> None:
    user_path = "/".join(parts)
    if absolute:
        user_path = ROOT + "/" + user_path
    try:
        rel = to_worktree_relative(ROOT, user_path)
    except (PathOutsideWorktree, InvalidParams):
        lexical = posixpath.normpath(posixpath.join(ROOT, user_path)) if user_path else ROOT
        inside = lexical == ROOT or lexical.startswith(ROOT + "/")
        in_git = any(p.lower() == ".git" for p in lexical[len(ROOT) :].split("/"))
        assert not user_path or not inside or in_git
        return
    assert not rel.startswith("/")
    components = rel.split("/") if rel else []
    assert all(c not in ("", ".", "..") and c.lower() != ".git" for c in components)
    assert posixpath.normpath(posixpath.join(ROOT, user_path)) == (
        posixpath.join(ROOT, rel) if rel else ROOT
    )


@pytest.mark.parametrize(
    ("path", "prefixes", "expected"),
    [
        ("src/a.py", ["src"], True),
        ("src/a.py", ["src/"], True),
        ("src/a.py", ["src/a.py"], True),
        ("src/a.py", ["sr"], False),
        ("src2/a.py", ["src"], False),
        ("src", ["src/a.py"], False),
        ("src/a.py", [""], True),
        ("anything/at/all", ["x", ""], True),
        ("src/a.py", [], False),
        ("a b/ü.txt", ["a b"], True),
        ("docs/x", ["src", "docs"], True),
    ],
)
def test_path_matches(path: str, prefixes: list[str], expected: bool) -> None:
    assert path_matches(path, prefixes) is expected


@pytest.mark.parametrize(
    ("folder", "prefixes", "expected"),
    [
        ("src", ["src/a.py"], True),
        ("src", ["src"], True),
        ("src/deep", ["src"], True),
        ("src", ["lib"], False),
        ("sr", ["src/a"], False),
        ("src", [""], True),
        ("", ["x"], True),
        ("", [], False),
    ],
)
def test_could_match_under(folder: str, prefixes: list[str], expected: bool) -> None:
    assert could_match_under(folder, prefixes) is expected


def test_matches_agree_with_subtree_pruning() -> None:
    paths = ["a", "a/b", "a/b/c", "a/bc", "ab/c", "x/y/z"]
    for prefixes in (["a/b"], ["a"], ["x/y"], ["ab"], ["a/b/c", "x"]):
        for path in paths:
            if path_matches(path, prefixes):
                folder = os.path.dirname(path)
                while folder:
                    assert could_match_under(folder, prefixes), (path, folder, prefixes)
                    folder = os.path.dirname(folder)
