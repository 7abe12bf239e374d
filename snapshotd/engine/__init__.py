"""The method table and the open worktrees; each handler resolves, locks and calls a stage."""
