"""The daemon packs a store's loose objects once they pass git's limit, and loses or touches nothing doing so."""

from __future__ import annotations

import os
import time
from pathlib import Path

import trio
from repo_helpers import git, loose_objects

from snapshotd.engine import packing


def make_repo(root: Path, gc_auto: int) -> Path:
    root.mkdir(parents=True)
    git(root, "init", "-q")
    git(root, "config", "gc.auto", str(gc_auto))
    (root / "a.txt").write_text("a\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


def user_state(repo: Path) -> tuple[bytes, str, bytes]:
    """The user's index, branches and tags, and HEAD, as bytes to compare."""
    refs = git(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads", "refs/tags")
    return (repo / ".git" / "index").read_bytes(), refs, (repo / ".git" / "HEAD").read_bytes()


async def take(engine, repo: Path, turns: int) -> list[str]:
    ids = []
    for turn in range(turns):
        (repo / "src").mkdir(exist_ok=True)
        (repo / "src" / f"f{turn}.txt").write_text(f"turn {turn}\n")
        result = await engine.call("checkpoint", {"path": str(repo), "session": "s", "label": f"turn {turn}"})
        ids.append(result["checkpoint"]["id"])
    return ids


async def packing_runs(engine) -> int:
    return (await engine.call("status"))["packing"]["runs"]


async def test_loose_objects_past_the_limit_are_packed_and_every_object_stays(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r", gc_auto=30)
    stray = git(repo, "hash-object", "-w", "--stdin", input=b"an object nothing names\n").strip()
    before = user_state(repo)
    ids = await take(watched_engine, repo, 20)  # each writes a blob, two trees, a commit and a pin
    with trio.fail_after(30):
        while watched_engine.packing.running or watched_engine.packing.waiting:
            await trio.sleep(0.05)
    status = (await watched_engine.call("status"))["packing"]
    assert status["runs"] >= 1 and status["failures"] == 0 and status["last_error"] is None
    assert len(loose_objects(repo)) < 30  # written since the last packing, fewer than would start another
    assert list((repo / ".git" / "objects" / "pack").glob("pack-*.pack"))
    assert git(repo, "cat-file", "-t", stray).strip() == "blob"  # packed, not pruned
    git(repo, "fsck", "--connectivity-only", "--no-dangling")
    for index, checkpoint in enumerate(ids):
        shown = await watched_engine.call("show", {"path": str(repo), "checkpoint": checkpoint})
        assert shown["checkpoint"]["label"] == f"turn {index}"
        assert git(repo, "show", f"{checkpoint}:src/f{index}.txt") == f"turn {index}"
    assert user_state(repo) == before
    more = await take(watched_engine, repo, 3)  # the store goes on working on its packs
    assert git(repo, "show", f"{more[-1]}:src/f2.txt") == "turn 2"


async def test_a_store_whose_gc_auto_is_zero_is_never_packed(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r", gc_auto=0)
    await take(watched_engine, repo, 20)
    await trio.sleep(0.5)
    assert await packing_runs(watched_engine) == 0
    assert not list((repo / ".git" / "objects" / "pack").glob("pack-*.pack"))
    assert len(loose_objects(repo)) >= 20 * 3


def test_an_interrupted_packings_old_temporary_pack_is_removed_and_a_live_one_kept(tmp_path):
    repo = make_repo(tmp_path / "r", gc_auto=30)
    folder = repo / ".git" / "objects" / "pack"
    folder.mkdir(exist_ok=True)
    old, live, kept = folder / ".tmp-123-pack-abc.pack", folder / "tmp_pack_XyZ", folder / "pack-1.keep"
    for path in (old, live, kept):
        path.write_bytes(b"partial")
    hour_ago = time.time() - packing.STALE_TEMPORARY_S - 60
    os.utime(old, (hour_ago, hour_ago))
    os.utime(kept, (hour_ago, hour_ago))
    assert packing.clear_stale_temporaries(str(repo / ".git"), time.time()) == 1
    assert not old.exists() and live.exists() and kept.exists()
