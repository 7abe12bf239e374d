"""The watcher's cookies: one file renamed at each sync, never a file made and deleted per capture."""

from __future__ import annotations

from pathlib import Path

from repo_helpers import init_repo, write


async def test_warm_checkpoints_rename_one_cookie_file_instead_of_making_one_each(watched_engine, tmp_path):
    repo = init_repo(tmp_path / "r", ("a.txt", "a\n"))
    here = {"path": str(repo)}
    await watched_engine.call("checkpoint", here)
    state = next(iter(watched_engine.registry.worktrees.values()))
    cookies = Path(state.info.state_dir, "cookies")
    seen: set[tuple[str, int]] = set()
    for turn in range(5):
        write(repo / "a.txt", f"turn {turn}\n")
        result = await watched_engine.call("checkpoint", here)
        assert result["stats"]["scan"] == "watch"  # the cookie came back: the capture trusted the watcher
        (entry,) = cookies.iterdir()
        seen.add((entry.name, entry.stat().st_ino))
    assert len({name for name, _ in seen}) == 5  # a new name at each sync, so no event is mistaken for another
    assert len({inode for _, inode in seen}) == 1
