"""Files under end-of-line attributes are hashed in-process when git would record their bytes as they are.

A repository with a ``.gitattributes`` had every changed file hashed by git, one
process per capture. A file without a CR byte is recorded as it is unless an
attributes file names a filter, an encoding or ``ident`` (capture/asis.py):
those are hashed in-process, the others still by git. On the warm path the
rules are asked per path of one check-attr (capture/eol.py), which starts once
per warm state: only the paths a filter, an encoding or ``ident`` touches go
to git. Every tree is git's own.
"""

from __future__ import annotations

from pathlib import Path

from oracle import oracle_tree
from repo_helpers import git
from test_warm import checkpoint, warm_up


def make_repo(root: Path, attributes: str) -> Path:
    root.mkdir(parents=True)
    git(root, "init", "-q")
    (root / ".gitattributes").write_text(attributes)
    (root / "src").mkdir()
    (root / "src" / "a.cs").write_text("class A {}\n")
    (root / "readme.md").write_text("readme\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


async def test_a_file_without_a_cr_under_text_auto_needs_no_process(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r", "* text=auto eol=lf\n*.cs text diff=csharp\n*.png binary\n")
    (repo / "src" / "new.md").write_text("untracked\n")  # known to the warm state: no check of its ignore rules
    await warm_up(watched_engine, repo)
    for index in range(3):
        (repo / "readme.md").write_text(f"readme {index}\n")
        (repo / "src" / "a.cs").write_text(f"class A{index} {{}}\n")
        (repo / "src" / "new.md").write_text(f"new {index}\n")
        result = await checkpoint(watched_engine, repo)
        assert result["stats"]["scan"] == "watch"
        assert result["stats"]["processes"] == 0 and result["stats"]["hashed"] == 3
        assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_a_file_with_a_cr_is_hashed_by_git(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r", "* text=auto eol=lf\n")
    (repo / "src" / "plain.cs").write_bytes(b"untracked\n")
    await warm_up(watched_engine, repo)
    (repo / "readme.md").write_bytes(b"one\r\ntwo\r\n")  # git records it with LF endings
    (repo / "src" / "a.cs").write_bytes(b"lone\rcr\n")
    (repo / "src" / "plain.cs").write_bytes(b"plain\n")
    result = await checkpoint(watched_engine, repo)
    assert result["stats"]["scan"] == "watch" and result["stats"]["processes"] == 1  # one git for both
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
    blob = git(repo, "rev-parse", f"{result['checkpoint']['id']}:readme.md")
    assert git(repo, "cat-file", "blob", blob) == "one\ntwo"


async def test_an_attributes_file_naming_a_filter_or_ident_sends_only_its_paths_to_git(watched_engine, tmp_path):
    for name, attributes, touched in [("filter", "*.dat filter=lfs\n", "x.dat"), ("ident", "*.c ident\n", "x.c"),
                                      ("encoding", "*.txt working-tree-encoding=UTF-16\n", "x.txt"),
                                      ("comment", "# no ident here\n", None)]:
        repo = make_repo(tmp_path / name, "* text=auto\n" + attributes)
        await warm_up(watched_engine, repo)
        processes = []
        for round_ in range(2):
            (repo / "readme.md").write_text(f"changed {round_}\n")
            result = await checkpoint(watched_engine, repo)
            processes.append(result["stats"]["processes"])
            assert result["checkpoint"]["tree"] == oracle_tree(repo), name
        if touched is not None:
            (repo / touched).write_bytes(b"\xff\xfea\x00\n\x00" if name == "encoding" else b"$Id$ data\n")
            git(repo, "add", touched)  # tracked, so no check of its ignore rules
            await checkpoint(watched_engine, repo)  # the index changed: a full scan, the same attributes
            (repo / touched).write_bytes(b"\xff\xfeb\x00\n\x00" if name == "encoding" else b"$Id$ more\n")
            result = await checkpoint(watched_engine, repo)
            processes.append(result["stats"]["processes"])
            assert result["checkpoint"]["tree"] == oracle_tree(repo), name
        # check-attr starts, then readme.md needs nothing; the file the rule touches needs git (check-attr goes on)
        assert processes == ([1, 0, 1] if touched else [1, 0]), name


async def test_an_ident_in_an_untracked_attributes_file_found_at_the_scan(watched_engine, tmp_path):
    """Attributes files the user's index does not hold yet count too, read from the worktree."""
    repo = make_repo(tmp_path / "r", "* text=auto\n")
    (repo / "src" / ".gitattributes").write_text("*.cs ident\n")
    (repo / "src" / "a.cs").write_text("// $Id: something $\nclass A {}\n")
    first = await warm_up(watched_engine, repo)
    assert first["checkpoint"]["tree"] == oracle_tree(repo)
    (repo / "src" / "a.cs").write_text("// $Id: other $\nclass B {}\n")
    result = await checkpoint(watched_engine, repo)
    assert result["stats"]["processes"] == 2  # check-attr starting, then git for the ident
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
    (repo / "src" / "a.cs").write_text("// $Id: more $\nclass B {}\n")
    result = await checkpoint(watched_engine, repo)
    assert result["stats"]["processes"] == 1
    assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_a_filter_added_to_the_attributes_is_seen_at_once(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r", "* text=auto\n")
    await warm_up(watched_engine, repo)
    (repo / "readme.md").write_text("in-process\n")
    assert (await checkpoint(watched_engine, repo))["stats"]["processes"] == 0
    (repo / ".gitattributes").write_text("* text=auto\n*.cs ident\n")
    (repo / "src" / "a.cs").write_text("// $Id: x $\n")
    result = await checkpoint(watched_engine, repo)  # the attributes changed: a full scan, git's own rules
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
    (repo / "src" / "a.cs").write_text("// $Id: y $\nmore\n")
    result = await checkpoint(watched_engine, repo)
    assert result["stats"]["scan"] == "watch" and result["stats"]["processes"] == 2  # check-attr starting, and git
    assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_an_index_of_version_4_is_walked_for_its_attributes(watched_engine, tmp_path):
    """Version 4 compresses paths, so the index's bytes cannot say whether it tracks a .gitattributes."""
    repo = make_repo(tmp_path / "r", "* text=auto\n")
    (repo / "src" / ".gitattributes").write_text("*.cs ident\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "ident")
    git(repo, "update-index", "--index-version", "4")
    await warm_up(watched_engine, repo)
    (repo / "src" / "a.cs").write_text("// $Id: y $\nclass C {}\n")
    result = await checkpoint(watched_engine, repo)
    assert result["stats"]["processes"] == 2  # check-attr starting, then git for the ident
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
