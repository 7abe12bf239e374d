"""The everyday life of worktrees under a running daemon: moved, deleted, failing, none of it fatal.

A worktree moved or deleted after a warm checkpoint is noticed and shown as
``moved`` or ``gone`` with ``repair`` as the remedy; its idle reconciliation
or watcher failing is logged and makes that worktree cold; the daemon and
every other worktree go on answering.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
import trio
from daemon_helpers import Daemon, call, child_env, cli, ping
from oracle import oracle_tree
from repo_helpers import git, init_repo, write

from snapshotd.capture import worktree as worktree_mod
from snapshotd.capture.worktree import WorktreeCapture
from snapshotd.client.rpc import Client
from snapshotd.errors import NotFound, SnapshotdError
from snapshotd.settings import size_cap
from snapshotd.store.identity import Records, identify, locate


def warm_checkpoints(folder: Path, env: dict[str, str], *, force: bool = False) -> str:
    """Two checkpoints of ``folder`` (the second warm); its worktree id."""
    extra = ["--force"] if force else []
    first = cli("checkpoint", "--json", *extra, cwd=folder, env=env).json()["checkpoint"]
    write(folder / "a.txt", "edited\n")
    second = cli("checkpoint", "--json", cwd=folder, env=env).json()
    assert second["stats"]["scan"] == "watch"
    return first["worktree"]


def presence_of(socket: Path) -> dict[str, dict]:
    with Client(str(socket), timeout=10) as client:
        return {wt["id"]: wt for wt in client.call("worktrees")["worktrees"]}


@pytest.mark.needs("inotify")
def test_moved_deleted_and_renamed_worktrees_are_shown_as_such_and_the_daemon_stays(
    daemon: Daemon, tmp_path: Path
) -> None:
    env = child_env(daemon.socket)
    moved = init_repo(tmp_path / "moved", ("a.txt", "a\n"))
    deleted = init_repo(tmp_path / "deleted", ("a.txt", "a\n"))
    plain = tmp_path / "plain"
    write(plain / "a.txt", "a\n")
    bystander = init_repo(tmp_path / "bystander", ("a.txt", "a\n"))
    ids = {
        "moved": warm_checkpoints(moved, env),
        "deleted": warm_checkpoints(deleted, env),
        "plain": warm_checkpoints(plain, env, force=True),
    }
    warm_checkpoints(bystander, env)
    pid = ping(daemon.socket)["pid"]
    moved.rename(tmp_path / "moved2")
    shutil.rmtree(deleted)
    plain.rename(tmp_path / "plain2")

    def all_noticed() -> bool:
        shown = presence_of(daemon.socket)
        return all(shown[ids[name]].get("presence", "here") != "here" for name in ids)

    deadline = time.monotonic() + 20
    while not all_noticed():  # meanwhile the rest of the daemon answers
        assert time.monotonic() < deadline, presence_of(daemon.socket)
        assert ping(daemon.socket)["pid"] == pid, daemon.log_text()
        write(bystander / "a.txt", f"at {time.monotonic()}\n")
        done = call(daemon.socket, "checkpoint", {"path": str(bystander)})
        assert done["checkpoint"]["tree"] == oracle_tree(bystander)
        time.sleep(0.3)
    time.sleep(2 * worktree_mod.RECONCILE_IDLE_S)  # past the idle reconciliation that used to end the daemon
    assert ping(daemon.socket)["pid"] == pid
    shown = presence_of(daemon.socket)
    assert shown[ids["moved"]]["presence"] == "moved"
    assert shown[ids["deleted"]]["presence"] == "gone"
    assert shown[ids["plain"]]["presence"] in ("moved", "gone")
    for name in ids:
        assert "snapshotd repair" in shown[ids[name]]["problem"]
        assert not shown[ids[name]]["watching"]
    with pytest.raises(SnapshotdError, match="repair"):
        call(daemon.socket, "checkpoint", {"worktree": ids["deleted"]})
    human = cli("worktrees", cwd=bystander, env=env).stdout
    assert "gone: The worktree" in human and "moved: The worktree" in human
    # repair finds none of them without its new path, and lists them all: moved away and deleted alike.
    assert {item["worktree"] for item in call(daemon.socket, "repair", {})["gone"]} == set(ids.values())
    # Used at its new place, the moved worktree is itself again.
    again = call(daemon.socket, "checkpoint", {"path": str(tmp_path / "moved2")})["checkpoint"]
    assert again["worktree"] == ids["moved"] and again["tree"] == oracle_tree(tmp_path / "moved2")
    assert presence_of(daemon.socket)[ids["moved"]]["presence"] == "here"
    assert ping(daemon.socket)["pid"] == pid


@pytest.mark.needs("inotify")
def test_a_worktree_removed_and_added_again_at_its_path_is_shown_once_there(daemon: Daemon, tmp_path: Path) -> None:
    env = child_env(daemon.socket)
    main = init_repo(tmp_path / "main", ("a.txt", "a\n"))
    linked = tmp_path / "linked"
    git(main, "worktree", "add", "-q", "--detach", str(linked))
    old = warm_checkpoints(linked, env)
    other = tmp_path / "other"
    git(main, "worktree", "add", "-q", "--detach", str(other))
    deleted = warm_checkpoints(other, env)
    warm_checkpoints(main, env)
    git(main, "worktree", "remove", "--force", str(linked))
    shutil.rmtree(other)  # deleted by hand: git still has it, so it may be on a disk gone for now
    deadline = time.monotonic() + 20
    while [presence_of(daemon.socket)[key].get("presence") for key in (old, deleted)] != ["removed", "gone"]:
        assert time.monotonic() < deadline, presence_of(daemon.socket)
        time.sleep(0.2)
    removed = presence_of(daemon.socket)[old]["problem"]
    assert "removed with git" in removed and f"snapshotd forget {old}" in removed and "repair" not in removed
    status = cli("status", cwd=main, env=env).stdout.splitlines()
    assert status[-1].startswith("attention: 2 worktrees; 1 worktree not where recorded"), status
    assert status[-1].endswith("; 1 removed with git (`snapshotd forget ID` drops a record)"), status
    git(main, "worktree", "prune")  # git lets go of the one deleted by hand: removed with git now too
    assert presence_of(daemon.socket)[deleted]["presence"] == "removed"
    cli("forget", deleted, cwd=main, env=env)
    assert cli("status", cwd=main, env=env).stdout.splitlines()[-1] == (
        "ok: 1 worktree, all watched; 1 removed with git (`snapshotd forget ID` drops a record)"
    )
    git(main, "worktree", "add", "-q", "--detach", str(linked))
    new = call(daemon.socket, "checkpoint", {"path": str(linked)})["checkpoint"]
    assert new["worktree"] != old and new["tree"] == oracle_tree(linked)
    for method in ("worktrees", "status"):
        shown = [wt for wt in call(daemon.socket, method, {})["worktrees"] if wt["path"] == str(linked)]
        assert [(wt["id"], wt["presence"], wt["problem"]) for wt in shown] == [(new["worktree"], "here", None)]
    assert "attention" not in cli("status", cwd=main, env=env).stdout


@pytest.mark.needs("inotify")
async def test_a_failing_reconciliation_is_logged_and_makes_only_its_worktree_cold(
    tmp_path, nursery, monkeypatch, caplog
):
    monkeypatch.setattr(worktree_mod, "RECONCILE_IDLE_S", 0.2)
    monkeypatch.setattr(worktree_mod, "PRESENCE_CHECK_S", 0.1, raising=False)
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    counters: Counter[str] = Counter()
    capture = WorktreeCapture(
        identify(locate(str(repo)), Records(tmp_path / "home")), lock=trio.Lock(), counters=counters,
        size_cap=size_cap(None),
    )
    await capture.ensure_watch(nursery, lambda paths, overflow: None)
    assert (await capture.take()).stats.scan == "full"
    write(repo / "a.txt", "b\n")
    assert (await capture.take()).stats.scan == "watch"
    real_cold = worktree_mod.capture_cold

    async def broken(*args, **kwargs):  # the fault: the reconciliation's full scan fails unexpectedly
        raise RuntimeError("injected failure")

    monkeypatch.setattr(worktree_mod, "capture_cold", broken)
    with caplog.at_level(logging.ERROR, logger=worktree_mod.__name__):
        with trio.fail_after(10):
            while capture.watching:
                await trio.sleep(0.05)
    monkeypatch.setattr(worktree_mod, "capture_cold", real_cold)
    assert "injected failure" in caplog.text and "Traceback" in caplog.text
    assert counters["worktree_task_failures"] == 1
    assert "injected failure" in (capture.watch_error or "")
    cold = await capture.take()
    assert cold.stats.scan == "full" and cold.tree == oracle_tree(repo)
    capture.close()


async def test_a_capture_of_a_worktree_deleted_meanwhile_names_it_and_repair(tmp_path, nursery):
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    capture = WorktreeCapture(
        identify(locate(str(repo)), Records(tmp_path / "home")), lock=trio.Lock(), counters=Counter(),
        size_cap=size_cap(None),
    )
    await capture.ensure_watch(nursery, lambda paths, overflow: None)
    await capture.take()
    shutil.rmtree(repo)
    with pytest.raises(NotFound, match=r"no longer at .*snapshotd repair"):
        await capture.take()
    assert capture.to_wire()["presence"] == "gone"
    capture.close()


async def test_a_capture_of_a_worktree_deleted_and_made_anew_meanwhile_is_a_clear_not_found(tmp_path, monkeypatch):
    """Fault: the worktree is deleted while its cold capture runs, and made anew before anyone looks again.

    The folder made anew is another worktree (its git dir holds no id, or another), even when
    it was given the freed inode back: the capture is not_found naming the worktree, never an
    internal error, and the folder found anew is captured as itself.
    """
    from snapshotd.capture import core as core_mod

    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    capture = WorktreeCapture(
        identify(locate(str(repo)), Records(tmp_path / "home")), lock=trio.Lock(), counters=Counter(),
        size_cap=size_cap(None),
    )
    real_seed = core_mod._seed

    def deleted_then_made_anew(*args, **kwargs):  # type: ignore[no-untyped-def]
        shutil.rmtree(repo)
        try:
            return real_seed(*args, **kwargs)
        finally:
            init_repo(repo, ("a.txt", "a again\n"))

    monkeypatch.setattr(core_mod, "_seed", deleted_then_made_anew)
    with pytest.raises(NotFound, match=r"no longer at .*snapshotd repair"):
        await capture.take()
    monkeypatch.setattr(core_mod, "_seed", real_seed)
    anew = identify(locate(str(repo)), Records(tmp_path / "home"))
    assert anew.id != capture.info.id
    again = WorktreeCapture(anew, lock=trio.Lock(), counters=Counter(), size_cap=size_cap(None))
    assert (await again.take()).tree == oracle_tree(repo)  # and the folder found anew is captured as itself
    capture.close()
    again.close()


def test_a_git_that_could_not_start_in_a_gone_folder_is_the_worktree_s_doing_a_missing_file_elsewhere_is_not(tmp_path):
    from snapshotd.capture import presence
    from snapshotd.errors import GitError

    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    info = identify(locate(str(repo)), Records(tmp_path / "home"))
    try:
        raise GitError("could not start git: No such file or directory") from FileNotFoundError(2, "No such file")
    except GitError as exc:
        assert presence.went_missing(exc, info) == "git could not start there: No such file or directory"
    inside = FileNotFoundError(2, "No such file", str(repo / ".git" / "index"))
    assert presence.went_missing(inside, info) == f"No such file or directory: {repo / '.git' / 'index'}"
    assert presence.went_missing(FileNotFoundError(2, "No such file", "/etc/elsewhere"), info) is None
    assert presence.went_missing(PermissionError(13, "denied", str(repo)), info) is None
    try:  # git's start failed in a nursery: the cause is inside an exception group
        raise GitError("could not start git") from ExceptionGroup("spawn", [FileNotFoundError(2, "No such file")])
    except GitError as exc:
        assert presence.went_missing(exc, info) == "git could not start there: No such file or directory"
    moved = identify(locate(str(init_repo(tmp_path / "r2", ("a.txt", "a\n")))), Records(tmp_path / "home"))
    at_old_place = FileNotFoundError(2, "No such file", str(repo / ".git"))
    assert presence.went_missing(at_old_place, moved) is None
    assert presence.went_missing(at_old_place, moved, info) == f"No such file or directory: {repo / '.git'}"


def test_a_git_run_in_a_folder_gone_meanwhile_names_the_folder_not_an_internal_git_error(tmp_path):
    from snapshotd.git.process import GitTarget, run_git_sync

    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    gone = tmp_path / "gone"
    with pytest.raises(NotFound, match=r"git could not start in .*gone: that folder is gone.*snapshotd repair"):
        run_git_sync(GitTarget(git_dir=str(repo / ".git"), work_tree=str(gone)), ["status", "--porcelain"])
    assert run_git_sync(GitTarget(git_dir=str(repo / ".git"), work_tree=str(repo)), ["rev-parse", "HEAD"])


async def test_a_cold_worktree_made_anew_while_its_work_failed_is_not_found_whatever_the_error(tmp_path, monkeypatch):
    """Fault: a cold worktree (no watch) is deleted and made anew while its capture fails for a reason that
    names no missing path (a ref's lock, say); it is not the worktree the request found, so not_found."""
    from snapshotd.capture import core as core_mod
    from snapshotd.errors import GitError

    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    capture = WorktreeCapture(
        identify(locate(str(repo)), Records(tmp_path / "home")), lock=trio.Lock(), counters=Counter(),
        size_cap=size_cap(None),
    )
    await capture.ensure_watch(None, lambda paths, overflow: None)  # cold: this engine does not watch
    await capture.take()

    def made_anew_then_failed(*args, **kwargs):  # type: ignore[no-untyped-def]
        shutil.rmtree(repo)
        init_repo(repo, ("a.txt", "a again\n"))
        raise GitError("Could not update refs/snapshotd/x: failed to lock file for writing: ")

    monkeypatch.setattr(core_mod, "_seed", made_anew_then_failed)
    with pytest.raises(NotFound, match=r"no longer at .*snapshotd repair"):
        await capture.take()
    capture.close()


def test_a_worktree_made_anew_on_the_freed_inode_is_not_the_one_opened(tmp_path):
    """Fault: the filesystem gives a folder made anew the inode of the one deleted (ext4 does, often);
    the presence check must still find the worktree it opened gone, by the id its git dir no longer holds."""
    from snapshotd.capture import presence

    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    info = identify(locate(str(repo)), Records(tmp_path / "home"))
    assert presence.check(info, presence.root_id(str(repo))) is None
    shutil.rmtree(repo)
    init_repo(repo, ("a.txt", "a again\n"))
    reused = presence.root_id(str(repo))  # as if the freed inode was handed back
    vanished = presence.check(info, reused)
    assert vanished is not None and vanished.how == presence.GONE
    assert f"no longer at {repo}" in vanished.message
