"""The capture's stages directly: the stat cache, the cold capture and the warm state, against git."""

from __future__ import annotations

import gc
import os
import shutil
import time
from pathlib import Path

import pygit2
from oracle import oracle_tree
from repo_helpers import git, init_repo, write

from snapshotd.capture.core import capture_cold
from snapshotd.capture.scan import parse_listing
from snapshotd.capture.state import CaptureStats, StatCache, conversion_rules, make_fence
from snapshotd.capture.treeedit import RecordingIndex
from snapshotd.capture.userindex import UserIndex
from snapshotd.capture.warm import WarmState, capture_warm, rule_sources, signature_of
from snapshotd.paths import folders_above
from snapshotd.store.identity import Records, WorktreeInfo, identify, locate


def info_of(repo: Path, home: Path) -> WorktreeInfo:
    return identify(locate(str(repo)), Records(home))


def test_folders_above_lists_outermost_first():
    assert list(folders_above("a/b/c")) == ["a", "a/b"]
    assert list(folders_above("top")) == []


def test_stat_cache_trusts_an_entry_only_while_its_stat_data_match_and_predate_the_fence(tmp_path):
    path = write(tmp_path / "f", "one\n")
    old = time.time() - 60
    os.utime(path, (old, old))
    time.sleep(0.05)
    fence = make_fence(str(tmp_path))
    cache = StatCache()
    cache.store("f", os.lstat(path), fence, "a" * 40)
    assert cache.lookup("f", os.lstat(path)) == "a" * 40
    write(path, "two\n")
    assert cache.lookup("f", os.lstat(path)) is None  # changed since
    cache.store("f", os.lstat(path), fence, "b" * 40)
    assert cache.lookup("f", os.lstat(path)) is None  # written after the fence: racy, never trusted


def test_the_fence_is_one_file_written_again_and_never_writes_into_a_file_it_did_not_make(tmp_path):
    folder = tmp_path / "tmp"
    folder.mkdir()
    first = make_fence(str(folder))
    inode = (folder / "fence").stat().st_ino
    time.sleep(0.02)
    later = make_fence(str(folder))
    assert later > first  # the time of this write, not of the file's making
    assert [p.name for p in folder.iterdir()] == ["fence"] and (folder / "fence").stat().st_ino == inode
    written = write(folder / "probe", "x")
    assert abs(make_fence(str(folder)) - written.stat().st_mtime_ns) < 50_000_000  # as a file written now
    (folder / "fence").unlink()
    (folder / "fence").write_text("the user's own notes\n")  # not a fence: kept as it is
    assert make_fence(str(folder)) > 0
    assert (folder / "fence").read_text() == "the user's own notes\n"
    assert sorted(p.name for p in folder.iterdir()) == ["fence", "probe"]


def test_stat_cache_forgets_everything_when_the_conversion_rules_change(tmp_path):
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    info = info_of(repo, tmp_path / "home")
    listing = b"? .gitattributes\0"
    write(repo / ".gitattributes", "*.txt text\n")
    cache = StatCache()
    cache.follow_rules(conversion_rules(info, listing, tracked_attributes=False))
    cache.entries["a.txt"] = object()  # type: ignore[assignment]
    cache.follow_rules(conversion_rules(info, listing, tracked_attributes=False))
    assert "a.txt" in cache.entries  # same rules: kept
    write(repo / ".gitattributes", "*.txt text eol=crlf\n")
    cache.follow_rules(conversion_rules(info, listing, tracked_attributes=False))
    assert cache.entries == {}


def test_parse_listing_splits_gits_tags():
    listing = b"C changed\0R removed\0? new\0S sparse\0h assumed\0H clean\0"
    assert parse_listing(listing) == ({"changed"}, {"removed"}, {"new"}, {"sparse", "assumed"})


async def test_cold_capture_equals_git_and_leaves_the_users_index_alone(tmp_path):
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"), ("gone.txt", "x\n"), (".gitignore", "*.log\n"))
    write(repo / "a.txt", "changed\n")
    (repo / "gone.txt").unlink()
    write(repo / "new" / "b.txt", "b\n")
    write(repo / "skip.log", "ignored\n")
    index = repo / ".git" / "index"
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    result = await capture_cold(info_of(repo, tmp_path / "home"), StatCache(), 0)
    assert result.tree == oracle_tree(repo)
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before
    assert result.stats.scan == "full" and result.stats.processes == 1
    assert result.user is not None and result.user.has("gone.txt")


async def test_warm_state_takes_the_dirty_paths_only(tmp_path):
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"), ("b.txt", "b\n"))
    info = info_of(repo, tmp_path / "home")
    cache = StatCache()
    cold = await capture_cold(info, cache, 0)
    index_mtime_ns = (repo / ".git" / "index").stat().st_mtime_ns
    sources = rule_sources(info)
    warm = WarmState.from_cold(cold, index_mtime_ns, sources, signature_of(sources))
    assert warm is not None and warm.tree == cold.tree
    write(repo / "a.txt", "edited\n")
    write(repo / "c.txt", "new\n")
    stats = CaptureStats(scan="watch")
    fence = make_fence(os.path.join(info.state_dir, "tmp"))
    tree = capture_warm(info, warm, {"a.txt", "c.txt"}, cache, stats, 0, fence)
    assert tree == warm.tree == oracle_tree(repo)
    assert stats.processes == 1  # one ls-files for the new path; the known one needed none


def _warm_state(info: WorktreeInfo, repo: Path, cold) -> WarmState:
    sources = rule_sources(info)
    warm = WarmState.from_cold(cold, (repo / ".git" / "index").stat().st_mtime_ns, sources, signature_of(sources))
    assert warm is not None
    return warm


def _indexes_held(root: object) -> int:
    """The distinct ``pygit2.Index`` objects reachable from ``root`` (the warm state) in three steps."""
    seen: dict[int, object] = {}
    layer = [root]
    for _ in range(3):
        layer = [item for holder in layer for item in gc.get_referents(holder)]
        seen.update((id(item), item) for item in layer if isinstance(item, pygit2.Index))
    return len(seen)


async def test_the_warm_state_holds_one_index_in_memory(tmp_path):
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"), ("b.txt", "b\n"))
    info = info_of(repo, tmp_path / "home")
    warm = _warm_state(info, repo, await capture_cold(info, StatCache(), 0))
    assert _indexes_held(warm) == 1  # the user's index as read is kept as what the captures changed of it


async def test_a_tracked_file_deleted_and_made_again_warm_keeps_the_users_entry(tmp_path):
    # core.fileMode false: only the user's index as read gives the re-made file its executable mode.
    repo = init_repo(tmp_path / "r", ("tool.sh", "echo\n"), ("d/inner.txt", "i\n"), ("small.txt", "s\n"))
    git(repo, "config", "core.fileMode", "false")
    git(repo, "update-index", "--chmod=+x", "tool.sh")
    git(repo, "commit", "-qm", "exec")
    info = info_of(repo, tmp_path / "home")
    cache = StatCache()
    warm = _warm_state(info, repo, await capture_cold(info, cache, 0))
    steps = [
        ({"tool.sh", "d"}, lambda: ((repo / "tool.sh").unlink(), shutil.rmtree(repo / "d"))),
        ({"tool.sh", "d"}, lambda: (write(repo / "tool.sh", "echo again\n"), write(repo / "d", "f\n"))),
        ({"d", "d/inner.txt"}, lambda: ((repo / "d").unlink(), write(repo / "d" / "inner.txt", "i\n"))),
    ]
    for dirty, change in steps:
        change()
        stats = CaptureStats(scan="watch")
        tree = capture_warm(info, warm, dirty, cache, stats, 0, make_fence(os.path.join(info.state_dir, "tmp")))
        assert tree == oracle_tree(repo), dirty
    assert "100755 blob" in git(repo, "ls-tree", tree, "tool.sh")


def test_the_users_entries_an_added_entry_replaces_are_kept(tmp_path):
    # libgit2 drops "d/inner.txt" when a file "d" is added (and "d" when "d/x" is): the user's stay known.
    repo = init_repo(tmp_path / "r", ("d/inner.txt", "i\n"), ("f", "f\n"))
    index = pygit2.Index(str(repo / ".git" / "index"))
    user = UserIndex(index)
    recording = RecordingIndex(index, "")
    recording.user = user
    blob = pygit2.Repository(str(repo)).create_blob(b"x")
    for path in ("d", "f/x"):
        recording.add(pygit2.IndexEntry(path, blob, pygit2.enums.FileMode.BLOB))
    assert "d/inner.txt" not in index and "f" not in index
    assert user.has("d/inner.txt") and user.has("f") and not user.has("d") and not user.has("f/x")
    assert user.entry("f") is not None and user.entry("d/inner.txt") is not None
