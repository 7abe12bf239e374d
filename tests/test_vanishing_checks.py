"""A worktree deleted while it is being checked is ``not_found`` naming it, never another user's.

The ownership rule (:mod:`snapshotd.git.ownership`) and the walk that finds a
worktree look at paths that existed a moment before; ``rm -rf`` (an agent
server deletes worktrees all day) can take one between the look and the
check. Each test deletes the worktree at that moment, from inside the call
that looks at the path, and expects ``not_found`` naming the worktree: an
ownership refusal ("belongs to an owner it cannot read") or "not a folder"
would send the user after a problem they do not have.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pygit2
import pytest
import trio
from repo_helpers import git, init_repo

from snapshotd.engine.core import Engine
from snapshotd.errors import NotFound, SnapshotdError
from snapshotd.git import ownership
from snapshotd.git.repository import open_repository
from snapshotd.store import identity
from snapshotd.store.identity import Records, check_still_trusted, identify, locate


class _Stand_in:
    """A module (``os``, ``os.path``) as one module of snapshotd sees it, some functions replaced.

    The rest of the process, the test's own calls included, keeps the real ones.
    """

    def __init__(self, real: ModuleType | _Stand_in, **replaced: object) -> None:
        self._real, self._replaced = real, replaced

    def __getattr__(self, attr: str) -> object:
        return self._replaced[attr] if attr in self._replaced else getattr(self._real, attr)


def deleting_after(real: Callable[..., object], trigger: Path, doomed: Path, met: list[str], *, before: bool) -> Callable[..., object]:
    """``real``, except that its first call on ``trigger`` deletes ``doomed`` (``before`` or after it looks)."""

    def deleting(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        hit = os.fspath(path) == str(trigger) and not met
        if hit:
            met.append(os.fspath(path))
            if before:
                shutil.rmtree(doomed)
        result = real(path, *args, **kwargs)
        if hit and not before:
            shutil.rmtree(doomed)
        return result

    return deleting


def delete_on(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, trigger: Path, doomed: Path) -> list[str]:
    """Make ``module``'s ``os.<name>`` of the path ``trigger`` first delete ``doomed`` (once); the calls it met."""
    met: list[str] = []
    replaced = deleting_after(getattr(os, name), trigger, doomed, met, before=True)
    monkeypatch.setattr(module, "os", _Stand_in(os, **{name: replaced}))
    return met


def linked_worktree(tmp_path: Path) -> tuple[Path, Path]:
    """A repository and a linked worktree of it; the worktree's path and its admin folder."""
    main = init_repo(tmp_path / "main", ("a.txt", "a\n"))
    linked = tmp_path / "linked"
    git(main, "worktree", "add", "-q", "-b", "side", str(linked))
    return linked, main / ".git" / "worktrees" / "linked"


def assert_not_found_naming(caught: pytest.ExceptionInfo[SnapshotdError], worktree: Path) -> None:
    assert isinstance(caught.value, NotFound), caught.value
    assert str(worktree) in caught.value.message
    assert "not yours" not in caught.value.message


def test_a_git_folder_deleted_as_its_owner_is_checked_is_not_found(tmp_path, monkeypatch):
    """Fault: ``rm -rf`` takes ``.git`` after the walk saw ``.git/HEAD`` and before its owner is read."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    met = delete_on(monkeypatch, ownership, "lstat", repo / ".git", repo / ".git")
    with pytest.raises(SnapshotdError) as caught:
        locate(str(repo))
    assert met
    assert_not_found_naming(caught, repo)


@pytest.mark.parametrize("vanishing", [".git file", "admin folder", "worktree"])
def test_a_linked_worktree_deleted_as_its_owner_is_checked_is_not_found(tmp_path, monkeypatch, vanishing):
    """Fault: the ``.git`` file, the admin folder or the whole worktree goes as its owner is read."""
    linked, admin = linked_worktree(tmp_path)
    trigger, doomed = {
        ".git file": (linked / ".git", linked),
        "admin folder": (admin, admin),
        "worktree": (linked, linked),
    }[vanishing]
    if vanishing == ".git file":
        doomed = linked  # rm -rf of the worktree: the .git file first
    met = delete_on(monkeypatch, ownership, "lstat", trigger, doomed)
    with pytest.raises(SnapshotdError) as caught:
        locate(str(linked))
    assert met
    assert_not_found_naming(caught, linked)


def test_a_store_deleted_between_looking_and_checking_its_owner_is_not_found(tmp_path, monkeypatch):
    """Fault: the git dir's ``config`` is there when looked for and gone when its owner is read."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    met = delete_on(monkeypatch, ownership, "lstat", repo / ".git" / "config", repo / ".git")
    with pytest.raises(SnapshotdError) as caught:
        open_repository(str(repo / ".git"))
    assert met
    assert_not_found_naming(caught, repo)


def test_an_open_worktree_deleted_while_asked_for_by_id_is_not_found(tmp_path, monkeypatch):
    """Fault: a worktree already open, asked for by its id, has its git dir deleted as the rule runs again."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    info = identify(locate(str(repo)), Records(tmp_path / "home"))
    met = delete_on(monkeypatch, ownership, "lstat", repo / ".git", repo)
    with pytest.raises(SnapshotdError) as caught:
        check_still_trusted(info)
    assert met
    assert_not_found_naming(caught, repo)


async def test_a_worktree_deleted_just_after_it_was_found_to_exist_is_not_found_not_a_file(tmp_path, monkeypatch):
    """Fault: the folder asked about is deleted just after the first look found it (the walk's ``exists``
    or ``stat``); a second look must not call the path that is gone "not a folder"."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    met: list[str] = []
    after = {"before": False}
    path = _Stand_in(os.path, exists=deleting_after(os.path.exists, repo, repo, met, **after))
    monkeypatch.setattr(identity, "os", _Stand_in(os, path=path, stat=deleting_after(os.stat, repo, repo, met, **after)))
    engine = Engine()
    try:
        with pytest.raises(SnapshotdError) as caught:
            await engine.call("checkpoint", {"path": str(repo)})
    finally:
        await engine.aclose()
    assert met
    assert_not_found_naming(caught, repo)


@pytest.mark.parametrize("method", ["checkpoint", "list"])
async def test_a_request_whose_worktree_goes_mid_check_is_not_found_naming_it(tmp_path, monkeypatch, method):
    """The soak's case end to end: ``rm -rf`` takes ``.git`` while a request checks its owner."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    engine = Engine()
    try:
        await engine.call("checkpoint", {"path": str(repo)})
        met = delete_on(monkeypatch, ownership, "lstat", repo / ".git", repo / ".git")
        with pytest.raises(SnapshotdError) as caught:
            await engine.call(method, {"path": str(repo)})
        assert met
        assert_not_found_naming(caught, repo)
        shutil.rmtree(repo)
        init_repo(repo, ("a.txt", "made anew\n"))
        done = await engine.call("checkpoint", {"path": str(repo)})  # and the daemon goes on with the new one
        assert done["checkpoint"]["tree"]
    finally:
        await engine.aclose()


async def test_a_worktree_whose_git_folder_goes_before_its_store_is_opened_is_not_found(tmp_path, monkeypatch):
    """Fault: ``.git`` is there when the worktree is found and gone when a read opens its store."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    engine = Engine()
    try:
        await engine.call("checkpoint", {"path": str(repo)})
        met: list[str] = []
        lexists = deleting_after(os.path.lexists, repo / ".git", repo / ".git", met, before=True)
        monkeypatch.setattr(ownership, "os", _Stand_in(os, path=_Stand_in(os.path, lexists=lexists)))
        with pytest.raises(SnapshotdError) as caught:
            await engine.call("list", {"path": str(repo)})
    finally:
        await engine.aclose()
    assert met
    assert_not_found_naming(caught, repo)


def test_a_store_deleted_between_its_check_and_its_opening_is_not_found(tmp_path, monkeypatch):
    """Fault: the git dir passes the ownership rule and is gone when libgit2 opens it."""
    from snapshotd.git import repository as repository_mod

    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    real_open = repository_mod.LibgitRepository

    def deleted_first(*args, **kwargs):  # type: ignore[no-untyped-def]
        shutil.rmtree(repo / ".git")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(repository_mod, "LibgitRepository", deleted_first)
    with pytest.raises(SnapshotdError) as caught:
        open_repository(str(repo / ".git"))
    assert_not_found_naming(caught, repo)


def _loose(repo: Path, oid: str) -> Path:
    return repo / ".git" / "objects" / oid[:2] / oid[2:]


@pytest.mark.parametrize("deleted", ["the captured tree", "every object"])
async def test_a_store_losing_objects_between_capture_and_record_is_a_clear_error(tmp_path, deleted, monkeypatch):
    """Fault: ``rm -rf`` of the worktree is under way in ``.git/objects`` after the tree was captured and
    before its checkpoint is recorded: ``not_found`` once the git folder is no repository any more, and
    with one object gone, the sentence naming the repository and the object (never an internal error)."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    engine = Engine()
    try:
        await engine.call("checkpoint", {"path": str(repo)})
        (repo / "a.txt").write_text("changed\n")
        from snapshotd.engine import core as core_mod

        record_many = core_mod.record_many

        def record_after_deleting(info, tickets, tree, **kwargs):  # type: ignore[no-untyped-def]
            if deleted == "every object":
                shutil.rmtree(repo / ".git" / "objects")
            else:
                _loose(repo, tree).unlink()
            return record_many(info, tickets, tree, **kwargs)

        monkeypatch.setattr(core_mod, "record_many", record_after_deleting)
        with pytest.raises(SnapshotdError) as caught:
            await engine.call("checkpoint", {"path": str(repo)})
    finally:
        await engine.aclose()
    assert str(repo) in caught.value.message
    if deleted == "every object":
        assert_not_found_naming(caught, repo)
    else:
        assert caught.value.kind == "git_error" and "lacks the object" in caught.value.message


def _locks(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.lock"))


@pytest.mark.parametrize("moved_at", ["set_target", "lock_ref"])
async def test_a_repository_moved_while_its_ref_is_updated_leaves_no_lock_and_no_folder_behind(
    tmp_path, monkeypatch, watched_engine, moved_at
):
    """Fault: ``mv`` of the worktree while the checkpoint's ref is locked. libgit2 renames (or on failure
    removes) the lock by its old path: the lock stayed in the moved ``.git`` and refused that session's
    checkpoints there for 30 s, and the update was retried at the old path, making ``.git/refs`` anew there.
    A move just after the lock was taken, before the daemon opened it, left it too (the lifecycle soak)."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    moved = tmp_path / "r2"
    await watched_engine.call("checkpoint", {"path": str(repo), "session": "s"})
    (repo / "a.txt").write_text("b\n")
    met: list[str] = []
    real = getattr(pygit2.transaction.ReferenceTransaction, moved_at)

    def moving_first(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if moved_at == "lock_ref":
            done = real(self, *args, **kwargs)
        if not met:
            met.append("moved")
            repo.rename(moved)
        return done if moved_at == "lock_ref" else real(self, *args, **kwargs)

    monkeypatch.setattr(pygit2.transaction.ReferenceTransaction, moved_at, moving_first)
    with pytest.raises(SnapshotdError) as caught:
        await watched_engine.call("checkpoint", {"path": str(repo), "session": "s"})
    assert met
    assert_not_found_naming(caught, repo)
    assert not repo.exists()  # nothing made anew where the worktree was
    assert _locks(moved / ".git") == []
    done = await watched_engine.call("checkpoint", {"path": str(moved), "session": "s"})
    assert done["checkpoint"]["worktree"] == caught.value.message.split()[2]  # its id, named in the refusal
    assert git(moved, "cat-file", "-p", f"{done['checkpoint']['tree']}:a.txt").strip() == "b"


async def test_a_store_losing_its_refs_before_the_record_is_not_found_and_not_made_anew(tmp_path, monkeypatch):
    """Fault: ``rm -rf`` of the worktree has taken ``.git/refs`` (``HEAD`` and the objects still there)
    between the capture and the record. The update made the ref's folders anew and the checkpoint was
    "recorded" in the half-deleted repository; now it is ``not_found`` naming the worktree."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    engine = Engine()
    try:
        await engine.call("checkpoint", {"path": str(repo), "session": "s"})
        (repo / "a.txt").write_text("changed\n")
        from snapshotd.engine import core as core_mod

        record_many = core_mod.record_many

        def record_after_deleting_refs(info, tickets, tree, **kwargs):  # type: ignore[no-untyped-def]
            shutil.rmtree(repo / ".git" / "refs")
            return record_many(info, tickets, tree, **kwargs)

        monkeypatch.setattr(core_mod, "record_many", record_after_deleting_refs)
        with pytest.raises(SnapshotdError) as caught:
            await engine.call("checkpoint", {"path": str(repo), "session": "s"})
    finally:
        await engine.aclose()
    assert_not_found_naming(caught, repo)
    assert not (repo / ".git" / "refs").exists()


@pytest.mark.parametrize("part", ["refs", "objects"])
async def test_a_store_opened_once_it_lost_part_of_itself_is_not_found(tmp_path, part):
    """``rm -rf`` of the worktree under way has taken its git folder's ``refs`` or ``objects`` (not yet
    ``HEAD``: without it the folder is no repository, for git either) when a read opens the store:
    libgit2's "Repository not found" was an internal error."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    engine = Engine()
    try:
        await engine.call("checkpoint", {"path": str(repo)})
        shutil.rmtree(repo / ".git" / part)
        with pytest.raises(SnapshotdError) as caught:
            await engine.call("list", {"path": str(repo)})
    finally:
        await engine.aclose()
    assert_not_found_naming(caught, repo)


async def test_a_checkpoint_meeting_its_worktree_at_the_old_place_names_the_path_it_asked_about(tmp_path, monkeypatch):
    """Fault: the worktree moved mid-request, and the record opens its store where it was a moment before
    (a request that found the old place captures for this one too, and the next one found it here again).
    The ``not_found`` named the old path, which the client never asked about; it names the path given,
    and what was missing where."""
    from snapshotd.engine import core as core_mod

    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    moved = tmp_path / "r2"
    engine = Engine()
    try:
        await engine.call("checkpoint", {"path": str(repo)})
        (stale,) = [state.info for state in engine.worktrees.values()]
        repo.rename(moved)
        (moved / "a.txt").write_text("b\n")
        record_many = core_mod.record_many
        met: list[str] = []

        def recorded_at_the_old_place(info, tickets, tree, **kwargs):  # type: ignore[no-untyped-def]
            met.append(info.path)
            return record_many(stale, tickets, tree, **kwargs)

        monkeypatch.setattr(core_mod, "record_many", recorded_at_the_old_place)
        with pytest.raises(SnapshotdError) as caught:
            await engine.call("checkpoint", {"path": str(moved)})
    finally:
        await engine.aclose()
    assert met == [str(moved)]
    assert isinstance(caught.value, NotFound), caught.value
    assert str(moved) in caught.value.message, caught.value.message
    assert f"{repo}/.git" in caught.value.message  # what was missing, where


async def test_a_request_finding_the_place_a_worktree_just_left_keeps_it_where_it_went(tmp_path, monkeypatch):
    """Fault: a request found the worktree at ``r`` and it moved to ``r2`` before the request was done
    opening it, while another request already follows it at ``r2``. The late one pointed the worktree
    back at ``r``: the captures it shares with ``r2``'s requests then looked for a folder that is gone.
    Now the late request is ``not_found`` naming ``r``, and the worktree stays at ``r2``."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    moved = tmp_path / "r2"
    engine = Engine()
    try:
        first = await engine.call("checkpoint", {"path": str(repo)})
        real_identify = engine.registry.identities.identify
        met: list[str] = []

        def moved_once_identified(located):  # type: ignore[no-untyped-def]
            info = real_identify(located)
            if located.root == str(repo) and not met:
                met.append(located.root)
                repo.rename(moved)
                assert engine.worktrees[info.id].info.path == str(repo)
                engine.worktrees[info.id].capture.info = real_identify(identity.locate(str(moved)))
            return info

        monkeypatch.setattr(engine.registry.identities, "identify", moved_once_identified)
        (repo / "a.txt").write_text("b\n")
        with pytest.raises(SnapshotdError) as caught:
            await engine.call("checkpoint", {"path": str(repo)})
        assert met
        assert_not_found_naming(caught, repo)
        assert engine.worktrees[first["checkpoint"]["worktree"]].info.path == str(moved)
        done = await engine.call("checkpoint", {"path": str(moved)})
    finally:
        await engine.aclose()
    assert done["checkpoint"]["worktree"] == first["checkpoint"]["worktree"]
    assert git(moved, "cat-file", "-p", f"{done['checkpoint']['tree']}:a.txt").strip() == "b"


async def test_a_checkpoint_whose_objects_go_once_its_ref_is_updated_names_the_repository(tmp_path, monkeypatch):
    """Fault: ``rm -rf`` of the worktree takes the objects in ``.git/objects`` (the folder, ``HEAD`` and
    ``refs`` still there) just after the session's ref was moved, before the checkpoint is read back.
    The answer was "No checkpoint ID exists.", naming no worktree; now it is the sentence naming the
    repository and the missing object, as for a capture."""
    from snapshotd.store import checkpoints

    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    engine = Engine()
    try:
        await engine.call("checkpoint", {"path": str(repo), "session": "s"})
        (repo / "a.txt").write_text("changed\n")
        real_swap = checkpoints.Store.swap
        met: list[str] = []

        def objects_gone_after(self, name, new, expected):  # type: ignore[no-untyped-def]
            real_swap(self, name, new, expected)
            met.append(name)
            for fan_out in (repo / ".git" / "objects").iterdir():
                if len(fan_out.name) == 2:
                    shutil.rmtree(fan_out)

        monkeypatch.setattr(checkpoints.Store, "swap", objects_gone_after)
        with pytest.raises(SnapshotdError) as caught:
            await engine.call("checkpoint", {"path": str(repo), "session": "s"})
    finally:
        await engine.aclose()
    assert met
    assert caught.value.kind == "git_error", caught.value
    assert str(repo) in caught.value.message and "lacks the object" in caught.value.message


async def test_a_capture_shared_across_a_move_is_recorded_where_the_worktree_went(tmp_path):
    """A request finds the worktree at ``r`` and waits for its lock; the worktree moves to ``r2`` and a
    second request finds it there. The first one to get the lock captures for both (``batch.py``), and
    recorded in the store where the worktree had been when it asked: both failed, the second about a
    path it never gave. Now the record is made where the worktree is, and both get their checkpoint."""
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    moved = tmp_path / "r2"
    engine = Engine()
    answers: dict[str, dict] = {}

    async def checkpoint(path: Path, session: str) -> None:
        answers[session] = await engine.call("checkpoint", {"path": str(path), "session": session})

    try:
        await engine.call("checkpoint", {"path": str(repo), "session": "old"})
        (state,) = engine.worktrees.values()
        (repo / "a.txt").write_text("b\n")
        async with trio.open_nursery() as nursery, state.lock:  # held, so both requests queue for one capture
            nursery.start_soon(checkpoint, repo, "old")
            while len(state.queue) < 1:
                await trio.sleep(0.01)
            repo.rename(moved)
            nursery.start_soon(checkpoint, moved, "new")
            while len(state.queue) < 2:
                await trio.sleep(0.01)
    finally:
        await engine.aclose()
    assert answers["old"]["checkpoint"]["tree"] == answers["new"]["checkpoint"]["tree"]
    assert answers["new"]["stats"]["shared"] is True
    assert git(moved, "cat-file", "-p", f"{answers['new']['checkpoint']['tree']}:a.txt").strip() == "b"


def test_two_looks_across_a_move_leave_the_worktree_where_it_went(tmp_path, monkeypatch):
    """Race: a request has looked at ``r`` (there) and not yet pointed the worktree there when the worktree
    moves to ``r2`` and another request follows it; the first then pointed it back at ``r``, gone. The
    look and the pointing are one step now: the later request waits for it, and has the last word."""
    import threading

    from snapshotd.engine import registry

    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    moved = tmp_path / "r2"
    engine = Engine()
    opened = engine.registry.open_path(str(repo))
    repo.rename(moved)
    engine.registry.open_path(str(moved))
    moved.rename(repo)  # and back: the next look at r has a move to make
    follower = threading.Thread(target=lambda: (repo.rename(moved), engine.registry.open_path(str(moved))))
    met: list[str] = []

    def looked_then_preempted(path):  # type: ignore[no-untyped-def]
        found = os.path.isdir(path)
        if path == str(repo) and not met:
            met.append(path)
            follower.start()
            follower.join(timeout=2)  # it finishes meanwhile unless the look and the move are one step
        return found

    monkeypatch.setattr(registry, "os", _Stand_in(os, path=_Stand_in(os.path, isdir=looked_then_preempted)))
    try:
        engine.registry.open_path(str(repo))
        follower.join()
        assert met
        assert opened.info.path == str(moved)
    finally:
        engine.registry.close()
