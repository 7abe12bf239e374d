"""One worktree's open repository, kept from one capture to the next: its store, and its HEAD.

A warm checkpoint opened a repository for its tree, one more for its record
and a third to read HEAD: each open reads the config (the object format),
finds the refs and pack indexes again and starts with an empty object cache.
The worktree keeps them open instead (object cache and pack windows kept),
its back-end chosen once, when it is first used: libgit2 for a SHA-1 store;
a store of another format is git's, opened per use as before (its reader is
a process). libgit2 maps each pack file once per process, so linked worktrees
of one repository share their packs. Used under the worktree's lock only (its
captures and records): a libgit2 repository is not for two threads at once.

Along with the store it keeps what the next checkpoint of each session needs
of its head pin (:mod:`snapshotd.store.heads`), used while the session's ref
still points at that pin, the check-ignore its warm captures ask about new
paths (:mod:`snapshotd.capture.ignores`) and the check-attr they ask for the
line-ending rules of files with a CR byte (:mod:`snapshotd.capture.eol`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pygit2

from snapshotd.capture.eol import AttributeOracle
from snapshotd.capture.ignores import IgnoreOracle
from snapshotd.git.libgit import LibgitRepository
from snapshotd.git.repository import (
    Head,
    Repository,
    head_of,
    libgit2_opens,
    open_repository,
    read_head,
    repository,
)
from snapshotd.store.heads import HeadCache
from snapshotd.store.identity import WorktreeInfo

__all__ = ["Resident"]


class Resident:
    """The repositories one worktree keeps open: the store (captures, records) and its own git dir (HEAD)."""

    def __init__(self) -> None:
        self._store: LibgitRepository | None = None
        self._store_dir: str | None = None
        self._in_process: bool | None = None
        self._head: pygit2.Repository | None = None
        self._git_dir: str | None = None
        self.heads = HeadCache()  # the sessions' heads as this store last recorded them
        self.ignores = IgnoreOracle()
        self.attributes = AttributeOracle()

    def in_process(self, info: WorktreeInfo) -> bool:
        """Whether libgit2 opens the worktree's store (SHA-1): decided once per store folder."""
        if self._in_process is None or self._store_dir != info.store_dir:
            self.close()
            self._store_dir = info.store_dir
            self._in_process = libgit2_opens(info.store_dir)
        return self._in_process

    def store(self, info: WorktreeInfo) -> LibgitRepository | None:
        """The store, open in-process; None when git works it (see the module)."""
        if not self.in_process(info):
            return None
        if self._store is None:
            repo = open_repository(info.store_dir)
            assert isinstance(repo, LibgitRepository)
            self._store = repo
        return self._store

    @contextlib.contextmanager
    def opened(self, info: WorktreeInfo) -> Iterator[Repository]:
        """The store for a block: this resident one where libgit2 opens it, else one of git's, ended with the block."""
        kept = self.store(info)
        if kept is not None:
            yield kept
            return
        with repository(info.store_dir) as repo:
            yield repo

    def head(self, info: WorktreeInfo) -> Head:
        """HEAD's commit and branch of the worktree (None, None for a plain folder)."""
        if info.git_dir is None:
            return None, None
        if not self.in_process(info):
            return read_head(info.git_dir, info.path, info.common_dir)
        if os.path.normpath(info.git_dir) == os.path.normpath(info.store_dir):
            store = self.store(info)
            assert store is not None
            return head_of(store)
        if self._head is None or self._git_dir != info.git_dir:
            try:
                self._head = pygit2.Repository(info.git_dir, pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
            except (pygit2.GitError, KeyError, ValueError):
                return None, None
            self._git_dir = info.git_dir
        return head_of(self._head)

    def carry_children(self, old: object, new: object, met_anew: set[str]) -> None:
        """Hand check-ignore and check-attr on from the warm state ``old`` to ``new``, whose rules are the same
        (:meth:`.WarmChild.carry`)."""
        self.ignores.carry(old, new, met_anew)
        self.attributes.carry(old, new, met_anew)

    def end_idle_children(self) -> None:
        """End check-ignore and check-attr if no capture asked them anything for a while (:data:`.IDLE_S`)."""
        self.ignores.end_if_idle()
        self.attributes.end_if_idle()

    def end_children(self) -> None:
        """End check-ignore and check-attr (each started anew at its next question)."""
        self.ignores.close()
        self.attributes.close()

    def close(self) -> None:
        """Let go of every repository and end the children (all started anew at the next use): after a
        prune, a move, or at the end."""
        self._store, self._head, self._git_dir, self._in_process = None, None, None, None
        self.heads = HeadCache()
        self.end_children()
