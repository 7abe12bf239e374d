"""Warm captures follow a write made through another name of a file (a hard link).

The watcher is told of a write for the name it was made through only; the
file's other names in the worktree hold the new bytes too. A warm capture
that meets a file with several names finds its other names by the inode the
index keeps, and re-checks them all by stat at each capture from then on.
"""

from __future__ import annotations

import os
from pathlib import Path

from capture_helpers import assert_matches_git, checkpoint
from repo_helpers import git, init_repo

from snapshotd.engine.core import Engine


def _append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


async def test_a_write_through_a_link_made_before_the_first_capture_reaches_the_other_name(
    watched_engine: Engine, tmp_path: Path
) -> None:
    repo = init_repo(tmp_path / "r", ("a.txt", "one\n"), ("sub/c.txt", "three\n"))
    os.link(repo / "a.txt", repo / "b.txt")
    os.link(repo / "sub" / "c.txt", repo / "d.txt")
    assert_matches_git(repo, await checkpoint(watched_engine, repo))
    assert (await checkpoint(watched_engine, repo))["stats"]["scan"] == "watch"
    _append(repo / "b.txt", "two\n")  # a.txt holds it too
    _append(repo / "sub" / "c.txt", "four\n")  # and d.txt
    written = await checkpoint(watched_engine, repo)
    assert written["stats"]["scan"] == "watch" and written["stats"]["processes"] == 0
    assert_matches_git(repo, written)
    assert git(repo, "show", f"{written['checkpoint']['id']}:a.txt") == "one\ntwo"
    assert git(repo, "show", f"{written['checkpoint']['id']}:d.txt") == "three\nfour"
    _append(repo / "a.txt", "again\n")  # now through the other name
    assert_matches_git(repo, await checkpoint(watched_engine, repo))
    clean = await checkpoint(watched_engine, repo)
    assert clean["checkpoint"]["changed"] is False and clean["stats"]["processes"] == 0


async def test_a_link_made_while_warm_and_then_removed(watched_engine: Engine, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "r", ("a.txt", "one\n"))
    assert_matches_git(repo, await checkpoint(watched_engine, repo))
    os.link(repo / "a.txt", repo / "b.txt")
    assert_matches_git(repo, await checkpoint(watched_engine, repo))
    _append(repo / "a.txt", "two\n")  # told for a.txt; b.txt, captured untracked, holds it too
    written = await checkpoint(watched_engine, repo)
    assert written["stats"]["scan"] == "watch"
    assert_matches_git(repo, written)
    assert git(repo, "show", f"{written['checkpoint']['id']}:b.txt") == "one\ntwo"
    (repo / "b.txt").unlink()
    _append(repo / "a.txt", "three\n")
    assert_matches_git(repo, await checkpoint(watched_engine, repo))
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["changed"] is False


async def test_a_file_a_full_scan_meets_with_several_names_is_rechecked_after_it(
    watched_engine: Engine, tmp_path: Path
) -> None:
    """Linked from a folder git ignores (not watched) and written there: no event names the tracked file."""
    repo = init_repo(tmp_path / "r", ("a.txt", "one\n"), (".gitignore", "build/\n"))
    (repo / "build").mkdir()
    assert_matches_git(repo, await checkpoint(watched_engine, repo))
    os.link(repo / "a.txt", repo / "build" / "copy")
    _append(repo / "build" / "copy", "two\n")
    exact = await checkpoint(watched_engine, repo, exact=True)  # the full scan finds a.txt changed, and linked
    assert_matches_git(repo, exact)
    _append(repo / "build" / "copy", "three\n")
    written = await checkpoint(watched_engine, repo)
    assert written["stats"]["scan"] == "watch"
    assert_matches_git(repo, written)


async def test_names_met_before_a_full_scan_are_rechecked_after_it(watched_engine: Engine, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "r", ("a.txt", "one\n"))
    outside = tmp_path / "outside"
    outside.mkdir()
    assert_matches_git(repo, await checkpoint(watched_engine, repo))
    os.link(repo / "a.txt", repo / "b.txt")  # met by the next warm capture, a.txt with it
    assert_matches_git(repo, await checkpoint(watched_engine, repo))
    assert_matches_git(repo, await checkpoint(watched_engine, repo, exact=True))
    os.link(repo / "a.txt", outside / "c.txt")  # no event: the watcher watches folders of the worktree only
    _append(outside / "c.txt", "two\n")
    written = await checkpoint(watched_engine, repo)
    assert written["stats"]["scan"] == "watch"
    assert_matches_git(repo, written)
