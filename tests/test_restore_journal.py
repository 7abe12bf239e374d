"""The restore journal (snapshotd.restore.journal): recovery after a crash at each step of an apply.

A child process applies a real plan and is killed (SIGKILL, so nothing of
its own cleans up) at one step; :func:`recover` must then leave no
temporary file, backup, stage folder or journal behind, every real name must
hold a whole version (old or new), and a new restore must reach the target.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repo_helpers import git, init_repo, write
from restore_helpers import capture, temps_left

from snapshotd.restore.journal import recover

ROOT = Path(__file__).resolve().parents[1]

OLD = {".gitattributes": "*.txt text\n", **{f"f{i}.txt": f"file {i} at A\n" for i in range(4)}, "d/g.txt": "g at A\n"}
NEW = {path: f"edited {text}" for path, text in OLD.items() if path != ".gitattributes"}
ADDED = {"n.txt": "added after A\n"}

_CHILD = r"""
import json, os, signal, sys, time
from snapshotd.git.repository import open_repository
from snapshotd.restore import fileops
from snapshotd.restore.apply import Applier
from snapshotd.restore.plan import plan_restore
from snapshotd.restore.prepared import apply_plan
from snapshotd.restore.stage import GitCheckout, Stage

args = json.loads(sys.argv[1])
step = args["step"]
if args.get("batch"):  # the big restore's barrier: one syncfs for every copy
    from snapshotd.restore import barrier
    barrier.SYNCFS_FROM = 1

def die():
    if args.get("marker"):
        open(args["marker"], "w").close()
        time.sleep(120)  # held alive, holding the journal's lock, until the parent kills it
    os.kill(os.getpid(), signal.SIGKILL)

def after(cls, name, calls=1):
    real = getattr(cls, name)
    seen = []
    def wrapped(*a, **k):
        result = real(*a, **k)
        seen.append(1)
        if len(seen) == calls:
            die()
        return result
    setattr(cls, name, wrapped)

if step == "journal-unnamed":
    os.replace = lambda *a, **k: die()
elif step == "journal-not-yet-durable":
    from snapshotd.restore import prepared
    prepared.make_journal_durable = lambda *a: die()
elif step == "staged":
    after(Stage, "prepare")
elif step == "temp-half-written":
    real_write = fileops.write_all
    def half(fd, data):
        if not bytes(data[:1]) == b"{":  # not the journal itself
            os.write(fd, bytes(data)[: len(data) // 2])
            die()
        real_write(fd, data)
    fileops.write_all = half
elif step == "deleted":
    after(Applier, "delete")
elif step == "backup-kept":
    after(Applier, "_keep", calls=2)
elif step == "renamed":
    after(Applier, "write", calls=2)
elif step == "written-unsynced":
    from snapshotd.restore import barrier
    barrier.make_durable = lambda written: die()
elif step == "durable":
    from snapshotd.restore import barrier
    after(barrier, "make_durable")
elif step == "synced":
    after(Applier, "sync")
elif step == "deleted-all":
    Applier.prune_folders = lambda self, *a: die()

repo = open_repository(os.path.join(args["workdir"], ".git"))
plan = plan_restore(repo, args["current"], args["target"], None, args["workdir"])
apply_plan(repo, args["workdir"], plan, args["journal"], GitCheckout(git_dir=repo.path))
"""

# What each crash leaves: the kinds of name in the journal folder (the backup
# folder is there, never in the worktree), and the folders of the temporary
# names in the worktree (every copy is written before the first rename: d/g.txt,
# then f0-f3.txt; the delete of n.txt kept the first backup).
STEPS = {
    "journal-unnamed": ({".journal-"}, []),  # .journal-tmp-<token>, never renamed
    "staged": ({"apply-", "stage-"}, []),
    "journal-not-yet-durable": ({"apply-", "stage-"}, []),  # the safety checkpoint's moment: nothing made yet
    "temp-half-written": ({"apply-", "backup-", "stage-"}, ["d"]),
    "deleted": ({"apply-", "backup-", "stage-"}, []),
    "backup-kept": ({"apply-", "backup-", "stage-"}, ["", "", "", "", "d"]),  # d/g.txt's kept, not yet replaced
    "renamed": ({"apply-", "backup-", "stage-"}, ["", "", ""]),  # d/g.txt and f0.txt in place
    "synced": ({"apply-", "backup-", "stage-"}, []),  # every path in place and durable, nothing yet removed
}


def run_child(args: dict) -> subprocess.Popen[bytes]:
    """Start the child that applies the plan and dies at ``args["step"]``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(args)], cwd=ROOT, env=env)


@pytest.fixture
def scene(tmp_path: Path) -> tuple[Path, str, str]:
    """A worktree edited after tree A (every file changed, one added): (worktree, A, current)."""
    wt = init_repo(tmp_path / "wt", *OLD.items(), commit=False)
    target = capture(wt)
    for path, text in {**NEW, **ADDED}.items():
        write(wt / path, text)
    return wt, target, capture(wt)


@pytest.mark.parametrize("step", STEPS)
def test_recover_after_a_crash_at_each_step(tmp_path: Path, scene: tuple[Path, str, str], step: str) -> None:
    wt, target, current = scene
    journal = tmp_path / "journal"
    args = {"step": step, "workdir": str(wt), "current": current, "target": target, "journal": str(journal)}
    child = run_child(args)
    assert child.wait(timeout=120) == -signal.SIGKILL  # it died at the step, not after finishing

    kinds, folders = STEPS[step]
    assert {name.split("-")[0] + "-" for name in os.listdir(journal)} == kinds
    assert [os.path.dirname(path) for path in temps_left(wt)] == folders
    for path in OLD.keys() - {".gitattributes"}:
        assert (wt / path).read_text() in (OLD[path], NEW[path])  # whole, never torn
    if (wt / "n.txt").exists():
        assert (wt / "n.txt").read_text() == ADDED["n.txt"]

    left = temps_left(wt)
    assert recover(str(journal), str(wt)) == left
    assert temps_left(wt) == [] and os.listdir(journal) == []

    again = run_child({**args, "step": "none", "current": capture(wt)})
    assert again.wait(timeout=120) == 0
    assert capture(wt) == target
    assert os.listdir(journal) == [] and temps_left(wt) == []


@pytest.mark.parametrize("step", ["written-unsynced", "durable"])
def test_recover_after_a_crash_around_a_big_restores_barrier(tmp_path: Path, scene: tuple[Path, str, str], step: str) -> None:
    wt, target, current = scene
    journal = tmp_path / "journal"
    args = {"step": step, "workdir": str(wt), "current": current, "target": target, "journal": str(journal),
            "batch": True}
    child = run_child(args)
    assert child.wait(timeout=120) == -signal.SIGKILL

    assert {name.split("-")[0] + "-" for name in os.listdir(journal)} == {"apply-", "backup-", "stage-"}
    assert [os.path.dirname(path) for path in temps_left(wt)] == ["", "", "", "", "d"]  # every copy written
    for path in NEW:
        assert (wt / path).read_text() == NEW[path]  # none renamed before the barrier returned

    left = temps_left(wt)
    assert recover(str(journal), str(wt)) == left
    assert temps_left(wt) == [] and os.listdir(journal) == []
    again = run_child({**args, "step": "none", "current": capture(wt)})
    assert again.wait(timeout=120) == 0
    assert capture(wt) == target
    assert os.listdir(journal) == [] and temps_left(wt) == []


def test_a_live_writers_journal_is_left_alone(tmp_path: Path, scene: tuple[Path, str, str]) -> None:
    wt, target, current = scene
    journal = tmp_path / "journal"
    marker = tmp_path / "marker"
    args = {"step": "temp-half-written", "workdir": str(wt), "current": current, "target": target,
            "journal": str(journal), "marker": str(marker)}
    child = run_child(args)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        held = (sorted(os.listdir(journal)), temps_left(wt))
        assert recover(str(journal), str(wt)) == []
        assert (sorted(os.listdir(journal)), temps_left(wt)) == held and held[1]
    finally:
        child.kill()
        child.wait()
    assert recover(str(journal), str(wt)) == held[1]
    assert os.listdir(journal) == [] and temps_left(wt) == []


def _open_paths(folder: Path) -> list[str]:
    """What this process holds open under ``folder``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            found.append(target)
    return found


@pytest.mark.needs("inotify")
async def test_a_daemons_restore_leaves_its_backups_and_journal_to_after_the_answer(watched_engine, tmp_path):
    import trio

    wt = init_repo(tmp_path / "wt", *OLD.items())
    params = {"path": str(wt), "session": "s"}
    at_a = (await watched_engine.call("checkpoint", params))["checkpoint"]
    for path, text in {**NEW, **ADDED}.items():
        write(wt / path, text)
    done = await watched_engine.call("restore", {"checkpoint": at_a["id"], "path": str(wt)})
    assert sorted(done["written"]) == sorted(NEW) and done["deleted"] == list(ADDED)
    assert all((wt / path).read_text() == text for path, text in OLD.items())
    journal_dir = wt / ".git" / "snapshotd" / "journal"
    with trio.fail_after(10):  # removed in the background, under the worktree's lock
        while any(journal_dir.iterdir()):
            await trio.sleep(0.01)
    assert _open_paths(journal_dir) == []  # the journal's lock let go
    # the next operation on the worktree finds nothing left behind, and the safety checkpoint holds the edits
    safety = done["safety_checkpoint"]
    restored = await watched_engine.call("restore", {"checkpoint": safety["id"], "path": str(wt)})
    assert sorted(restored["written"]) == sorted({**NEW, **ADDED}) and restored["deleted"] == []
    assert all((wt / path).read_text() == text for path, text in {**NEW, **ADDED}.items())
    with trio.fail_after(10):
        while any(journal_dir.iterdir()):
            await trio.sleep(0.01)
    assert temps_left(wt) == []


def _prepared_scene(tmp_path: Path, scene: tuple[Path, str, str]):
    from snapshotd.git.repository import open_repository
    from snapshotd.restore.plan import plan_restore

    wt, target, current = scene
    repo = open_repository(str(wt / ".git"))
    return wt, target, repo, plan_restore(repo, current, target, None, str(wt))


def test_an_applys_renames_are_synced_after_the_answer_and_before_its_journal_goes(
    tmp_path: Path, scene: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapshotd.restore.apply import Applier
    from snapshotd.restore.prepared import prepared_plan

    wt, target, repo, plan = _prepared_scene(tmp_path, scene)
    journal = tmp_path / "journal"
    events: list[str] = []
    real_sync = Applier.sync
    monkeypatch.setattr(Applier, "sync", lambda self: (events.append(f"sync {sorted(os.listdir(journal))}"), real_sync(self))[1])
    deferred: list = []
    with prepared_plan(repo, str(wt), plan, str(journal), defer=deferred.append) as prepared:
        outcome = prepared.apply()
    assert sorted(outcome.written) == sorted(NEW) and capture(wt) == target  # the answer: every path in place
    assert events == [] and len(deferred) == 1  # not yet synced: that waits until after the answer
    deferred[0]()
    assert len(events) == 1 and "apply-" in events[0]  # synced while the journal still named the apply
    assert os.listdir(journal) == [] and temps_left(wt) == []


def test_a_sync_that_fails_after_the_answer_keeps_the_journal_for_recovery(
    tmp_path: Path, scene: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from snapshotd.restore.apply import Applier
    from snapshotd.restore.prepared import prepared_plan

    wt, target, repo, plan = _prepared_scene(tmp_path, scene)
    journal = tmp_path / "journal"

    def failing(self: Applier) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Applier, "sync", failing)
    deferred: list = []
    with prepared_plan(repo, str(wt), plan, str(journal), defer=deferred.append) as prepared:
        prepared.apply()
    with pytest.raises(OSError):
        deferred[0]()
    assert {name.split("-")[0] + "-" for name in os.listdir(journal)} == {"apply-", "backup-"}  # (nothing staged)
    assert _open_paths(tmp_path) == []  # every folder, and the journal's lock, let go
    assert recover(str(journal), str(wt)) == []  # every copy was renamed into place: no temporary name to remove
    assert os.listdir(journal) == [] and capture(wt) == target


def test_the_journal_is_durable_before_the_apply_makes_or_removes_anything(
    tmp_path: Path, scene: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapshotd.restore import fileops, prepared
    from snapshotd.restore.apply import Applier

    wt, target, repo, plan = _prepared_scene(tmp_path, scene)
    journal = tmp_path / "journal"
    events: list[str] = []

    def logged(name: str, real):
        return lambda *a, **k: (events.append(name), real(*a, **k))[1]

    monkeypatch.setattr(prepared, "make_journal_durable", logged("journal durable", prepared.make_journal_durable))
    monkeypatch.setattr(fileops, "write_temp", logged("copy", fileops.write_temp))
    monkeypatch.setattr(Applier, "delete", logged("delete", Applier.delete))
    with prepared.prepared_plan(repo, str(wt), plan, str(journal)) as ready:
        assert events == []  # written, not waited for: the safety checkpoint is recorded here, and its flush carries it
        ready.apply()
    assert events[0] == "journal durable" and events.count("journal durable") == 1
    assert {"copy", "delete"} <= set(events) and capture(wt) == target


async def test_a_restores_safety_ref_is_durable_before_the_apply_begins(watched_engine, tmp_path, monkeypatch) -> None:
    from snapshotd.engine import locked
    from snapshotd.restore import prepared

    wt = init_repo(tmp_path / "wt", *OLD.items())
    params = {"path": str(wt), "session": "s"}
    at_a = (await watched_engine.call("checkpoint", params))["checkpoint"]
    for path, text in NEW.items():
        write(wt / path, text)
    events: list[tuple[str, str]] = []
    real_fsync_ref, real_durable = locked.fsync_ref, prepared.make_journal_durable

    def ref_synced(git_dir: str, name: str) -> None:
        real_fsync_ref(git_dir, name)
        events.append(("ref", os.path.join(git_dir, name)))

    monkeypatch.setattr(locked, "fsync_ref", ref_synced)
    monkeypatch.setattr(prepared, "make_journal_durable", lambda *a: (events.append(("apply", "")), real_durable(*a))[1])
    done = await watched_engine.call("restore", {"checkpoint": at_a["id"], "path": str(wt)})
    assert [kind for kind, _ in events] == ["ref", "apply"]
    ref = events[0][1].split("/.git/", 1)[1]  # the safety session's, which holds the safety checkpoint
    safety = done["safety_checkpoint"]["id"]
    assert safety in git(wt, "rev-list", ref).split()


def test_recovery_removes_the_folders_a_crashed_apply_emptied_and_nothing_else(tmp_path: Path) -> None:
    wt = init_repo(tmp_path / "wt", ("a.txt", "a\n"), ("kept/b.txt", "b\n"), commit=False)
    (wt / ".gitignore").write_text("*.log\n")
    target = capture(wt)
    for path in ("new/deep/x.txt", "new/deep/y.txt", "new/z.txt", "other/w.txt", "withlog/v.txt"):
        write(wt / path, "added after the checkpoint\n")
    write(wt / "withlog" / "run.log", "ignored, so in no checkpoint\n")
    (wt / "empty-before").mkdir()  # the user's own empty folder: no delete is under it
    journal = tmp_path / "journal"
    args = {"step": "deleted-all", "workdir": str(wt), "current": capture(wt), "target": target, "journal": str(journal)}
    child = run_child(args)
    assert child.wait(timeout=120) == -signal.SIGKILL  # every delete done, no folder pruned yet
    assert sorted(p.name for p in (wt / "new").rglob("*")) == ["deep"] and not any((wt / "other").iterdir())

    assert recover(str(journal), str(wt)) == []
    assert not (wt / "new").exists() and not (wt / "other").exists()  # emptied by the deletes: gone
    assert sorted(os.listdir(wt / "withlog")) == ["run.log"]  # an ignored file keeps its folder
    assert (wt / "empty-before").is_dir() and (wt / "kept" / "b.txt").exists()
    assert os.listdir(journal) == [] and capture(wt) == target


def test_a_worktree_moved_after_a_crash_is_recovered_where_it_went(tmp_path: Path, scene: tuple[Path, str, str]) -> None:
    wt, target, current = scene
    journal = tmp_path / "journal"
    args = {"step": "renamed", "workdir": str(wt), "current": current, "target": target, "journal": str(journal)}
    assert run_child(args).wait(timeout=120) == -signal.SIGKILL
    moved = wt.rename(tmp_path / "moved")
    left = temps_left(moved)
    assert left and recover(str(journal), str(moved)) == left  # the journal names the old place, gone since
    assert temps_left(moved) == [] and os.listdir(journal) == []


@pytest.mark.needs("inotify")
async def test_a_restore_another_process_left_unfinished_is_recovered_before_the_daemons_next_capture(
    watched_engine, tmp_path
) -> None:
    wt = init_repo(tmp_path / "wt", *OLD.items())
    target = capture(wt)
    first = (await watched_engine.call("checkpoint", {"path": str(wt)}))["checkpoint"]  # the daemon has it open
    for path, text in {**NEW, **ADDED}.items():
        write(wt / path, text)
    journal = wt / ".git" / "snapshotd" / "journal"  # the worktree's own, as `--embedded restore` uses it
    args = {"step": "renamed", "workdir": str(wt), "current": capture(wt), "target": target, "journal": str(journal)}
    assert run_child(args).wait(timeout=120) == -signal.SIGKILL  # killed midway, its temporary names left
    assert temps_left(wt)
    after = (await watched_engine.call("checkpoint", {"path": str(wt)}))["checkpoint"]
    assert temps_left(wt) == [] and os.listdir(journal) == []
    assert after["tree"] == capture(wt) != first["tree"]  # git's tree of the worktree, with no temporary name in it
