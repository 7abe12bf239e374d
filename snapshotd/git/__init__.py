"""The git back-end chosen once per repository, git processes and the spawn helper, and git's own rules."""
