"""The local web page of ``snapshotd ui``: the timeline of every worktree, turn by turn, with diffs and reverts."""
