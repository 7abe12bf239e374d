"""The engine's methods on real repositories: store, ids, errors, concurrency."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from oracle import oracle_tree
from repo_helpers import git

from snapshotd.engine.core import Engine
from snapshotd.errors import (
    InvalidParams,
    MethodNotFound,
    NotADirectory,
    NotFound,
    PathOutsideWorktree,
    WorktreeMismatch,
)


def make_repo(root: Path, files: int = 3) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q")
    for index in range(files):
        (root / f"f{index}.txt").write_text(f"file {index}\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


async def cp(engine: Engine, repo: Path, **params) -> dict:
    return (await engine.call("checkpoint", {"path": str(repo), **params}))["checkpoint"]


async def test_checkpoint_is_a_real_commit_with_metadata(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    (repo / "f0.txt").write_text("edited\n")
    checkpoint = await cp(engine, repo, session="s1", label="before turn 3")
    assert git(repo, "cat-file", "-t", checkpoint["id"]) == "commit"
    assert git(repo, "rev-parse", f"{checkpoint['id']}^{{tree}}") == checkpoint["tree"]
    assert checkpoint["base"] == git(repo, "rev-parse", "HEAD")
    assert git(repo, "rev-parse", f"{checkpoint['id']}^") == checkpoint["base"]
    assert checkpoint["session"] == "s1" and checkpoint["label"] == "before turn 3"
    assert checkpoint["seq"] == 1 and checkpoint["parent"] is None and checkpoint["changed"] is True
    assert checkpoint["created_at"].endswith("Z")
    message = git(repo, "log", "-1", "--format=%B", checkpoint["id"])
    assert "Snapshotd-Worktree: " + checkpoint["worktree"] in message
    assert "edited" in git(repo, "show", checkpoint["id"])
    assert git(repo, "diff", "--name-only", checkpoint["base"], checkpoint["id"]) == "f0.txt"


async def test_unchanged_capture_reuses_the_tree_and_says_so(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    first = await cp(engine, repo, session="s")
    second = await cp(engine, repo, session="s")
    assert second["tree"] == first["tree"]
    assert second["changed"] is False
    assert second["parent"] == first["id"] and second["seq"] == 2
    other = await cp(engine, repo, session="other")
    assert other["changed"] is True and other["seq"] == 1  # sessions are independent


async def test_list_show_and_prefixes(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    ids = []
    for index in range(5):
        (repo / "f0.txt").write_text(f"v{index}")
        ids.append((await cp(engine, repo, session="a" if index % 2 else "b"))["id"])
    listed = (await engine.call("list", {"path": str(repo)}))["checkpoints"]
    assert [c["id"] for c in listed] == list(reversed(ids))
    only_a = (await engine.call("list", {"path": str(repo), "session": "a"}))["checkpoints"]
    assert [c["id"] for c in only_a] == [ids[3], ids[1]]
    limited = (await engine.call("list", {"path": str(repo), "limit": 2}))["checkpoints"]
    assert [c["id"] for c in limited] == [ids[4], ids[3]]
    shown = (await engine.call("show", {"checkpoint": ids[2][:7]}))["checkpoint"]
    assert shown["id"] == ids[2]
    with pytest.raises(NotFound):
        await engine.call("show", {"checkpoint": "0000000"})
    with pytest.raises(InvalidParams, match="at least 7 hex digits"):
        await engine.call("show", {"checkpoint": "abc"})  # shorter than 7
    with pytest.raises(InvalidParams):
        await engine.call("show", {"checkpoint": 12345})


async def test_a_prefix_only_blobs_share_names_no_checkpoint(engine, tmp_path):
    import pygit2

    repo = make_repo(tmp_path / "r")
    await cp(engine, repo)
    seen: dict[str, bytes] = {}
    index = 0
    while True:  # birthday search: two blobs whose ids share 7 hex digits (~16k hashes)
        data = b"blob %d" % index
        prefix = str(pygit2.hash(data))[:7]
        if prefix in seen:
            break
        seen[prefix] = data
        index += 1
    store = pygit2.Repository(str(repo))
    store.create_blob(seen[prefix])
    store.create_blob(data)
    with pytest.raises(NotFound, match="No checkpoint matches"):  # blobs are never candidates
        await engine.call("show", {"checkpoint": prefix})


async def test_errors_are_clear_and_change_nothing(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    with pytest.raises(MethodNotFound, match="no method"):
        await engine.call("explode", {})
    with pytest.raises(InvalidParams, match="'label'"):
        await engine.call("checkpoint", {"path": str(repo), "label": 5})
    with pytest.raises(InvalidParams):
        await engine.call("checkpoint", {})
    with pytest.raises(NotFound, match="does not exist"):
        await engine.call("checkpoint", {"path": str(tmp_path / "missing")})
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectory):
        await engine.call("checkpoint", {"path": str(tmp_path / "file")})
    with pytest.raises(PathOutsideWorktree):
        await engine.call("checkpoint", {"path": str(repo / ".git")})
    with pytest.raises(InvalidParams):
        await engine.call("checkpoint", {"path": str(repo), "session": "bad\nname"})
    with pytest.raises(InvalidParams):
        await engine.call("list", {"path": str(repo), "limit": -1})
    assert git(repo, "for-each-ref", "refs/snapshotd") == ""


async def test_user_state_untouched(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    (repo / "f1.txt").write_text("staged")
    git(repo, "add", "f1.txt")
    (repo / "f1.txt").write_text("staged then edited")
    (repo / "stashme").write_text("x")
    git(repo, "stash", "push", "-q", "-u", "-m", "keep")
    index = repo / ".git" / "index"
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    refs_before = git(repo, "for-each-ref")
    (repo / ".git" / "index.lock").write_text("")  # a stale lock of the user's
    checkpoint = await cp(engine, repo)
    assert checkpoint["tree"] == oracle_tree(repo)
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before
    refs_after = "\n".join(line for line in git(repo, "for-each-ref").splitlines() if "refs/snapshotd/" not in line)
    assert refs_after == refs_before
    assert (repo / ".git" / "index.lock").exists()  # not ours to remove
    assert git(repo, "stash", "list").count("keep") == 1


async def test_checkpoints_survive_gc_prune_and_a_new_engine(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    (repo / "untracked.bin").write_bytes(os.urandom(1000))
    checkpoint = await cp(engine, repo, session="s")
    git(repo, "gc", "-q", "--prune=now")
    assert git(repo, "cat-file", "-t", checkpoint["id"]) == "commit"
    git(repo, "cat-file", "-e", f"{checkpoint['tree']}:untracked.bin")
    fresh = Engine()
    shown = (await fresh.call("show", {"checkpoint": checkpoint["id"]}))["checkpoint"]
    assert shown == checkpoint
    listed = (await fresh.call("list", {"path": str(repo)}))["checkpoints"]
    assert [c["id"] for c in listed] == [checkpoint["id"]]


async def test_worktree_id_is_stable_and_copies_get_their_own(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    first = (await engine.call("open", {"path": str(repo)}))["worktree"]
    again = (await engine.call("open", {"path": str(repo / ".")}))["worktree"]
    assert first["id"] == again["id"] and first["kind"] == "git"
    assert first["branch"] == "main" and first["head"] == git(repo, "rev-parse", "HEAD")
    copy = tmp_path / "copy"
    os.system(f"cp -a {repo} {copy}")
    copied = (await engine.call("open", {"path": str(copy)}))["worktree"]
    assert copied["id"] != first["id"]


async def test_concurrent_captures_across_sessions_lose_nothing(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    results: list[dict] = []

    async def one(index: int) -> None:
        results.append(await cp(engine, repo, session=f"s{index % 6}", label=f"c{index}"))

    async with trio.open_nursery() as nursery:
        for index in range(24):
            nursery.start_soon(one, index)
    assert len(results) == 24
    listed = (await engine.call("list", {"path": str(repo)}))["checkpoints"]
    assert sorted(c["id"] for c in listed) == sorted(c["id"] for c in results)
    for session in range(6):
        seqs = [c["seq"] for c in listed if c["session"] == f"s{session}"]
        assert sorted(seqs) == [1, 2, 3, 4]


async def test_two_engines_writing_one_session_lose_nothing(tmp_path):
    repo = make_repo(tmp_path / "r")
    engines = [Engine(), Engine()]
    made: list[str] = []

    async def writer(engine: Engine, count: int) -> None:
        for _ in range(count):
            made.append((await cp(engine, repo, session="shared"))["id"])

    async with trio.open_nursery() as nursery:
        for engine in engines:
            nursery.start_soon(writer, engine, 10)
    listed = (await engines[0].call("list", {"path": str(repo), "session": "shared"}))["checkpoints"]
    assert sorted(c["id"] for c in listed) == sorted(made)
    assert sorted(c["seq"] for c in listed) == list(range(1, 21))


async def test_delete_and_gc_keep_ids_of_the_rest(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    ids = []
    for index in range(6):
        (repo / "f0.txt").write_text(f"v{index}")
        ids.append((await cp(engine, repo, session="s"))["id"])
    deleted = await engine.call("delete", {"checkpoints": [ids[2][:8], ids[4]]})
    assert deleted == {"deleted": 2}
    listed = [c["id"] for c in (await engine.call("list", {"path": str(repo)}))["checkpoints"]]
    assert listed == [ids[5], ids[3], ids[1], ids[0]]
    with pytest.raises(NotFound):
        await engine.call("show", {"checkpoint": ids[2]})
    assert (await engine.call("gc", {"path": str(repo), "keep": 2}))["deleted"] == 2
    listed = [c["id"] for c in (await engine.call("list", {"path": str(repo)}))["checkpoints"]]
    assert listed == [ids[5], ids[3]]
    git(repo, "gc", "-q", "--prune=now")
    assert git(repo, "cat-file", "-t", ids[5]) == "commit"
    assert (await engine.call("delete", {"session": "s", "path": str(repo)}))["deleted"] == 2
    assert (await engine.call("list", {"path": str(repo)}))["checkpoints"] == []
    floor = git(repo, "for-each-ref", "--format=%(objectname)", "refs/snapshotd")
    assert git(repo, "rev-list", floor).split() == [floor]  # a floor pin keeps the seq; no checkpoint is reachable


async def test_gc_by_age(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await cp(engine, repo)
    assert (await engine.call("gc", {"path": str(repo), "older_than_s": 3600}))["deleted"] == 0
    await trio.sleep(1.1)
    assert (await engine.call("gc", {"path": str(repo), "older_than_s": 0}))["deleted"] == 1


async def test_restore_refuses_another_worktree_unless_allowed(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", str(linked))
    checkpoint = await cp(engine, repo)
    (linked / "f0.txt").write_text("linked edit")
    with pytest.raises(WorktreeMismatch):
        await engine.call("restore", {"checkpoint": checkpoint["id"], "path": str(linked)})
    assert (linked / "f0.txt").read_text() == "linked edit"
    result = await engine.call(
        "restore", {"checkpoint": checkpoint["id"], "path": str(linked), "allow_other_worktree": True}
    )
    assert result["written"] == ["f0.txt"]
    assert (linked / "f0.txt").read_text() == "file 0\n"
    linked_id = (await engine.call("open", {"path": str(linked)}))["worktree"]["id"]
    assert result["safety_checkpoint"]["worktree"] == linked_id


async def test_diff_against_the_worktree_and_between_checkpoints(engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    before = await cp(engine, repo)
    (repo / "f0.txt").write_text("file 0\nmore\n")
    (repo / "f1.txt").unlink()
    (repo / "new.txt").write_text("new\n")
    live = await engine.call("diff", {"from": before["id"], "to": "worktree", "path": str(repo)})
    assert {(f["path"], f["status"]) for f in live["files"]} == {
        ("f0.txt", "modified"),
        ("f1.txt", "deleted"),
        ("new.txt", "added"),
    }
    after = await cp(engine, repo)
    between = await engine.call("diff", {"from": before["id"], "to": after["id"], "patch": True})
    assert [f["path"] for f in between["files"]] == ["f0.txt", "f1.txt", "new.txt"]
    assert "+more" in between["patch"]
    only = await engine.call("diff", {"from": before["id"], "to": after["id"], "paths": ["f0.txt"], "path": str(repo)})
    assert [f["path"] for f in only["files"]] == ["f0.txt"]
    with pytest.raises(PathOutsideWorktree):
        await engine.call("diff", {"from": before["id"], "paths": ["../x"], "path": str(repo)})


async def test_gc_frees_the_objects_of_a_plain_folder(engine, tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    for _ in range(3):
        (folder / "data.bin").write_bytes(os.urandom(200_000))  # incompressible, one blob per turn
        await cp(engine, folder)
    result = await engine.call("gc", {"path": str(folder), "keep": 1})
    assert result["deleted"] == 2
    assert result["freed_bytes"] > 300_000  # two dropped 200 kB blobs are gone from disk
    listed = (await engine.call("list", {"path": str(folder)}))["checkpoints"]
    assert len(listed) == 1
    restored = await engine.call("restore", {"checkpoint": listed[0]["id"], "dry_run": True})
    assert restored["written"] == [] and restored["deleted"] == []


async def test_status_and_worktrees_answer_while_other_requests_open_worktrees(engine, tmp_path):
    repos = [make_repo(tmp_path / f"r{index}", files=1) for index in range(12)]
    answers: list[int] = []

    async def opener() -> None:
        for repo in repos:
            await engine.call("open", {"path": str(repo)})

    async def reader() -> None:
        while len(answers) < 40:
            answers.append(len((await engine.call("status"))["worktrees"]))
            answers.append(len((await engine.call("worktrees"))["worktrees"]))

    await engine.call("open", {"path": str(repos[0])})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(opener)
        nursery.start_soon(reader)
    assert answers and max(answers) <= len(repos)


async def test_restore_works_through_the_locked_worktree_and_its_resident_store(engine, tmp_path):
    from snapshotd.contract.refs import WorktreeRef
    from snapshotd.errors import InternalError

    repo = make_repo(tmp_path / "r")
    first = await cp(engine, repo, session="s")
    state = await engine.registry.resolve(WorktreeRef(str(repo)))
    async with engine._locked(state) as worktree:
        assert state.lock.locked()
        with worktree.store() as one, worktree.store() as two:
            assert one is two is state.capture.resident.store(state.info)  # opened once, kept
        captured = await worktree.capture(False)
        assert captured.tree == first["tree"]
    assert not state.lock.locked()
    with pytest.raises(InternalError):
        await worktree.capture(False)
    with pytest.raises(InternalError), worktree.store():
        pass

    (repo / "f1.txt").write_text("edited\n")
    done = await engine.call("restore", {"checkpoint": first["id"], "path": str(repo)})
    assert done["written"] == ["f1.txt"] and (repo / "f1.txt").read_text() == "file 1\n"
    safety = done["safety_checkpoint"]
    assert git(repo, "show", f"{safety['id']}:f1.txt") == "edited"
    # the safety session's next checkpoint follows it (the heads the resident store keeps are current)
    (repo / "f2.txt").write_text("edited\n")
    again = await engine.call("restore", {"checkpoint": first["id"], "path": str(repo)})
    assert again["written"] == ["f2.txt"]
    assert again["safety_checkpoint"]["seq"] == safety["seq"] + 1
