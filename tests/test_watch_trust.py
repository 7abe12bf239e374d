"""When the warm path may trust the watcher: lost watches, links, nested repositories."""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from oracle import oracle_tree
from repo_helpers import git
from test_warm import checkpoint, make_repo, warm_up

from snapshotd.errors import FilesystemError


def inotify_watches() -> int:
    """Inotify watches this process holds, over all its inotify descriptors."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}") as info:
                total += sum(1 for line in info if line.startswith("inotify wd:"))
        except OSError:
            continue
    return total


def linked_repo(root: Path) -> Path:
    """A repository with ``lib/`` (and folders below it) and a symlink ``alias -> lib``, as git's own tree has."""
    repo = make_repo(root)
    for folder in ("lib", "lib/po", "lib/po/glossary"):
        (repo / folder).mkdir()
        (repo / folder / "file.txt").write_text(f"{folder} v1\n")
    (repo / "alias").symlink_to("lib")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "lib and its alias")
    return repo


async def test_rewriting_a_link_to_a_folder_keeps_the_folder_watched(watched_engine, tmp_path):
    # git's checkout rewrites a symlink by unlink + symlink; watchfiles then dropped
    # the watches of the folder the link points to, and warm captures stayed stale.
    repo = linked_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    (repo / "alias").unlink()
    (repo / "alias").symlink_to("lib")
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    for folder in ("lib", "lib/po", "lib/po/glossary"):
        (repo / folder / "file.txt").write_text(f"{folder} v2\n")
    result = await checkpoint(watched_engine, repo)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)


def watcher_of(engine, repo: Path):
    """The engine's watcher for the worktree at ``repo``."""
    (state,) = [s for s in engine.worktrees.values() if s.info.path == os.path.realpath(repo)]
    return state.capture.watcher


async def test_a_link_to_a_big_outside_folder_adds_no_watch_and_no_dirty_path(watched_engine, tmp_path):
    outside = tmp_path / "outside"
    for index in range(300):
        (outside / f"d{index}" / "inner").mkdir(parents=True)
    repo = make_repo(tmp_path / "r")
    (repo / "usr").symlink_to(outside)
    before = inotify_watches()
    await warm_up(watched_engine, repo)
    folders = sum(1 for _, dirs, _ in os.walk(repo) for _ in dirs) + 1
    assert inotify_watches() - before <= folders  # the worktree's folders and its git dir's few, nothing outside
    (outside / "d7" / "inner" / "new.txt").write_text("outside")
    (outside / "d8" / "file").write_text("outside")
    watcher = watcher_of(watched_engine, repo)
    assert await watcher.sync()
    assert not [path for path in watcher.dirty if path.startswith("usr/")]
    result = await checkpoint(watched_engine, repo)
    assert result["stats"]["scan"] == "watch"
    assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_a_watch_the_watcher_does_not_hold_makes_the_next_capture_full(watched_engine, tmp_path):
    from snapshotd.capture.inotify import IN_MODIFY

    repo = make_repo(tmp_path / "r")
    for index in range(40):  # watch descriptors past 9 and 15 (the kernel lists them in hex)
        (repo / "many" / f"d{index}").mkdir(parents=True)
        (repo / "many" / f"d{index}" / "f").write_text(str(index))
    await warm_up(watched_engine, repo)
    watcher = watcher_of(watched_engine, repo)
    assert watcher.live
    stray = tmp_path / "stray"
    stray.mkdir()
    # Fault: the kernel's set of watches and the watcher's disagree. The kernel's are counted after
    # an event about a folder (a file written cannot change them) and before every full scan.
    assert watcher._inotify._libc.inotify_add_watch(watcher._inotify.fd, str(stray).encode(), IN_MODIFY) > 0
    (repo / "README").write_text("changed\n")
    (repo / "many" / "d0" / "inner").mkdir()
    result = await checkpoint(watched_engine, repo)
    assert result["stats"]["scan"] == "full"
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
    (repo / "README").write_text("changed again\n")
    again = await checkpoint(watched_engine, repo)
    assert again["stats"]["scan"] == "watch"  # re-armed and proven whole
    assert again["checkpoint"]["tree"] == oracle_tree(repo)


async def test_a_watch_dropped_behind_the_watchers_back_is_watched_again(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    watcher = watcher_of(watched_engine, repo)
    src = str(repo / "src")
    watcher._inotify.remove(watcher._wd_of[src])  # fault: the kernel drops the folder's watch
    assert await watcher.sync()
    (repo / "src" / "a.py").write_text("print('after')\n")
    result = await checkpoint(watched_engine, repo)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_a_nested_repository_made_after_a_warm_capture_is_a_gitlink(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    lib = repo / "vendor" / "lib"
    lib.mkdir(parents=True)
    (lib / "code.c").write_text("int x;\n")
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    git(lib, "init", "-q")
    (lib / "code.c").write_text("int y;\n")
    git(lib, "add", "-A")
    git(lib, "commit", "-qm", "nested")
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    (lib / "code.c").write_text("int z;\n")  # inside the nested repository: not the superproject's file
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    git(lib, "commit", "-qam", "moves the gitlink")
    result = await checkpoint(watched_engine, repo)
    assert result["stats"]["scan"] == "watch"
    assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_a_warm_capture_that_fails_part_way_leaves_no_trace(watched_engine, tmp_path, monkeypatch):
    from snapshotd.capture import warm

    repo = make_repo(tmp_path / "r")
    (repo / "src" / "b.py").write_text("print('b')\n")
    await warm_up(watched_engine, repo)
    assert (await checkpoint(watched_engine, repo))["stats"]["scan"] == "watch"
    (repo / "src" / "a.py").write_text("print('a2')\n")
    (repo / "src" / "b.py").write_text("print('b2')\n")
    hash_file = warm.WarmBuilder._hash

    def disk_full_at_b(self, path, st, mode):  # fault: the disk fills up after a.py was applied
        if path == "src/b.py":
            raise OSError(28, "No space left on device", path)
        return hash_file(self, path, st, mode)

    monkeypatch.setattr(warm.WarmBuilder, "_hash", disk_full_at_b)
    with pytest.raises(FilesystemError, match="the disk is full"):
        await checkpoint(watched_engine, repo)
    monkeypatch.setattr(warm.WarmBuilder, "_hash", hash_file)
    result = await checkpoint(watched_engine, repo)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_a_full_scan_that_fails_keeps_what_the_watcher_saw(watched_engine, tmp_path, monkeypatch):
    from snapshotd.capture import worktree as engine_mod

    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    assert (await checkpoint(watched_engine, repo))["stats"]["scan"] == "watch"
    (repo / "README").write_text("edited\n")
    with open(repo / ".gitignore", "a") as handle:
        handle.write("*.tmp\n")  # makes the next capture a full scan

    async def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    capture_cold = engine_mod.capture_cold
    monkeypatch.setattr(engine_mod, "capture_cold", disk_full)
    with pytest.raises(FilesystemError, match="the disk is full"):
        await checkpoint(watched_engine, repo)
    monkeypatch.setattr(engine_mod, "capture_cold", capture_cold)
    result = await checkpoint(watched_engine, repo)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)


@contextlib.contextmanager
def unseen_write(path: Path, data: bytes) -> Iterator[None]:
    """Change a file's first bytes through a shared mapping, the file kept open: inotify reports nothing."""
    with open(path, "r+b") as handle, mmap.mmap(handle.fileno(), 0) as mapped:
        mapped[: len(data)] = data
        mapped.flush()
        yield


async def test_verify_names_each_change_the_watcher_missed(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    clean = await watched_engine.call("verify", {"path": str(repo)})
    assert clean["differences"] == [] and clean["scan_ms"] >= 0
    with unseen_write(repo / "README", b"READ"):
        stale = await checkpoint(watched_engine, repo)
        assert stale["stats"]["scan"] == "watch"
        assert stale["checkpoint"]["changed"] is False  # the watcher saw nothing
        found = await watched_engine.call("verify", {"path": str(repo)})
    disk_oid = git(repo, "hash-object", "README")
    assert found["differences"] == [{
        "path": "README",
        "warm": {"oid": git(repo, "rev-parse", "HEAD:README"), "mode": "100644"},
        "disk": {"oid": disk_oid, "mode": "100644"},
        "cause": "changed on disk: the watcher missed a write",
    }]
    assert (await watched_engine.call("status", {}))["counters"]["watch_miss"] == 1
    assert (await watched_engine.call("verify", {"path": str(repo)}))["differences"] == []
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)


async def test_idle_reconciliation_logs_each_missed_path(watched_engine, tmp_path, monkeypatch, caplog):
    import trio

    from snapshotd.capture import worktree as engine_mod

    monkeypatch.setattr(engine_mod, "RECONCILE_IDLE_S", 0.2)
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    with unseen_write(repo / "README", b"READ"), caplog.at_level("WARNING", logger="snapshotd.engine.core"):
        (repo / "src" / "a.py").write_text("print('seen')\n")
        assert (await checkpoint(watched_engine, repo))["stats"]["scan"] == "watch"
        with trio.fail_after(10):
            while not (await watched_engine.call("status", {}))["counters"].get("reconciliations"):
                await trio.sleep(0.1)
    assert (await watched_engine.call("status", {}))["counters"]["watch_miss"] == 1
    (record,) = [r for r in caplog.records if "watch_miss" in r.getMessage()]
    assert "README changed on disk: the watcher missed a write" in record.getMessage()
    assert "idle reconciliation" in record.getMessage()


async def test_a_write_while_the_idle_reconciliation_scans_is_no_miss(watched_engine, tmp_path, monkeypatch, caplog):
    """An agent writing just as the idle reconciliation begins its full scan: the watcher saw the write,
    so the scan's newer content is no watch_miss (a loaded machine's replay counted 10 to 30 of these)."""
    import trio

    from snapshotd.capture import worktree as engine_mod

    monkeypatch.setattr(engine_mod, "RECONCILE_IDLE_S", 0.2)
    real_cold = engine_mod.WorktreeCapture._cold

    async def cold_after_a_write(self, reason, hints=None):
        if reason == "idle reconciliation":
            (repo / "src" / "a.py").write_text("print('written as the scan began')\n")
            (repo / "src" / "new.py").write_text("print('new')\n")
        return await real_cold(self, reason, hints)

    monkeypatch.setattr(engine_mod.WorktreeCapture, "_cold", cold_after_a_write)
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    with caplog.at_level("WARNING", logger="snapshotd.engine.core"):
        (repo / "README").write_text("a turn's edit\n")
        assert (await checkpoint(watched_engine, repo))["stats"]["scan"] == "watch"
        with trio.fail_after(10):
            while not (await watched_engine.call("status", {}))["counters"].get("reconciliations"):
                await trio.sleep(0.1)
    assert not (await watched_engine.call("status", {}))["counters"].get("watch_miss")
    assert not [r for r in caplog.records if "watch_miss" in r.getMessage()]
    after = await checkpoint(watched_engine, repo)
    assert after["checkpoint"]["tree"] == oracle_tree(repo)


def test_verify_on_the_command_line_exits_1_on_a_difference(tmp_path):
    from daemon_helpers import child_env, cli, running_daemon

    repo = make_repo(tmp_path / "r")
    sock = tmp_path / "run" / "s.sock"
    env = child_env(sock)
    with running_daemon(sock, tmp_path / "daemon.log") as daemon:
        cli("checkpoint", str(repo), env=env)
        clean = cli("verify", "--json", str(repo), env=env).json()
        assert clean["differences"] == []
        assert "no difference" in cli("verify", str(repo), env=env).stdout
        cli("checkpoint", str(repo), env=env)
        with unseen_write(repo / "README", b"READ"):
            cli("checkpoint", str(repo), env=env)
            human = cli("verify", str(repo), env=env, code=1)
        assert human.stdout == "README: changed on disk: the watcher missed a write\n"
        assert "watch_miss in" in daemon.log_text() and "README" in daemon.log_text()
        assert cli("verify", "--json", str(repo), env=env).json()["differences"] == []


GIT_CLONE = os.environ.get("SNAPSHOTD_GIT_CLONE", "")
GIT_TURNS = (
    "7ff1e8dc1e1680510c96e69965b3fa81372c5037~1",
    "7ff1e8dc1e1680510c96e69965b3fa81372c5037",
    "b70a02dcc9",
)


@pytest.mark.slow
@pytest.mark.skipif(
    not GIT_CLONE
    or (not os.path.isdir(os.path.join(GIT_CLONE, "objects")) and not os.path.isdir(os.path.join(GIT_CLONE, ".git"))),
    reason="needs SNAPSHOTD_GIT_CLONE: the git dir of a local clone of git's own repository (public git/git)",
)
async def test_warm_captures_equal_git_on_git_own_history(watched_engine, tmp_path):
    # Each turn moves the files as an agent's edits would (read-tree -u from a private
    # index that starts without stat data, so the first move rewrites every file),
    # leaving the worktree's own index and HEAD alone.
    source = GIT_CLONE if os.path.isdir(os.path.join(GIT_CLONE, "objects")) else os.path.join(GIT_CLONE, ".git")
    worktree = tmp_path / "wt"
    git(tmp_path, "clone", "-q", "--no-checkout", source, str(worktree))
    git(worktree, "checkout", "-q", GIT_TURNS[0])
    mover = {"GIT_DIR": source, "GIT_WORK_TREE": str(worktree), "GIT_INDEX_FILE": str(tmp_path / "mover.idx")}
    git(worktree, "read-tree", GIT_TURNS[0], env=mover)
    await warm_up(watched_engine, worktree)
    for turn in GIT_TURNS[1:]:
        git(worktree, "read-tree", "--reset", "-u", turn, env=mover)
        result = await checkpoint(watched_engine, worktree)
        assert result["checkpoint"]["tree"] == oracle_tree(worktree), f"turn {turn}"
    assert (await watched_engine.call("verify", {"path": str(worktree)}))["differences"] == []
