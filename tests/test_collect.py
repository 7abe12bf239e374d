"""What ``delete`` and ``gc`` drop, straight through ``engine/collect.py``, on real stores.

``collect_sessions`` keeps the newest ``keep`` of each session and those newer
than the cutoff, leaves the safety session whole unless asked, and changes
nothing on a dry run; what it reports is what ``list`` no longer shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_helpers import git, init_repo

from snapshotd.engine import collect
from snapshotd.errors import InvalidParams, NotFound
from snapshotd.git.repository import repository
from snapshotd.settings import SAFETY_SESSION
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.identity import Records, WorktreeInfo, identify, locate


@pytest.fixture
def info(tmp_path: Path) -> WorktreeInfo:
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    return identify(locate(str(repo)), Records(tmp_path / "home"))


def record(info: WorktreeInfo, session: str | None) -> Checkpoint:
    tree = git(info.path, "rev-parse", "HEAD^{tree}").strip()
    with repository(info.store_dir) as repo:
        return Store(repo).record(worktree_id=info.id, session=session, label=None, tree=tree, base=None)


def listed(info: WorktreeInfo, session: str | None) -> list[str]:
    with repository(info.store_dir) as repo:
        return [cp.id for cp in Store(repo).list(info.id, session, None, all_sessions=False)]


def collect_now(info: WorktreeInfo, **params: object) -> list[collect.SessionCollection]:
    return collect.collect_worktree(info, collect.GcOptions.from_params(params))


def test_gc_keeps_the_newest_of_each_session_and_the_safety_session(info: WorktreeInfo) -> None:
    made = {session: [record(info, session) for _ in range(3)] for session in ("a", None, SAFETY_SESSION)}
    dry = collect_now(info, keep=1, dry_run=True)
    going = {item.session: item.checkpoints for item in dry}
    assert going == {"a": [cp.id for cp in reversed(made["a"][:2])], None: [cp.id for cp in reversed(made[None][:2])]}
    assert all(item.worktree == info.id and item.path == info.path for item in dry)
    assert [len(listed(info, session)) for session in made] == [3, 3, 3]  # a dry run changes nothing
    done = collect_now(info, keep=1)
    assert [item.to_wire() for item in done] == [item.to_wire() for item in dry]
    assert listed(info, "a") == [made["a"][2].id] and listed(info, None) == [made[None][2].id]
    assert len(listed(info, SAFETY_SESSION)) == 3
    collect_now(info, keep=0, include_safety=True)
    assert [listed(info, session) for session in made] == [[], [], []]


def test_gc_by_age_keeps_what_is_newer_than_the_cutoff(info: WorktreeInfo) -> None:
    made = [record(info, "s") for _ in range(2)]
    assert collect_now(info, older_than_s=3600) == []  # all are younger than an hour
    assert listed(info, "s") == [cp.id for cp in reversed(made)]
    options = collect.GcOptions(keep=None, cutoff="9999-01-01T00:00:00", every=False, dry_run=False, include_safety=False)
    with repository(info.store_dir) as repo:
        dropped = collect.collect_sessions(Store(repo), info, options)
    assert [item.checkpoints for item in dropped] == [[cp.id for cp in reversed(made)]]
    assert listed(info, "s") == []


def test_gc_options_default_and_refuse_bad_numbers() -> None:
    assert collect.GcOptions.from_params({}).keep == collect.DEFAULT_KEEP
    aged = collect.GcOptions.from_params({"older_than_s": 60})
    assert aged.keep is None and aged.cutoff is not None
    assert collect.GcOptions.from_params({"include_safety": True}).skipped_session is None
    for bad in ({"keep": -1}, {"older_than_s": "soon"}, {"dry_run": "yes"}):
        with pytest.raises(InvalidParams):
            collect.GcOptions.from_params(bad)


def test_delete_by_ids_and_by_session(info: WorktreeInfo) -> None:
    a = [record(info, "a") for _ in range(3)]
    b = [record(info, "b") for _ in range(2)]
    with repository(info.store_dir) as repo:
        store = Store(repo)
        deleted = collect.drop_checkpoints([(store, a[0]), (store, a[2]), (store, b[1])])
    assert deleted.to_wire() == {"deleted": 3}
    assert listed(info, "a") == [a[1].id] and listed(info, "b") == [b[0].id]
    assert collect.drop_session(info, "b") == collect.Deleted(1)
    assert listed(info, "b") == []
    with pytest.raises(NotFound, match=r"has no checkpoint in the session 'b'; `snapshotd list` shows its sessions\."):
        collect.drop_session(info, "b")
    assert listed(info, "a") == [a[1].id]  # nothing else went
    options = collect.DeleteOptions.from_params({"session": "a"})
    assert options == collect.DeleteOptions(checkpoints=None, session="a")
    with pytest.raises(InvalidParams, match="Give 'checkpoints'"):
        collect.DeleteOptions.from_params({})


def test_folder_bytes_counts_every_file(tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "one").write_bytes(b"x" * 10)
    (tmp_path / "d" / "e" / "two").write_bytes(b"y" * 5)
    assert collect.folder_bytes(tmp_path / "d") == 15
    assert collect.folder_bytes(tmp_path / "missing") == 0
