"""Checkpoints as git commits kept alive by pins and refs, tree diffs, and worktree identity."""
