"""Taking a worktree's tree, warm from the watcher's dirty paths or cold from one ``git ls-files`` scan."""
