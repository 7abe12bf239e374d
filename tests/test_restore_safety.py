"""Restore and revert never lose work: a path written meanwhile, a failure part-way, a stale capture.

Through ``Engine.call`` as a client would, and against a real daemon on a
small disk. Faults are injected only where nothing else can make them
happen on cue: between two paths of an apply, and in the watcher's report.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import child_env, cli, running_daemon
from oracle import oracle_tree
from repo_helpers import git, worktree_listing

from snapshotd.capture.watch import Watcher
from snapshotd.errors import FilesystemError, NotFound
from snapshotd.restore import fileops as restore_mod
from snapshotd.restore.apply import Applier


async def checkpoint(engine: Any, path: Path, **params: Any) -> dict[str, Any]:
    return (await engine.call("checkpoint", {"path": str(path), **params}))["checkpoint"]


def make_repo(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    git(root, "init", "-q")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def files_as_they_are(root: Path) -> dict[str, tuple[Any, ...]]:
    """:func:`worktree_listing` without folders' mtimes (a file put back touches its folder)."""
    return {rel: entry[:2] if entry[0] == "dir" else entry for rel, entry in worktree_listing(root).items()}


def fsck_clean(repo: Path) -> None:
    out = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(repo), "fsck", "--no-dangling"], capture_output=True, text=True)
    assert out.returncode == 0 and "error" not in out.stderr.lower(), out.stderr


# ---------------------------------------------------------------------------
# paths that match nothing


async def test_restore_of_a_path_that_matches_nothing_is_not_found(engine, tmp_path):
    wt = make_repo(tmp_path / "wt", {"a.txt": "a\n", ".gitignore": "*.log\n"})
    cp = await checkpoint(engine, wt)
    (wt / "a.txt").write_text("edited\n")
    before = worktree_listing(wt)
    with pytest.raises(NotFound) as info:
        await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt), "paths": [str(wt / "a.txt"), "nope"]})
    assert "'nope'" in info.value.message and info.value.data["paths"] == ["nope"]
    assert worktree_listing(wt) == before
    # A path that exists only on disk (ignored) or only in the checkpoint is fine.
    (wt / "x.log").write_text("ignored\n")
    result = await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt), "paths": ["x.log", "a.txt"]})
    assert result["written"] == ["a.txt"]


# ---------------------------------------------------------------------------
# a write made during the apply


def write_on_first_path(monkeypatch: pytest.MonkeyPatch, method: str, target: Path, data: bytes) -> list[str]:
    """When the applier reaches its first path, another thread writes ``target`` (and is waited for)."""
    real = getattr(Applier, method)
    seen: list[str] = []

    def writer() -> None:
        target.write_bytes(data)

    def first_then_real(self: Any, path: str, *args: Any) -> None:
        if not seen:
            thread = threading.Thread(target=writer)
            thread.start()
            thread.join()
        seen.append(path)
        real(self, path, *args)

    monkeypatch.setattr(Applier, method, first_then_real)
    return seen


@pytest.mark.parametrize("kind", ["git", "plain"])
async def test_a_write_made_during_a_restore_is_left_alone(engine, tmp_path, monkeypatch, kind):
    wt = tmp_path / "wt"
    wt.mkdir()
    if kind == "git":
        git(wt, "init", "-q")
    for i in range(3000):
        (wt / f"d{i % 30}").mkdir(exist_ok=True)
        (wt / f"d{i % 30}" / f"f{i}.txt").write_text(f"{i} at A\n")
    cp = await checkpoint(engine, wt)
    for i in range(3000):
        (wt / f"d{i % 30}" / f"f{i}.txt").write_text(f"{i} edited\n")
    last_path = sorted(f"d{i % 30}/f{i}.txt" for i in range(3000))[-1]  # the plan's order
    last = wt / last_path
    seen = write_on_first_path(monkeypatch, "write", last, b"an autosave during the restore\n")

    result = await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert len(seen) == 3000 and seen[-1] == last_path
    assert last.read_bytes() == b"an autosave during the restore\n"
    assert result["skipped"] == [{"path": last_path, "reason": "changed on disk while restoring"}]
    assert len(result["written"]) == 2999
    assert (wt / "d0" / "f0.txt").read_text() == "0 at A\n"


async def test_a_write_made_during_a_revert_is_left_alone(engine, tmp_path, monkeypatch):
    wt = make_repo(tmp_path / "wt", {"a.txt": "a\n", "b.txt": "b\n", "z.txt": "z\n"})
    start = await checkpoint(engine, wt, session="agent")
    for name in ("a.txt", "b.txt", "z.txt"):
        (wt / name).write_text(f"the agent's {name}\n")
    end = await checkpoint(engine, wt, session="agent")
    write_on_first_path(monkeypatch, "write", wt / "z.txt", b"a person's edit\n")

    result = await engine.call("revert", {"from": start["id"], "to": end["id"], "path": str(wt)})
    assert result["written"] == ["a.txt", "b.txt"]
    assert result["conflicts"] == [{"path": "z.txt", "reason": "changed on disk while restoring"}]
    assert (wt / "z.txt").read_text() == "a person's edit\n"


async def test_a_file_recreated_before_its_delete_is_left_alone(engine, tmp_path, monkeypatch):
    wt = make_repo(tmp_path / "wt", {"a.txt": "a\n"})
    cp = await checkpoint(engine, wt)
    (wt / "new1.txt").write_text("made since\n")
    (wt / "new2.txt").write_text("made since\n")
    write_on_first_path(monkeypatch, "delete", wt / "new2.txt", b"rewritten meanwhile\n")
    result = await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert result["deleted"] == ["new1.txt"]
    assert (wt / "new2.txt").read_text() == "rewritten meanwhile\n"


# ---------------------------------------------------------------------------
# a failure part-way


async def test_a_restore_that_fails_part_way_changes_nothing(engine, tmp_path, monkeypatch):
    wt = make_repo(tmp_path / "wt", {f"f{i}.txt": f"{i} at A\n" for i in range(6)})
    (wt / "gone").mkdir()
    (wt / "gone" / "g.txt").write_text("at A\n")
    cp = await checkpoint(engine, wt)
    for i in range(6):
        (wt / f"f{i}.txt").write_text(f"{i} edited\n")
    (wt / "gone" / "g.txt").unlink()
    (wt / "gone").rmdir()
    (wt / "made").mkdir()
    (wt / "made" / "new.txt").write_text("made since\n")
    os.chmod(wt / "f1.txt", 0o755)
    before = files_as_they_are(wt)
    real = restore_mod.write_all
    calls = {"n": 0}

    def full_disk_on_the_fourth(fd: int, data: bytes) -> None:
        if data.endswith(b" at A\n"):
            calls["n"] += 1
            if calls["n"] == 4:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(restore_mod, "write_all", full_disk_on_the_fourth)
    with pytest.raises(FilesystemError) as info:
        await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert calls["n"] == 4
    assert "disk is full" in info.value.message and "Nothing was changed" in info.value.message
    assert files_as_they_are(wt) == before
    assert not [p for p in os.listdir(wt) if p.startswith(restore_mod.TEMP_PREFIX)]
    fsck_clean(wt)
    monkeypatch.undo()
    await engine.call("restore", {"checkpoint": cp["id"], "path": str(wt)})
    assert oracle_tree(wt) == cp["tree"]


# ---------------------------------------------------------------------------
# a safety checkpoint that is not current


async def test_a_stale_warm_capture_never_becomes_the_safety_checkpoint(watched_engine, tmp_path, monkeypatch):
    wt = make_repo(tmp_path / "wt", {"a.txt": "a\n", "b.txt": "b\n"})
    first = await checkpoint(watched_engine, wt)
    (wt / "a.txt").write_text("edited once\n")
    second = await checkpoint(watched_engine, wt)
    assert second["tree"] != first["tree"]
    # The watcher loses what it saw (as when its watches are dropped): the warm tree is stale.
    real_take = Watcher.take
    monkeypatch.setattr(Watcher, "take", lambda self: (real_take(self), (set(), set()))[1])
    (wt / "a.txt").write_text("the newest edit\n")
    assert (await checkpoint(watched_engine, wt))["tree"] == second["tree"], "the fault was not injected"
    newest = oracle_tree(wt)

    result = await watched_engine.call("restore", {"checkpoint": first["id"], "path": str(wt)})
    assert result["safety_checkpoint"]["tree"] == newest
    assert (wt / "a.txt").read_text() == "a\n"
    assert watched_engine.counters["safety_recaptures"] == 1


# ---------------------------------------------------------------------------
# a nearly full disk, with a real daemon


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_never_loses_the_newest_edit(small_disk: Path, tmp_path: Path) -> None:
    sock = tmp_path / "run" / "s.sock"
    env = child_env(sock)
    wt = make_repo(small_disk / "wt", {"a.txt": "first\n", "b.txt": "b\n"})
    with running_daemon(sock, tmp_path / "daemon.log") as daemon:
        first = cli("checkpoint", "--json", wt, env=env).json()["checkpoint"]
        (wt / "a.txt").write_text("second\n")
        cli("checkpoint", "--json", wt, env=env)
        filler = small_disk / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
        (wt / "a.txt").write_text("the newest edit " + os.urandom(8).hex() + "\n")
        newest = (wt / "a.txt").read_text()

        failed = cli("--json", "checkpoint", wt, env=env, code=1).json()["error"]
        assert failed.get("data", {}).get("kind") == "filesystem", (failed, daemon.log_text()[-3000:])
        assert "disk is full" in failed["message"] and str(small_disk) in failed["message"], failed
        restored = cli("--json", "restore", first["id"], "--yes", cwd=wt, env=env, code=None)
        if restored.code == 0:
            # It went ahead only with the newest edit in its safety checkpoint.
            safety = restored.json()["safety_checkpoint"]
            shown = git(wt, "show", f"{safety['id']}:a.txt")
            assert shown == newest.rstrip("\n")
        else:
            error = restored.json()["error"]
            assert error.get("data", {}).get("kind") == "filesystem", (error, daemon.log_text()[-3000:])
            assert "disk is full" in error["message"] and "othing was changed" in error["message"]
            assert str(small_disk) in error["message"]
            assert (wt / "a.txt").read_text() == newest
        assert cli("ping", "--json", env=env).json()["pid"] == daemon.proc.pid
        filler.unlink()
        fsck_clean(wt)
        # With room again, everything works and the newest edit is kept.
        again = cli("--json", "restore", first["id"], "--yes", cwd=wt, env=env).json()
        if restored.code != 0:
            assert git(wt, "show", f"{again['safety_checkpoint']['id']}:a.txt") == newest.rstrip("\n")
        assert (wt / "a.txt").read_text() == "first\n"


def test_on_a_full_disk_a_dry_run_asks_for_no_safety_checkpoint_and_diff_says_the_disk_is_full(
    small_disk: Path, tmp_path: Path
) -> None:
    """Embedded (every capture cold): the capture's own error, worded as every disk error is."""
    env = child_env(tmp_path / "run" / "s.sock")
    wt = make_repo(small_disk / "wt", {"a.txt": "first\n"})
    first = cli("--embedded", "--json", "checkpoint", wt, env=env).json()["checkpoint"]
    (wt / "a.txt").write_text("second " + os.urandom(8).hex() + "\n")
    subprocess.run(["dd", "if=/dev/zero", f"of={small_disk / 'filler'}", "bs=64k"], capture_output=True)
    before = files_as_they_are(wt)
    dry = cli("--embedded", "--json", "restore", first["id"], "--dry-run", cwd=wt, env=env, code=1).json()["error"]
    assert dry["data"]["kind"] == "filesystem" and "disk is full" in dry["message"], dry
    assert "safety" not in dry["message"], dry
    diff = cli("--embedded", "--json", "diff", first["id"], cwd=wt, env=env, code=1).json()["error"]
    assert diff["data"]["kind"] == "filesystem", diff
    assert "disk is full" in diff["message"] and str(wt) in diff["message"], diff
    verify = cli("--embedded", "--json", "verify", wt, env=env, code=1).json()["error"]
    assert verify["data"]["kind"] == "filesystem" and "disk is full" in verify["message"], verify
    assert files_as_they_are(wt) == before


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_a_folder_the_user_cannot_write_refuses_the_restore_and_changes_nothing(shared: Path) -> None:
    """As an unprivileged user: a restore that meets EACCES says which path and writes nothing."""
    home = shared / "home"
    wt = make_repo(home / "wt", {"a.txt": "first\n", "locked/b.txt": "first\n"})
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(home)], check=True)
    env = child_env(HOME=str(home), SNAPSHOTD_HOME=str(home / "sd"), XDG_CONFIG_HOME=str(home / ".config"))
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-m", "snapshotd"]
    drop += ["--embedded", "--json"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*drop, *args], cwd=wt, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)

    first = run("checkpoint", str(wt))
    assert first.returncode == 0, first.stderr
    first_id = json.loads(first.stdout)["checkpoint"]["id"]
    for rel in ("a.txt", "locked/b.txt"):
        (wt / rel).write_text("the newest edit\n")
    before = files_as_they_are(wt)
    os.chmod(wt / "locked", 0o555)  # its owner may no longer create or replace files in it
    try:
        restored = run("restore", first_id, "--yes")
    finally:
        os.chmod(wt / "locked", 0o755)
    assert restored.returncode == 1, (restored.stdout, restored.stderr)
    error = json.loads(restored.stdout)["error"]
    assert error["data"]["kind"] == "filesystem", error
    assert "permission denied" in error["message"] and "locked" in error["message"], error
    assert files_as_they_are(wt) == before
    assert (wt / "a.txt").read_text() == (wt / "locked" / "b.txt").read_text() == "the newest edit\n"
    fsck_clean(wt)
