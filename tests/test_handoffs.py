"""A warm checkpoint costs the trio loop as few hand-offs to worker threads as it can: each waits for the
interpreter's lock behind the loop, which under a few hundred sessions is most of a checkpoint's wait."""

from __future__ import annotations

import trio
from repo_helpers import init_repo, write


async def test_a_warm_checkpoint_resolves_its_path_then_captures_and_records_in_one_worker_call(
    watched_engine, tmp_path, monkeypatch
):
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"), ("src/b.txt", "b\n"))
    here = {"path": str(repo), "session": "s"}
    await watched_engine.call("checkpoint", here)
    await watched_engine.call("checkpoint", here)  # warm from here on
    calls: list[str] = []
    run_sync = trio.to_thread.run_sync

    async def counted(fn, *args, **kwargs):
        calls.append(getattr(fn, "__qualname__", repr(fn)))
        return await run_sync(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    for turn in range(3):
        write(repo / "src" / "b.txt", f"turn {turn}\n")
        calls.clear()
        result = await watched_engine.call("checkpoint", here)
        assert result["stats"]["scan"] == "watch" and result["checkpoint"]["changed"]
        assert len(calls) == 2, calls  # the path looked up; the tree captured and the checkpoint recorded
    calls.clear()
    result = await watched_engine.call("checkpoint", here)  # nothing changed
    assert not result["checkpoint"]["changed"] and len(calls) == 2, calls
