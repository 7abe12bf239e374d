"""Warm captures (watcher-driven, no scan) must equal git's answer exactly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from oracle import oracle_tree
from repo_helpers import git


def make_repo(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q")
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("print('a')\n")
    (root / "README").write_text("readme\n")
    (root / ".gitignore").write_text("build/\n*.log\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


async def checkpoint(engine, repo: Path, **params) -> dict:
    return await engine.call("checkpoint", {"path": str(repo), **params})


async def warm_up(engine, repo: Path) -> dict:
    first = await checkpoint(engine, repo)
    assert first["stats"]["scan"] == "full"
    return first


async def test_clean_warm_capture_starts_no_process(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    first = await warm_up(watched_engine, repo)
    again = await checkpoint(watched_engine, repo)
    assert again["stats"]["scan"] == "watch"
    assert again["stats"]["processes"] == 0
    assert again["stats"]["hashed"] == 0
    assert again["checkpoint"]["tree"] == first["checkpoint"]["tree"]
    assert again["checkpoint"]["changed"] is False


async def test_edits_of_known_files_need_no_process(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    for index in range(10):
        (repo / "src" / "a.py").write_text(f"print({index})\n")
        (repo / "README").write_text(f"readme {index}\n")
        result = await checkpoint(watched_engine, repo)
        assert result["stats"]["scan"] == "watch"
        assert result["stats"]["processes"] == 0
        assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_write_from_another_process_just_before_the_request(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    for index in range(20):
        subprocess.run(
            [sys.executable, "-c", f"open({str(repo / 'README')!r}, 'w').write('v{index}')"], check=True
        )
        result = await checkpoint(watched_engine, repo)
        assert result["stats"]["scan"] == "watch"
        assert result["checkpoint"]["tree"] == oracle_tree(repo), f"write {index} missed"


async def test_files_created_inside_just_created_folders(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    for round_ in range(5):
        deep = repo / f"new{round_}" / "a" / "b" / "c"
        deep.mkdir(parents=True)
        for index in range(40):
            (deep / f"f{index}.txt").write_text(f"{round_}-{index}")
            (deep.parent / f"g{index}.txt").write_text(f"{index}")
        result = await checkpoint(watched_engine, repo)
        assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_burst_of_40000_changes_between_captures(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    for folder in range(200):
        path = repo / "burst" / f"d{folder}"
        path.mkdir(parents=True)
        for index in range(200):
            (path / f"f{index}").write_bytes(b"%d-%d" % (folder, index))
    result = await checkpoint(watched_engine, repo)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
    again = await checkpoint(watched_engine, repo)
    assert again["checkpoint"]["tree"] == result["checkpoint"]["tree"]


async def test_gitignore_edits_change_what_is_captured(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    (repo / "notes.txt").write_text("notes")
    (repo / "debug.log").write_text("log")
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    with open(repo / ".gitignore", "a") as handle:
        handle.write("notes.txt\n!debug.log\n")
    result = await checkpoint(watched_engine, repo)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
    (repo / "sub").mkdir()
    (repo / "sub" / ".gitignore").write_text("!notes.txt\n")
    (repo / "sub" / "notes.txt").write_text("nested negation")
    result = await checkpoint(watched_engine, repo)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_user_index_changes_are_followed(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    (repo / "build").mkdir()
    (repo / "build" / "out.bin").write_bytes(b"\0binary")
    git(repo, "add", "-f", "build/out.bin")  # tracked although ignored
    result = await checkpoint(watched_engine, repo)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
    git(repo, "rm", "-q", "--cached", "build/out.bin")
    result = await checkpoint(watched_engine, repo)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_moves_deletes_and_type_changes(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    os.rename(repo / "src", repo / "lib")
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    (repo / "lib" / "a.py").unlink()
    (repo / "lib" / "a.py").mkdir()
    (repo / "lib" / "a.py" / "inner").write_text("x")
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    os.symlink("README", repo / "link")
    os.chmod(repo / "README", 0o755)
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    subprocess.run(["rm", "-rf", str(repo / "lib")], check=True)
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)


async def test_exact_forces_a_full_scan(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    result = await checkpoint(watched_engine, repo, exact=True)
    assert result["stats"]["scan"] == "full"
    assert result["stats"]["processes"] >= 1


async def test_status_reports_watching_and_no_misses(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    (repo / "README").write_text("changed")
    await checkpoint(watched_engine, repo)
    status = await watched_engine.call("status", {})
    assert [wt["watching"] for wt in status["worktrees"]] == [True]
    assert status["counters"]["watch_miss"] == 0
    assert status["counters"]["captures.watch"] >= 1
    assert status["counters"]["watcher.cookie_waits"] >= 1


OPS = st.lists(
    st.tuples(
        st.sampled_from(["write", "same_size", "delete", "mkdir", "rmdir", "chmod", "symlink", "rename", "ignore", "add", "commit"]),
        st.integers(min_value=0, max_value=7),
        st.integers(min_value=0, max_value=3),
    ),
    min_size=1,
    max_size=12,
)


def apply_op(repo: Path, op: str, a: int, b: int) -> None:
    folder = repo / f"d{b}"
    path = folder / f"f{a}.txt"
    if op == "write":
        folder.mkdir(exist_ok=True)
        if path.is_dir() or path.is_symlink():
            return
        path.write_text(f"content {a} {b} " * (a + 1))
    elif op == "same_size":
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            path.write_bytes(bytes(reversed(data)) if data != data[::-1] else data.upper())
    elif op == "delete":
        if path.is_symlink() or path.is_file():
            path.unlink()
    elif op == "mkdir":
        (folder / f"sub{a}").mkdir(parents=True, exist_ok=True)
        (folder / f"sub{a}" / "inner.txt").write_text(f"inner {a}")
    elif op == "rmdir":
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    elif op == "chmod":
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o755 if a % 2 else 0o644)
    elif op == "symlink":
        folder.mkdir(exist_ok=True)
        if not os.path.lexists(path):
            os.symlink(f"../README{a}", path)
    elif op == "rename":
        if path.exists() and not path.is_symlink():
            os.replace(path, repo / f"moved{a}.txt") if not (repo / f"moved{a}.txt").is_dir() else None
    elif op == "ignore":
        with open(repo / ".gitignore", "a") as handle:
            handle.write(f"f{a}.txt\n" if b % 2 else f"!d{b}/f{a}.txt\n")
    elif op == "add":
        git(repo, "add", "-A", "--", f"d{b}") if folder.exists() else None
    elif op == "commit":
        git(repo, "commit", "-qam", "user commit", "--allow-empty")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(OPS, min_size=1, max_size=3))
async def test_property_warm_equals_git(steps, tmp_path_factory):
    import trio

    from snapshotd.engine.core import Engine

    repo = make_repo(tmp_path_factory.mktemp("prop") / "r")
    async with trio.open_nursery() as nursery:
        engine = Engine(nursery=nursery)
        await warm_up(engine, repo)
        for ops in steps:
            for op, a, b in ops:
                apply_op(repo, op, a, b)
            result = await checkpoint(engine, repo)
            assert result["checkpoint"]["tree"] == oracle_tree(repo), (ops, result["stats"])
        await engine.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("kind", ["git", "plain"])
async def test_plain_and_git_folders_go_warm(watched_engine, tmp_path, kind):
    root = tmp_path / "w"
    if kind == "git":
        make_repo(root)
    else:
        root.mkdir()
        (root / "a.txt").write_text("a")
    await warm_up(watched_engine, root)
    (root / "b.txt").write_text("b")
    result = await checkpoint(watched_engine, root)
    assert result["stats"]["scan"] == "watch"
    assert result["checkpoint"]["tree"] == oracle_tree(root)


async def test_warm_checkpoints_open_no_repository(watched_engine, tmp_path, monkeypatch):
    # The worktree keeps its store (and HEAD) open: a warm checkpoint, clean or not, opens none.
    import pygit2

    repo = make_repo(tmp_path / "r")
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", str(linked))
    for path in (repo, linked):
        await warm_up(watched_engine, path)
    opened: list[str] = []
    real_init = pygit2.Repository.__init__

    def counting_init(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(str(path))
        real_init(self, path, *args, **kwargs)

    monkeypatch.setattr(pygit2.Repository, "__init__", counting_init)
    for index in range(3):
        for path in (repo, linked):
            (path / "README").write_text(f"readme {index}\n")
            changed = await checkpoint(watched_engine, path)
            clean = await checkpoint(watched_engine, path)
            assert changed["stats"]["scan"] == clean["stats"]["scan"] == "watch"
            assert changed["checkpoint"]["tree"] == clean["checkpoint"]["tree"] == oracle_tree(path)
            assert changed["checkpoint"]["base"] == git(path, "rev-parse", "HEAD")
    assert opened == []


async def test_the_kernels_watches_are_counted_after_folder_events_only(watched_engine, tmp_path):
    # Reading the kernel's list of watches costs a few microseconds a folder: not for a file written.
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)

    async def checks() -> int:
        status = await watched_engine.call("status", {})
        return status["counters"]["watcher.kernel_checks"]

    before = await checks()
    for index in range(5):
        (repo / "src" / "a.py").write_text(f"print({index})\n")
        result = await checkpoint(watched_engine, repo)
        assert result["stats"]["scan"] == "watch" and result["checkpoint"]["tree"] == oracle_tree(repo)
    assert await checks() == before
    (repo / "src" / "new").mkdir()
    (repo / "src" / "new" / "b.py").write_text("b\n")
    result = await checkpoint(watched_engine, repo)
    assert result["stats"]["scan"] == "watch" and result["checkpoint"]["tree"] == oracle_tree(repo)
    assert await checks() == before + 1
