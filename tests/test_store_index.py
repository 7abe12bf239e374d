"""The session index (store/index.py) never answers other than git: rebuilt, stale, or lost.

Each test keeps one Store (and so this process's index) across changes made
behind its back by another process (``git update-ref``, a second Python
process recording through its own Store), and compares every answer with a
fresh index read from git alone.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from repo_helpers import commit_all, git

from snapshotd.engine.collect import GcOptions, collect_sessions
from snapshotd.git.repository import repository
from snapshotd.store import index as index_mod
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.identity import WorktreeInfo
from snapshotd.store.lookup import back_from_head, by_seq
from snapshotd.store.refnames import ref_name

WORKTREE = "wt-index"
NAME = ref_name(WORKTREE, "s")


@pytest.fixture
def repo_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(index_mod, "SAVE_AFTER", 1)  # every walk writes the saved copy
    path = tmp_path / "r"
    path.mkdir()
    git(path, "init", "-q", "-b", "trunk")
    (path / "a.txt").write_text("a\n")
    commit_all(path, "first")
    return path


@pytest.fixture
def store(repo_path: Path) -> Iterator[Store]:
    index_mod.forget(str(repo_path / ".git"))
    with repository(str(repo_path / ".git")) as repo:
        yield Store(repo)
    index_mod.forget(str(repo_path / ".git"))


def record(store: Store, path: Path, n: int) -> Checkpoint:
    blob = git(path, "hash-object", "-w", "--stdin", input=f"{n}\n".encode())
    tree = git(path, "mktree", input=f"100644 blob {blob}\ta.txt\n".encode())
    return store.record(worktree_id=WORKTREE, session="s", label=str(n), tree=tree, base=git(path, "rev-parse", "HEAD"))


def answers(store: Store, made: list[Checkpoint]) -> dict:
    """Everything the index answers for: list, liveness, seq, counting back, gc's choice."""
    where = str(store.repo.path)
    info = WorktreeInfo(WORKTREE, where, "git", where, where, where, where, where)
    listed = [cp.id for cp in store.list(WORKTREE, "s", None, all_sessions=False)]
    return {
        "list": listed,
        "list2": [cp.id for cp in store.list(WORKTREE, None, 2, all_sessions=True)],
        "live": [store.is_live(cp) for cp in made],
        "seq": [getattr(by_seq(store, WORKTREE, "s", cp.seq), "id", None) for cp in made],
        "back1": back_from_head(store, WORKTREE, "s", 1, "/wt").id if len(listed) > 1 else None,
        "count": store.count(NAME),
        "gc": [c.checkpoints for c in collect_sessions(store, info, GcOptions(2, None, False, True, True))],
    }


def saved(repo_path: Path) -> Path:
    return repo_path / ".git" / "snapshotd" / "checkpoint-index"


def fresh(repo_path: Path, made: list[Checkpoint]) -> dict:
    """The same answers from an index read from git alone."""
    index_mod.forget(str(repo_path / ".git"))
    saved(repo_path).unlink(missing_ok=True)
    with repository(str(repo_path / ".git")) as repo:
        return answers(Store(repo), made)


def test_an_index_rebuilt_from_git_gives_the_same_answers(store: Store, repo_path: Path) -> None:
    made = [record(store, repo_path, n) for n in range(6)]
    store.rewrite(NAME, drop={made[2].id})
    before = answers(store, made)
    assert before["live"] == [True, True, False, True, True, True]
    assert before["list"] == [cp.id for cp in reversed(made) if cp is not made[2]]
    assert before["seq"][2] is None and before["gc"] == [[made[3].id, made[1].id, made[0].id]]
    assert fresh(repo_path, made) == before


def test_a_ref_deleted_by_another_process_is_seen(store: Store, repo_path: Path) -> None:
    made = [record(store, repo_path, n) for n in range(4)]
    assert all(answers(store, made)["live"])
    git(repo_path, "update-ref", "-d", NAME)
    after = answers(store, made)
    assert after["list"] == [] and after["live"] == [False] * 4 and after["count"] == 0
    assert after == fresh(repo_path, made)


def test_a_ref_moved_back_by_another_process_is_seen(store: Store, repo_path: Path) -> None:
    made = [record(store, repo_path, n) for n in range(5)]
    answers(store, made)
    older_pin = git(repo_path, "rev-parse", f"{NAME}^2^2")  # the pin of the third checkpoint
    git(repo_path, "update-ref", NAME, older_pin)
    after = answers(store, made)
    assert after["live"] == [True, True, True, False, False]
    assert after["list"] == [made[2].id, made[1].id, made[0].id]
    assert after == fresh(repo_path, made)


def test_checkpoints_another_process_records_and_drops_are_seen(store: Store, repo_path: Path) -> None:
    made = [record(store, repo_path, n) for n in range(3)]
    answers(store, made)
    script = (
        "import sys\nfrom snapshotd.git.repository import repository\nfrom snapshotd.store.checkpoints import Store\n"
        "with repository(sys.argv[1]) as repo:\n    store = Store(repo)\n    store.rewrite(sys.argv[2], drop={sys.argv[3]})\n"
        "    cp = store.record(worktree_id=sys.argv[4], session='s', label='x', tree=store.load(sys.argv[3]).tree, base=None)\n"
        "    print(cp.id)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(repo_path / ".git"), NAME, made[1].id, WORKTREE],
                         check=True, capture_output=True, text=True).stdout.strip()
    made.append(store.load(out))
    after = answers(store, made)
    assert after["live"] == [True, False, True, True] and after["list"][0] == out
    assert after["seq"][3] == out and made[3].seq == 4
    assert after == fresh(repo_path, made)


def reopened(repo_path: Path, made: list[Checkpoint]) -> dict:
    """The answers of a new process's index, which starts from the saved copy."""
    index_mod.forget(str(repo_path / ".git"))
    with repository(str(repo_path / ".git")) as repo:
        return answers(Store(repo), made)


def test_the_saved_copy_is_private_and_a_new_process_starts_from_it(store: Store, repo_path: Path) -> None:
    made = [record(store, repo_path, n) for n in range(4)]
    expected = answers(store, made)
    assert saved(repo_path).stat().st_mode & 0o777 == 0o600
    assert (repo_path / ".git" / "snapshotd").stat().st_mode & 0o777 == 0o700
    assert reopened(repo_path, made) == expected


def test_a_stale_saved_copy_is_caught_up_from_the_refs(store: Store, repo_path: Path) -> None:
    made = [record(store, repo_path, n) for n in range(5)]
    answers(store, made)
    copy = saved(repo_path).read_bytes()
    git(repo_path, "update-ref", NAME, git(repo_path, "rev-parse", f"{NAME}^2"))  # another process drops the newest
    saved(repo_path).write_bytes(copy)
    after = reopened(repo_path, made)
    assert after["live"] == [True, True, True, True, False]
    assert after == fresh(repo_path, made)
    git(repo_path, "update-ref", "-d", NAME)
    saved(repo_path).write_bytes(copy)
    assert reopened(repo_path, made)["list"] == []
    assert reopened(repo_path, made) == fresh(repo_path, made)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "empty"])
def test_a_corrupt_saved_copy_is_ignored_and_rewritten(store: Store, repo_path: Path, damage: str) -> None:
    made = [record(store, repo_path, n) for n in range(4)]
    expected = answers(store, made)
    data = saved(repo_path).read_bytes()
    broken = {"truncated": data[: len(data) // 2], "flipped": data[:40] + bytes([data[40] ^ 1]) + data[41:],
              "garbage": b"\x00" * 300, "empty": b""}[damage]
    saved(repo_path).write_bytes(broken)
    assert reopened(repo_path, made) == expected
    assert saved(repo_path).read_bytes() == data  # read from git again, then saved whole


def test_a_link_in_place_of_the_copy_is_not_followed(store: Store, repo_path: Path, tmp_path: Path) -> None:
    made = [record(store, repo_path, n) for n in range(3)]
    expected = answers(store, made)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"keep")
    saved(repo_path).unlink()
    saved(repo_path).symlink_to(elsewhere)
    assert reopened(repo_path, made) == expected
    assert elsewhere.read_bytes() == b"keep"


def test_a_writer_that_died_mid_write_leaves_nothing_in_the_way(store: Store, repo_path: Path) -> None:
    made = [record(store, repo_path, n) for n in range(3)]
    answers(store, made)
    folder = repo_path / ".git" / "snapshotd"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = folder / f".checkpoint-index-{dead.stdout.strip()}-0000"
    leftover.write_bytes(b"half a copy")
    saved(repo_path).unlink()
    assert reopened(repo_path, made) == fresh(repo_path, made)
    made.append(record(store, repo_path, 9))
    reopened(repo_path, made)
    assert not leftover.exists() and saved(repo_path).exists()
