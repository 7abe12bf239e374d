"""check-ignore and check-attr outlive a full scan that proves the rules unchanged, and only then.

A full scan makes a new warm state; the children answered under the rules of
the old one. The idle reconciliation runs one after every burst of changes, so
ending them there started one process or two at each agent turn that wrote a
new file or a file with CRLF endings. A scan with no rule file changed between
(by the watch's events and the stat data of the files outside the worktree)
hands them on; one that changed a rule, met anew a folder they read rules in,
or followed a watch with gaps ends them. Each tree is git's own (``oracle_tree``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import trio
from oracle import oracle_tree
from repo_helpers import git, init_repo, write
from test_ignores import git_children as children
from test_warm import checkpoint, warm_up

from snapshotd.capture import coprocess


async def checked(engine, repo: Path, **params) -> dict:
    """A checkpoint whose tree is git's own."""
    result = await checkpoint(engine, repo, **params)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
    return result


def make_repo(root: Path, *files: tuple[str, str | bytes]) -> Path:
    return init_repo(root, (".gitignore", "*.log\n"), ("src/a.py", "a = 1\n"), *files)


async def test_check_ignore_goes_on_across_verify_and_an_exact_checkpoint(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    write(repo / "src" / "new.py", "new\n")
    assert (await checked(watched_engine, repo))["stats"]["processes"] == 1
    child = children(b"check-ignore")
    assert len(child) == 1
    assert (await watched_engine.call("verify", {"path": str(repo)}))["differences"] == []
    write(repo / "src" / "newer.py", "newer\n")
    write(repo / "src" / "run.log", "ignored\n")
    assert (await checked(watched_engine, repo))["stats"]["processes"] == 0
    assert (await checked(watched_engine, repo, exact=True))["stats"]["scan"] == "full"
    write(repo / "src" / "newest.py", "newest\n")
    assert (await checked(watched_engine, repo))["stats"]["processes"] == 0
    assert children(b"check-ignore") == child


async def test_a_changed_ignore_file_ends_check_ignore(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    write(repo / "src" / "one.tmp", "not ignored yet\n")
    assert (await checked(watched_engine, repo))["stats"]["processes"] == 1
    write(repo / ".gitignore", "*.log\n*.tmp\n")
    assert (await checked(watched_engine, repo))["stats"]["scan"] == "full"
    assert children(b"check-ignore") == set()
    write(repo / "src" / "two.tmp", "ignored now\n")
    result = await checked(watched_engine, repo)
    assert result["stats"]["processes"] == 1  # a child that read the new rules
    assert "src/two.tmp" not in git(repo, "ls-tree", "-r", "--name-only", result["checkpoint"]["id"])


async def test_an_exclude_file_outside_the_watch_ends_check_ignore(watched_engine, tmp_path):
    """A linked worktree's ``info/exclude`` is in the common git dir, which no watch covers: its stat data
    prove it changed."""
    main = make_repo(tmp_path / "main")
    linked = tmp_path / "linked"
    git(main, "worktree", "add", "-q", "--detach", str(linked))
    await warm_up(watched_engine, linked)
    write(linked / "src" / "one.out", "kept\n")
    assert (await checked(watched_engine, linked))["stats"]["processes"] == 1
    with open(main / ".git" / "info" / "exclude", "a") as exclude:
        exclude.write("*.out\n")
    await checked(watched_engine, linked)  # the stat data differ: a full scan
    write(linked / "src" / "two.out", "ignored now\n")
    result = await checked(watched_engine, linked)
    assert result["stats"]["processes"] == 1
    assert "src/two.out" not in git(linked, "ls-tree", "-r", "--name-only", result["checkpoint"]["id"])


async def test_a_folder_moved_in_before_a_full_scan_ends_the_child_that_read_its_rules(watched_engine, tmp_path):
    """git keeps the rule files of the folder it last answered in: a folder moved in whole (no event names
    its ``.gitignore``) and then met only by a full scan must not be answered for under the old one's."""
    repo = make_repo(tmp_path / "r", ("src/.gitignore", "*.a\n"))
    await warm_up(watched_engine, repo)
    write(repo / "src" / "one.b", "asked about: check-ignore reads src/.gitignore\n")
    assert (await checked(watched_engine, repo))["stats"]["processes"] == 1
    other = tmp_path / "other"
    write(other / ".gitignore", "*.b\n")
    write(other / "a.py", "a = 2\n")
    shutil.move(str(repo / "src"), str(tmp_path / "old-src"))
    shutil.move(str(other), str(repo / "src"))
    assert (await checked(watched_engine, repo, exact=True))["stats"]["scan"] == "full"
    assert children(b"check-ignore") == set()
    write(repo / "src" / "two.b", "ignored by the src/.gitignore moved in\n")
    write(repo / "src" / "three.a", "not ignored any more\n")
    result = await checked(watched_engine, repo)
    listed = git(repo, "ls-tree", "-r", "--name-only", result["checkpoint"]["id"]).splitlines()
    assert "src/two.b" not in listed and "src/three.a" in listed


async def test_check_attr_goes_on_across_verify_until_the_attributes_change(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r", (".gitattributes", "*.txt text\n"), ("notes.txt", b"one\r\n"))
    await warm_up(watched_engine, repo)
    write(repo / "notes.txt", b"one\r\ntwo\r\n")
    assert (await checked(watched_engine, repo))["stats"]["processes"] == 1  # check-attr starting
    assert (await watched_engine.call("verify", {"path": str(repo)}))["differences"] == []
    write(repo / "notes.txt", b"one\r\ntwo\r\nthree\r\n")
    assert (await checked(watched_engine, repo))["stats"]["processes"] == 0
    assert len(children(b"check-attr")) == 1
    write(repo / ".gitattributes", "*.txt -text\n")
    assert (await checked(watched_engine, repo))["stats"]["scan"] == "full"
    assert children(b"check-attr") == set()
    write(repo / "notes.txt", b"one\r\ntwo\r\nthree\r\nfour\r\n")
    result = await checked(watched_engine, repo)  # stored with its CRs now, as git stores it
    assert result["stats"]["processes"] == 1


async def test_children_no_capture_asks_end_while_the_worktree_is_idle(watched_engine, tmp_path, monkeypatch):
    monkeypatch.setattr(coprocess, "IDLE_S", 0.5)
    repo = make_repo(tmp_path / "r", (".gitattributes", "*.txt text\n"), ("notes.txt", b"one\r\n"))
    await warm_up(watched_engine, repo)
    write(repo / "notes.txt", b"one\r\ntwo\r\n")
    write(repo / "src" / "new.py", "new\n")
    assert (await checked(watched_engine, repo))["stats"]["processes"] == 2
    with trio.fail_after(15):  # the worktree's presence check looks every 2.5 s
        while children(b"check-ignore") or children(b"check-attr"):
            await trio.sleep(0.2)
    write(repo / "src" / "newer.py", "newer\n")
    assert (await checked(watched_engine, repo))["stats"]["processes"] == 1


async def test_a_watch_with_gaps_ends_the_children(watched_engine, tmp_path):
    """A rule file changed while the watch had a gap gives no event; the walk that mends the watch ends them."""
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    write(repo / "src" / "one.tmp", "not ignored\n")
    assert (await checked(watched_engine, repo))["stats"]["processes"] == 1
    (state,) = watched_engine.worktrees.values()
    watcher = state.capture.watcher
    watcher._inotify.remove(watcher._wd_of[str(repo)])  # the fault: the root's watch gone, as a lost one is
    write(repo / ".gitignore", "*.log\n*.tmp\n")
    assert (await checked(watched_engine, repo))["stats"]["scan"] == "full"
    write(repo / "src" / "two.tmp", "ignored now\n")
    result = await checked(watched_engine, repo)
    assert result["stats"]["processes"] == 1
