"""Checkpoints queued for one worktree's lock share a capture, and each still holds every write before it."""

from __future__ import annotations

from pathlib import Path

import trio
from oracle import oracle_tree
from repo_helpers import git


def make_repo(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q")
    (root / "a.txt").write_text("a\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


async def checkpoint(engine, repo: Path, **params) -> dict:
    return await engine.call("checkpoint", {"path": str(repo), **params})


async def test_queued_checkpoints_share_one_capture_and_each_is_recorded(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await checkpoint(watched_engine, repo, session="warm-up")
    (repo / "a.txt").write_text("changed\n")
    (repo / "new.txt").write_text("new\n")
    expected = oracle_tree(repo)
    state = next(iter(watched_engine.registry.worktrees.values()))
    before = sum(v for k, v in watched_engine.counters.items() if k.startswith("captures."))
    results: dict[str, dict] = {}

    async def one(session: str) -> None:
        results[session] = await checkpoint(watched_engine, repo, session=session, label=f"by {session}")

    await state.lock.acquire()  # a capture is running: the twenty requests queue behind it
    async with trio.open_nursery() as nursery:
        for index in range(20):
            nursery.start_soon(one, f"s{index}")
        while len(state.queue) < 20:
            await trio.sleep(0.01)
        await trio.sleep(0.05)  # queued this long at least
        state.lock.release()
    captures = sum(v for k, v in watched_engine.counters.items() if k.startswith("captures.")) - before
    assert captures == 1
    assert {r["checkpoint"]["tree"] for r in results.values()} == {expected}
    assert all(r["stats"]["shared"] for r in results.values())
    for result in results.values():  # where each one's time went: waiting for the lock, then the one capture
        phases = result["stats"]["phases"]
        assert phases["queued"] >= 50 and phases["capture"] > 0 and phases["record"] > 0 and phases["resolve"] > 0
        waits = {"sync", "thread"} if result["stats"]["scan"] == "watch" else set()  # a warm capture's own waits
        assert set(phases) == {"resolve", "queued", "capture", "record"} | waits
        assert abs(sum(phases.values()) - result["stats"]["ms"]) < 0.01
    assert len({r["checkpoint"]["id"] for r in results.values()}) == 20
    for session, result in results.items():
        assert result["checkpoint"]["session"] == session and result["checkpoint"]["label"] == f"by {session}"
        assert result["checkpoint"]["seq"] == 1
        listed = (await watched_engine.call("list", {"path": str(repo), "session": session}))["checkpoints"]
        assert [c["id"] for c in listed] == [result["checkpoint"]["id"]]


async def test_a_request_made_while_a_shared_capture_runs_gets_a_capture_of_its_own(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await checkpoint(watched_engine, repo, session="warm-up")
    state = next(iter(watched_engine.registry.worktrees.values()))
    capture = watched_engine.capture
    late: dict[str, dict] = {}

    async def late_request() -> None:
        late["result"] = await checkpoint(watched_engine, repo, session="late")

    async with trio.open_nursery() as nursery:

        async def capture_then_write(st, *, exact=False, then=None):
            result = await capture(st, exact=exact, then=then)
            if not late:  # the first capture has read the disk: a write and a request come only now
                late["started"] = True
                (repo / "after.txt").write_text("written after the first capture\n")
                nursery.start_soon(late_request)
                while not state.queue:
                    await trio.sleep(0.01)
            return result

        watched_engine.capture = capture_then_write
        first = await checkpoint(watched_engine, repo, session="first")
        while "result" not in late:
            await trio.sleep(0.01)
    assert first["checkpoint"]["tree"] != late["result"]["checkpoint"]["tree"]
    assert late["result"]["checkpoint"]["tree"] == oracle_tree(repo)
    assert late["result"]["stats"]["shared"] is False


async def test_a_failed_capture_fails_its_own_request_and_the_next_captures_for_the_rest(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await checkpoint(watched_engine, repo, session="warm-up")
    (repo / "a.txt").write_text("changed again\n")
    state = next(iter(watched_engine.registry.worktrees.values()))
    capture = watched_engine.capture
    calls = []

    async def fail_once(st, *, exact=False, then=None):
        calls.append(exact)
        if len(calls) == 1:
            raise OSError("injected: the disk went away for a moment")
        return await capture(st, exact=exact, then=then)

    watched_engine.capture = fail_once
    outcomes: dict[str, object] = {}

    async def one(session: str) -> None:
        try:
            outcomes[session] = await checkpoint(watched_engine, repo, session=session)
        except Exception as exc:
            outcomes[session] = exc

    await state.lock.acquire()
    async with trio.open_nursery() as nursery:
        for index in range(5):
            nursery.start_soon(one, f"s{index}")
        while len(state.queue) < 5:
            await trio.sleep(0.01)
        state.lock.release()
    failed = [s for s, o in outcomes.items() if isinstance(o, Exception)]
    assert len(failed) == 1 and "injected" in str(outcomes[failed[0]])
    done = [o for o in outcomes.values() if isinstance(o, dict)]
    assert len(done) == 4 and {o["checkpoint"]["tree"] for o in done} == {oracle_tree(repo)}
    assert len(calls) == 2  # the four left were served by one capture after the failed one
