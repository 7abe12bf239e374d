"""Folders git ignores whole are not watched, and are watched again the moment that changes.

A ``node_modules`` or a build's ``target/`` took watches from the user's
limit and the worktree's ceiling, and flooded the watcher during an install,
for paths no capture takes (capture/unwatched.py). Each test checks the trees
against git's own (``oracle_tree``) and what the watch holds.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import trio
from oracle import oracle_tree
from repo_helpers import git, init_repo, write
from test_ignores import check_ignore_children
from test_watch_limits import capture_of

from snapshotd.capture.unwatched import PatternWords
from snapshotd.capture.worktree import WorktreeCapture
from snapshotd.engine.registry import watch_counts


def make_folders(root: Path, count: int, file: str = "index.js") -> None:
    for index in range(count):
        write(root / f"pkg{index}" / "lib" / file, f"module {index}\n")


def watched_paths(capture: WorktreeCapture) -> set[str]:
    assert capture.watcher is not None
    root = capture.info.path
    inside = {os.path.relpath(path, root) for path in capture.watcher._wd_of if path.startswith(root + "/")}
    return {path for path in inside if path.split("/")[0] != ".git"}


async def watched(repo: Path, home: Path, nursery) -> WorktreeCapture:
    capture = capture_of(repo, home)
    await capture.ensure_watch(nursery, lambda paths, overflow: None)
    assert capture.watching, capture.watch_error
    first = await capture.take()
    assert first.stats.scan == "full" and first.tree == oracle_tree(repo)
    return capture


async def warm_equals_git(capture: WorktreeCapture, repo: Path) -> None:
    result = await capture.take()
    assert result.stats.scan == "watch", result.stats
    assert result.tree == oracle_tree(repo)


async def test_a_folder_git_ignores_is_not_watched_and_costs_no_event(tmp_path, nursery):
    repo = init_repo(tmp_path / "r", (".gitignore", "node_modules/\n"), ("src/a.js", "a\n"))
    make_folders(repo / "node_modules", 30)
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None
    assert capture.watcher.unwatched.folders == {"node_modules"}
    assert watched_paths(capture) == {"src"}
    counts = watch_counts(capture)
    assert counts["watcher.unwatched_ignored"] == 1 and counts["watcher.watches"] == capture.watcher.held()
    make_folders(repo / "node_modules", 40, "more.js")  # an install: new folders and files
    write(repo / "node_modules" / "pkg3" / "lib" / "index.js", "changed\n")
    assert await capture.watcher.sync()
    assert capture.watcher.dirty == set()  # not one event
    assert check_ignore_children() == 0  # the walk's, ended by the full scan: an idle worktree keeps none
    write(repo / "src" / "a.js", "a changed\n")
    make_folders(repo / "src" / "node_modules", 3)  # asked about as it appears
    await warm_equals_git(capture, repo)
    assert capture.watcher.unwatched.folders == {"node_modules", "src/node_modules"}
    assert check_ignore_children() == 2  # the watch's and the capture's
    assert (await capture.verify()).differences == []
    assert check_ignore_children() == 1  # the capture's goes on: no rule changed (test_children_carried.py)
    capture.close()


async def test_a_rule_that_no_longer_ignores_the_folder_gets_it_watched(tmp_path, nursery):
    repo = init_repo(tmp_path / "r", (".gitignore", "node_modules/\n*.log\n"), ("src/a.js", "a\n"))
    make_folders(repo / "node_modules", 5)
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None and capture.watcher.unwatched.folders == {"node_modules"}
    write(repo / ".gitignore", "*.log\n")
    write(repo / "node_modules" / "pkg1" / "lib" / "index.js", "written before the scan\n")
    rescanned = await capture.take()
    assert rescanned.stats.scan == "full" and rescanned.tree == oracle_tree(repo)
    assert capture.watcher.unwatched.folders == set()
    assert "node_modules/pkg4/lib" in watched_paths(capture)
    write(repo / "node_modules" / "pkg4" / "lib" / "new.js", "seen by the watch\n")
    write(repo / "node_modules" / "fresh" / "x.js", "a new folder in it\n")
    await warm_equals_git(capture, repo)
    capture.close()


async def test_a_rule_taken_back_as_a_new_folder_appears_still_gets_the_folder_watched(tmp_path, nursery):
    """The new folder's walk reads the new rules first; the full scan after it must still decide the folders
    left out under the old ones again (the lifecycle soak's first difference from git in this code)."""
    repo = init_repo(tmp_path / "r", (".gitignore", "build/\n*.log\n"), ("src/a.js", "a\n"))
    (repo / "build" / "o0").mkdir(parents=True)
    ignored_too = tmp_path / "r" / "src" / "target"
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None and capture.watcher.unwatched.folders == {"build"}
    write(repo / ".gitignore", "*.log\ntarget/\n")
    write(repo / "feature" / "inner" / "x.js", "a new folder, walked in the same batch\n")
    write(ignored_too / "y.o", "ignored by the rule given\n")  # a folder the rules come to ignore meanwhile
    rescanned = await capture.take()
    assert rescanned.stats.scan == "full" and rescanned.tree == oracle_tree(repo)
    assert capture.watcher.unwatched.folders == {"src/target"}
    write(repo / "build" / "o0" / "x.o", "written after the scan: only the watch sees it\n")
    await warm_equals_git(capture, repo)
    capture.close()


async def test_a_folder_the_rules_come_to_ignore_loses_its_watches(tmp_path, nursery):
    """``npm install``, then ``node_modules/`` added to the rules: its watches go at the next capture."""
    repo = init_repo(tmp_path / "r", (".gitignore", "*.log\n"), ("src/a.js", "a\n"))
    make_folders(repo / "node_modules", 5)
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None and "node_modules/pkg4/lib" in watched_paths(capture)
    write(repo / ".gitignore", "*.log\nnode_modules/\n")
    rescanned = await capture.take()
    assert rescanned.stats.scan == "full" and rescanned.tree == oracle_tree(repo)
    assert capture.watcher.unwatched.folders == {"node_modules"}
    assert watched_paths(capture) == {"src"}
    assert capture.watcher.check(always=True)  # the kernel's count agrees with what is held
    write(repo / "node_modules" / "pkg4" / "lib" / "index.js", "ignored now\n")
    assert await capture.watcher.sync() and capture.watcher.dirty == set()
    write(repo / ".gitignore", "*.log\n")
    await capture.take()
    write(repo / "node_modules" / "pkg4" / "lib" / "index.js", "git's again\n")
    await warm_equals_git(capture, repo)
    capture.close()


async def test_a_tracked_file_keeps_an_ignored_folder_watched(tmp_path, nursery):
    repo = init_repo(tmp_path / "r", (".gitignore", "build/\nnode_modules/\n"), ("src/a.js", "a\n"))
    write(repo / "build" / "kept.txt", "tracked in an ignored folder\n")
    write(repo / "build" / "out" / "x.o", "ignored\n")
    git(repo, "add", "-f", "build/kept.txt")
    git(repo, "commit", "-qm", "kept")
    make_folders(repo / "node_modules", 3)
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None
    assert capture.watcher.unwatched.folders == {"node_modules", "build/out"}
    write(repo / "build" / "kept.txt", "changed\n")
    await warm_equals_git(capture, repo)
    git(repo, "add", "-f", "node_modules/pkg1/lib/index.js")  # the user's index now tracks a file in it
    rescanned = await capture.take()
    assert rescanned.stats.scan == "full" and rescanned.tree == oracle_tree(repo)
    assert capture.watcher.unwatched.folders == {"build/out", "node_modules/pkg0", "node_modules/pkg2"}
    assert {"node_modules", "node_modules/pkg1", "node_modules/pkg1/lib"} <= watched_paths(capture)
    write(repo / "node_modules" / "pkg1" / "lib" / "index.js", "the tracked file changed\n")
    await warm_equals_git(capture, repo)
    capture.close()


async def test_a_new_ignored_folder_is_left_out_as_it_appears(tmp_path, nursery):
    repo = init_repo(tmp_path / "r", (".gitignore", "dist/\n__pycache__/\n"), ("src/a.py", "a\n"))
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None and capture.watcher.unwatched.folders == set()
    write(repo / "dist" / "a" / "b" / "bundle.js", "built\n")
    write(repo / "src" / "__pycache__" / "a.pyc", "compiled\n")
    write(repo / "src" / "new.py", "new\n")
    await warm_equals_git(capture, repo)
    assert capture.watcher.unwatched.folders == {"dist", "src/__pycache__"}
    assert watched_paths(capture) == {"src"}
    shutil.rmtree(repo / "dist")
    write(repo / ".gitignore", "__pycache__/\n")
    write(repo / "dist" / "kept.js", "dist is no longer ignored\n")
    await capture.take()
    assert capture.watcher.unwatched.folders == {"src/__pycache__"}
    write(repo / "dist" / "more.js", "seen\n")
    await warm_equals_git(capture, repo)
    capture.close()


async def test_a_nested_rule_that_takes_a_folder_back_keeps_it_watched(tmp_path, nursery):
    repo = init_repo(tmp_path / "r", (".gitignore", "cache/\n"), ("sub/.gitignore", "!cache/\n"), ("a.txt", "a\n"))
    write(repo / "cache" / "deep" / "x", "ignored\n")
    write(repo / "sub" / "cache" / "deep" / "x", "not ignored: sub/.gitignore takes it back\n")
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None and capture.watcher.unwatched.folders == {"cache"}
    write(repo / "sub" / "cache" / "deep" / "y", "new\n")
    await warm_equals_git(capture, repo)
    capture.close()


async def test_a_folder_moved_in_whole_is_asked_under_its_own_rules(tmp_path, nursery):
    repo = init_repo(tmp_path / "r", (".gitignore", "cache/\n"), ("pkg/a.txt", "a\n"))
    write(repo / "pkg" / "cache" / "old", "ignored\n")
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None and capture.watcher.unwatched.folders == {"pkg/cache"}
    incoming = tmp_path / "incoming"
    write(incoming / ".gitignore", "!cache/\n")
    write(incoming / "a.txt", "a\n")
    write(incoming / "cache" / "inner" / "kept", "taken back by the folder's own rules\n")
    shutil.rmtree(repo / "pkg")
    incoming.rename(repo / "pkg")
    await capture.take()
    assert capture.watcher.unwatched.folders == set()
    assert "pkg/cache/inner" in watched_paths(capture)
    write(repo / "pkg" / "cache" / "inner" / "later", "seen by the watch\n")
    await warm_equals_git(capture, repo)
    capture.close()


async def test_the_user_s_excludes_file_is_a_rule_too(tmp_path, nursery):
    excludes = write(tmp_path / "excludes", "logs/\n")
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    git(repo, "config", "core.excludesFile", str(excludes))
    write(repo / "logs" / "day" / "1.log", "ignored by the excludes file\n")
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None and capture.watcher.unwatched.folders == {"logs"}
    write(excludes, "")
    st = os.stat(excludes)
    os.utime(excludes, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    rescanned = await capture.take()
    assert rescanned.stats.scan == "full" and rescanned.tree == oracle_tree(repo)
    assert capture.watcher.unwatched.folders == set()
    write(repo / "logs" / "day" / "2.log", "seen by the watch\n")
    await warm_equals_git(capture, repo)
    capture.close()


async def test_the_ceiling_counts_only_the_folders_watched(tmp_path, nursery, monkeypatch):
    monkeypatch.setenv("SNAPSHOTD_WATCH_CEILING", "40")
    repo = init_repo(tmp_path / "r", (".gitignore", "target/\n"), ("src/main.rs", "fn main() {}\n"))
    make_folders(repo / "target", 100)  # 201 folders git ignores
    capture = await watched(repo, tmp_path / "home", nursery)
    write(repo / "target" / "pkg7" / "lib" / "index.js", "rebuilt\n")
    write(repo / "src" / "main.rs", "fn main() { }\n")
    await warm_equals_git(capture, repo)
    assert capture.watching
    capture.close()


async def test_nothing_is_left_out_where_git_would_read_a_gitignore_from_the_index(tmp_path, nursery):
    repo = init_repo(tmp_path / "r", (".gitignore", "node_modules/\n"), ("a.txt", "a\n"))
    make_folders(repo / "node_modules", 2)
    git(repo, "update-index", "--skip-worktree", ".gitignore")
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None and capture.watcher.unwatched.folders == set()
    assert "node_modules/pkg1/lib" in watched_paths(capture)
    capture.close()


async def test_a_tracked_file_in_an_ignored_folder_stays_watched_with_a_version_4_index(tmp_path, nursery):
    # Version 4 stores each path as what it shares with the one before and the rest: "vendor/keep"
    # is never written whole here ("vendor/aaa" comes first), so only reading the index can tell.
    repo = init_repo(tmp_path / "r", (".gitignore", "keep/\n"), ("vendor/aaa", "a\n"))
    write(repo / "vendor" / "keep" / "lib.c", "tracked though ignored\n")
    git(repo, "add", "-f", "vendor/keep/lib.c")
    git(repo, "update-index", "--index-version", "4")
    assert b"vendor/keep" not in (repo / ".git" / "index").read_bytes()
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None and "vendor/keep" not in capture.watcher.unwatched.folders
    write(repo / "vendor" / "keep" / "lib.c", "edited\n")
    await warm_equals_git(capture, repo)
    capture.close()


async def test_nothing_is_left_out_with_a_split_index(tmp_path, nursery):
    repo = init_repo(tmp_path / "r", (".gitignore", "node_modules/\n"), ("a.txt", "a\n"))
    make_folders(repo / "node_modules", 2)
    git(repo, "update-index", "--split-index")
    capture = capture_of(repo, tmp_path / "home")
    await capture.ensure_watch(nursery, lambda paths, overflow: None)
    with trio.fail_after(10):
        await capture.take()
    assert capture.watcher is not None and capture.watcher.unwatched.folders == set()
    capture.close()


def test_pattern_words_can_only_ask_too_often():
    words = PatternWords()
    words.read(b"# a comment\n\nnode_modules/\n/build\n!keep/\ndocs/**/gen\n*.egg-info\nvendor/**\n Trailing  \n")
    for name in ("node_modules", "NODE_MODULES", "build", "gen", "x.egg-info", "vendor", " Trailing"):
        assert words.could_match(name), name
    for name in ("keep", "src", "docs", "egg-info"):
        assert not words.could_match(name), name
    words.read(b"\\!important\n\\#hash\n")  # escaped: the names themselves
    assert words.could_match("!important") and words.could_match("#hash")
    words.read(b"**\n")
    assert words.could_match("src")


async def test_a_full_scan_files_the_events_so_far_before_it_counts_the_watches(tmp_path, nursery):
    """An exact capture right after a folder was deleted took the watch for one with gaps, and walked it all again."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"), ("d/x.txt", "x\n"), ("e/y.txt", "y\n"))
    capture = await watched(repo, tmp_path / "home", nursery)
    assert capture.watcher is not None
    rearms = capture.watcher.rearms
    for folder in ("d", "e"):
        shutil.rmtree(repo / folder)
        result = await capture.take(exact=True)
        assert result.tree == oracle_tree(repo)
    assert capture.watcher.rearms == rearms and capture.watcher.suspect is None
    capture.close()
