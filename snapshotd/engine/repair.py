"""Worktree-move repair: the id and checkpoints follow a worktree to its new path.

Git's own links are mended with ``git worktree repair`` (the back link in
``.git/worktrees/<name>/gitdir`` and each linked worktree's ``.git`` file); the
daemon's records are mended by re-identifying the worktree at its new path,
where its id file (in its git dir) or its device and inode (plain folders)
says who it is.

Kinds of move handled:

* ``git worktree move``: git already knows the new path; ``repair`` with no
  path finds it through the admin folder's ``gitdir`` file.
* a linked worktree moved with ``mv``: its ``.git`` file still names its admin
  folder, so the worktree is found at the path given, and git's back link is
  mended.
* a whole repository moved with its linked worktrees: each linked worktree's
  ``.git`` file names an admin folder that is gone. The repository is looked
  for where the records say it was relative to the worktree, and linked
  worktrees are looked for where they were relative to the main one; a
  candidate counts only if its ``.git`` file names the expected admin folder.
* a plain folder renamed: recognised by its device and inode.

A folder that merely looks like a known worktree is never taken for it: a
copy of a linked worktree whose original is still in place is left alone (a
``git worktree repair`` there would steal the original's admin folder).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from snapshotd.errors import NotFound, SnapshotdError
from snapshotd.git.ownership import check_repository_owner
from snapshotd.git.process import GitTarget, run_git
from snapshotd.store.identity import Records, WorktreeInfo, identify, locate, read_gitfile
from snapshotd.threads import thread_limiter


class Registry(Protocol):
    """What repair needs of the open worktrees: their records, and re-opening one at its new path."""

    records: Records

    def open_path(self, path: str) -> Any: ...


@dataclass(frozen=True)
class Move:
    """One worktree whose recorded path changed."""

    worktree: str
    old_path: str | None
    new_path: str

    def to_wire(self) -> dict[str, Any]:
        return {"worktree": self.worktree, "from": self.old_path, "to": self.new_path}


@dataclass(frozen=True)
class RepairResult:
    """The worktrees a ``repair`` found moved, and those whose git links it mended (moved or not)."""

    moved: list[Move]
    mended: list[tuple[str, str]]  # (worktree id, path)

    def to_wire(self) -> dict[str, Any]:
        return {
            "moved": [move.to_wire() for move in self.moved],
            "mended": [{"worktree": worktree, "path": path} for worktree, path in self.mended],
        }


def _linked_root(git_dir: str) -> str | None:
    """Where git itself says a linked worktree now is (``git worktree move`` updates this)."""
    try:
        dotgit = Path(git_dir, "gitdir").read_text().strip()
    except OSError:
        return None
    root = os.path.dirname(dotgit)
    return root if os.path.isdir(root) else None


def _is_linked(info: WorktreeInfo) -> bool:
    return info.git_dir is not None and info.common_dir is not None and info.git_dir != info.common_dir


def _back_link_stale(git_dir: str, root: str) -> bool:
    """True when git's admin folder of a linked worktree does not name the worktree at ``root``.

    git then lists it as prunable, and ``git worktree prune`` (which ``git gc``
    runs) would delete the admin folder, and the worktree with it for git.
    """
    try:
        named = Path(git_dir, "gitdir").read_text().strip()
    except OSError:
        return False
    return not _same_path(named, os.path.join(root, ".git"))


def _stale_linked(records: dict[str, dict[str, Any]]) -> list[str]:
    """Known linked worktrees at their recorded path whose git back link names another place."""
    return [
        record["path"]
        for record in records.values()
        if record.get("kind") == "git"
        and record.get("git_dir")
        and not _same_path(record.get("git_dir"), record.get("common_dir"))
        and os.path.isdir(record.get("path", ""))
        and _back_link_stale(record["git_dir"], record["path"])
    ]


def _same_path(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and os.path.normpath(a) == os.path.normpath(b)


def _relocate(old_path: str, old_anchor: str, new_anchor: str) -> str:
    """``old_path`` moved the way ``old_anchor`` moved to ``new_anchor``."""
    return os.path.normpath(os.path.join(new_anchor, os.path.relpath(old_path, old_anchor)))


def _broken_link(path: str) -> tuple[str, str] | None:
    """``(root, admin)`` when ``path`` is in a linked worktree whose admin folder is gone."""
    current = Path(os.path.realpath(path))
    while True:
        dotgit = current / ".git"
        if dotgit.is_dir():
            return None
        admin = read_gitfile(dotgit)
        if admin is not None:
            return None if os.path.isdir(admin) else (str(current), admin)
        if current.parent == current:
            return None
        current = current.parent


def _admin_parts(admin: str) -> tuple[str, str] | None:
    """``(common_dir, name)`` of an admin folder ``<common_dir>/worktrees/<name>``."""
    folder, name = os.path.split(os.path.normpath(admin))
    common, worktrees = os.path.split(folder)
    return (common, name) if worktrees == "worktrees" and name else None


def _moved_repository(root: str, admin: str, known: dict[str, dict[str, Any]]) -> tuple[str, str | None] | None:
    """Where the repository of the linked worktree at ``root`` went, if it moved along.

    Returns ``(common_dir, main worktree path or None)`` at the new place.
    """
    parts = _admin_parts(admin)
    if parts is None:
        return None
    old_common, name = parts
    for record in known.values():
        if record.get("kind") != "git" or not _same_path(record.get("git_dir"), admin):
            continue
        old_root = record.get("path")
        if not old_root:
            continue
        common = _relocate(old_common, old_root, root)
        if not os.path.isdir(os.path.join(common, "worktrees", name)):
            continue
        main = None
        for other in known.values():
            if _same_path(other.get("git_dir"), old_common) and other.get("path"):
                candidate = _relocate(other["path"], old_root, root)
                if os.path.isdir(candidate):
                    main = candidate
        if main is None and os.path.basename(common) == ".git":
            main = os.path.dirname(common)
        return common, main
    return None


def _moved_along(info: WorktreeInfo, old: dict[str, Any] | None, known: dict[str, dict[str, Any]]) -> list[str]:
    """New paths of linked worktrees that moved together with the main worktree ``info``."""
    if old is None or info.common_dir is None or _is_linked(info):
        return []
    old_main, old_common = old.get("path"), old.get("common_dir")
    if not old_main or not old_common or _same_path(old_main, info.path):
        return []
    found = []
    for record in known.values():
        git_dir, path = record.get("git_dir"), record.get("path")
        if record.get("kind") != "git" or not git_dir or not path:
            continue
        if not _same_path(record.get("common_dir"), old_common) or _same_path(git_dir, old_common):
            continue
        if os.path.isdir(path):
            continue  # it did not move
        candidate = _relocate(path, old_main, info.path)
        name = os.path.basename(os.path.normpath(git_dir))
        target = read_gitfile(Path(candidate, ".git"))
        if target is not None and (
            _same_path(target, git_dir) or _same_path(target, os.path.join(info.common_dir, "worktrees", name))
        ):
            found.append(candidate)
    return found


def _is_copy_of_linked(root: str) -> bool:
    """Whether ``root`` is a copy of a linked worktree whose original is still in place."""
    admin = read_gitfile(Path(root, ".git"))
    if admin is None or _admin_parts(admin) is None:
        return False
    registered = _linked_root(admin)
    if registered is None or os.path.realpath(registered) == os.path.realpath(root):
        return False
    return _same_path(read_gitfile(Path(registered, ".git")), admin)


async def _git_repair(common_dir: str, main: str | None, paths: list[str]) -> None:
    """Run ``git worktree repair`` from the repository (in its main worktree when known).

    The repository may be one found by following records to a new place, so
    it passes git's ownership rule first, as every repository snapshotd uses.
    """
    folders = [folder for folder in (main, common_dir) if folder is not None]
    await trio.to_thread.run_sync(check_repository_owner, main or common_dir, folders, limiter=thread_limiter)
    await run_git(GitTarget(git_dir=common_dir, work_tree=main), ["worktree", "repair", *paths])


async def _mend_git_links(info: WorktreeInfo, records: Records, extra: list[str]) -> None:
    """Run ``git worktree repair`` so git's links match where the worktrees are now."""
    if info.common_dir is None:
        return
    if _is_linked(info):
        await _git_repair(info.common_dir, None, [info.path])
        return
    # The main worktree (or the whole repository) moved: re-point every linked worktree we know.
    linked = [
        record["path"]
        for record in records.load().values()
        if _same_path(record.get("common_dir"), info.common_dir)
        and not _same_path(record.get("git_dir"), info.common_dir)
        and os.path.isdir(record.get("path", ""))
    ]
    paths = sorted({*linked, *extra})
    await _git_repair(info.common_dir, info.path, paths)


async def _refresh(registry: Registry, info: WorktreeInfo) -> None:
    """Point the registry's state for ``info.id`` at the new path; its watcher restarts there."""
    await trio.to_thread.run_sync(registry.open_path, info.path, limiter=thread_limiter)


async def repair(registry: Registry, path: str | None) -> RepairResult:
    """Find moved worktrees (the one at ``path``, or every known one git can trace).

    Returns one :class:`Move` per worktree whose path changed.
    """
    before = registry.records.load()
    queue: list[str] = []
    if path is not None:
        queue.append(path)
    else:
        for record in before.values():
            if os.path.isdir(record.get("path", "")):
                continue
            if record.get("kind") == "git" and record.get("git_dir"):
                root = _linked_root(record["git_dir"])
                if root is not None:
                    queue.append(root)
        queue.extend(_stale_linked(before))  # followed here already (a capture at the new path), not yet in git
    moved: list[Move] = []
    mended: list[tuple[str, str]] = []
    seen: set[str] = set()
    while queue:
        candidate = queue.pop(0)
        broken = _broken_link(candidate)
        if broken is not None:
            # A linked worktree whose repository moved too: mend it from the repository first.
            root, admin = broken
            found = _moved_repository(root, admin, before)
            if found is None:
                if path is not None and candidate == path:
                    raise NotFound(
                        f"The worktree at {root} names the git folder {admin}, which is gone; "
                        "run 'snapshotd repair' with the repository's new path.",
                        path=root,
                    )
                continue
            common, main = found
            await _git_repair(common, main, [root])
            if main is not None:
                queue.append(main)
        located = await trio.to_thread.run_sync(locate, candidate, limiter=thread_limiter)
        if located.root in seen:
            continue
        seen.add(located.root)
        if located.git_dir is not None and located.git_dir != located.common_dir and _is_copy_of_linked(located.root):
            continue  # a copy: mending it would take the original's place in git
        info = await trio.to_thread.run_sync(identify, located, registry.records, limiter=thread_limiter)
        old = before.get(info.id)
        along = _moved_along(info, old, before) if info.kind == "git" else []
        if info.kind == "git":
            stale = _is_linked(info) and info.git_dir is not None and _back_link_stale(info.git_dir, info.path)
            try:
                await _mend_git_links(info, registry.records, along)
            except SnapshotdError:
                if path is not None:
                    raise
            else:
                if stale:
                    mended.append((info.id, info.path))
        if old is not None and old.get("path") != info.path:
            moved.append(Move(info.id, old.get("path"), info.path))
        await _refresh(registry, info)
        queue.extend(along)
    return RepairResult(moved, mended)
