"""Worktree identity: where a folder's worktree is, its git dirs, and its stable id.

A git worktree's id lives in its per-worktree git dir (``<git_dir>/snapshotd/id``),
so it moves with the worktree. A plain folder's id lives in the daemon's records
with the folder's device and inode, so a renamed folder is still recognised.
The records (``$SNAPSHOTD_HOME/worktrees.json``) list every known worktree for
``worktrees``, ``repair`` and for finding a checkpoint by id alone.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pygit2

from snapshotd.errors import (
    NotADirectory,
    NotFound,
    PathOutsideWorktree,
    Unsupported,
)
from snapshotd.fsutil import atomic_write, check_private_home, checked_private_folder, file_lock
from snapshotd.git.format import object_format
from snapshotd.git.ownership import check_repository_owner
from snapshotd.store.statedir import (
    claim_id,
    open_state_folder,
    read_id,
    read_id_of,
    state_folder,
    unreadable,
)

__all__ = ["Located", "Records", "WorktreeInfo", "check_still_trusted", "identify", "locate", "read_gitfile", "unreadable"]


@dataclass(frozen=True)
class WorktreeInfo:
    """Where one worktree is and where its checkpoints are stored."""

    id: str
    path: str
    kind: str  # "git" or "plain"
    git_dir: str | None
    common_dir: str | None
    store_dir: str  # the repository holding the checkpoints
    state_dir: str  # snapshotd's own per-worktree files (temp indexes, journals)
    home: str  # snapshotd's data folder, never part of a capture

    def to_wire(self, head: str | None, branch: str | None, watching: bool) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path,
            "kind": self.kind,
            "git_dir": self.git_dir,
            "common_dir": self.common_dir,
            "head": head,
            "branch": branch,
            "watching": watching,
        }


@dataclass(frozen=True)
class Located:
    """What walking up from a path found: the worktree root and its git dir, if any."""

    root: str
    git_dir: str | None
    common_dir: str | None


def new_worktree_id() -> str:
    return "wt_" + secrets.token_hex(8)


def read_gitfile(dotgit: str | os.PathLike[str]) -> str | None:
    """The admin folder a ``.git`` file names (absolute, normalized), or None (a folder, a link, nothing there)."""
    dotgit = os.fspath(dotgit)
    try:
        if not stat.S_ISREG(os.lstat(dotgit).st_mode):
            return None
        with open(dotgit, "rb") as handle:
            text = handle.read().decode("utf-8", "surrogateescape")
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    target = text[len("gitdir:") :].strip()
    return os.path.normpath(os.path.join(os.path.dirname(dotgit), target))


def _common_dir(git_dir: str) -> str:
    try:
        with open(os.path.join(git_dir, "commondir"), "rb") as handle:
            rel = os.fsdecode(handle.read().strip())
    except OSError:
        return git_dir
    return os.path.normpath(os.path.join(git_dir, rel))


def is_git_directory(folder: Path) -> bool:
    """Whether ``folder`` is itself a git folder (a bare repository), by the test git's discovery makes.

    It holds ``objects`` and ``refs`` folders and a ``HEAD`` that is a
    symbolic ref to ``refs/`` or a commit id.
    """
    if not (folder / "objects").is_dir() or not (folder / "refs").is_dir():
        return False
    try:
        head = (folder / "HEAD").read_bytes()[:256].strip()
    except OSError:
        return False
    if head.startswith(b"ref:"):
        return head[4:].strip().startswith(b"refs/")
    return len(head) in (40, 64) and all(chr(byte) in "0123456789abcdef" for byte in head)


def locate(path: str) -> Located:
    """Find the worktree holding ``path`` the way git discovers it (a ``.git`` above it)."""
    real = os.path.realpath(path)
    try:
        mode = os.stat(real).st_mode  # one look: a folder deleted between two is not called a file
    except OSError:
        raise NotFound(f"The path {path} does not exist.") from None
    if not stat.S_ISDIR(mode):
        raise NotADirectory(f"The path {path} is not a folder.")
    if ".git" in real.split(os.sep):
        raise PathOutsideWorktree(f"The path {path} is inside a .git folder, not a worktree.")
    current = real
    while True:
        dotgit = os.path.join(current, ".git")
        try:
            found = os.stat(dotgit).st_mode
        except OSError:
            found = 0
        if stat.S_ISDIR(found) and os.path.exists(os.path.join(dotgit, "HEAD")):
            return _trusted(current, dotgit, ())
        if stat.S_ISREG(found):
            git_dir = read_gitfile(dotgit)
            if git_dir and os.path.isdir(git_dir):
                return _trusted(current, git_dir, (dotgit,))
            if git_dir and not os.path.lexists(git_dir):
                raise NotFound(
                    f"The worktree at {current} is linked to the git folder {git_dir}, which is gone: its "
                    f"repository moved or was deleted, or 'git worktree prune' dropped it while the worktree was "
                    f"away. Run 'snapshotd repair {current}' if they moved together, or 'git worktree repair "
                    f"{current}' from the repository's new place; a pruned one is made anew with 'git worktree add'.",
                    path=current,
                )
        if is_git_directory(Path(current)):
            raise PathOutsideWorktree(
                f"The path {path} is in the bare repository {current}, which has no worktree to capture; "
                "give a worktree of it instead ('git worktree add' makes one).",
                path=current,
            )
        parent = os.path.dirname(current)
        if parent == current:
            return Located(real, None, None)
        current = parent


def _trusted(root: str, git_dir: str, gitfiles: tuple[str, ...]) -> Located:
    """The repository found at ``root``, once git's ownership rule allows it (see :mod:`.ownership`).

    Checked before its config or anything else of it is read: the worktree,
    the ``.git`` file that led here, the git dir and the common dir.
    """
    check_repository_owner(root, [*gitfiles, root, git_dir])
    common_dir = _common_dir(git_dir)
    if common_dir != git_dir:
        check_repository_owner(root, [common_dir])
    return Located(root, git_dir, common_dir)


def check_still_trusted(info: WorktreeInfo) -> None:
    """The ownership rule again, for a worktree already open and now asked for by id alone.

    Its folder may have been deleted and made again by another user since it
    was opened: a capture there would run that user's filters as this user.
    """
    if info.git_dir is None:
        return
    dotgit = os.path.join(info.path, ".git")
    paths = [dotgit] if os.path.isfile(dotgit) else []
    paths += [info.path, info.git_dir, *([info.common_dir] if info.common_dir not in (None, info.git_dir) else [])]
    check_repository_owner(info.path, paths)


class Records:
    """The daemon's list of known worktrees, shared by every snapshotd process of a user."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.path = home / "worktrees.json"
        self._lock_path = home / "worktrees.lock"

    def _ensure(self) -> None:
        check_private_home(self.home, create=True)

    def load(self) -> dict[str, dict[str, Any]]:
        """Every record; none when the file does not exist yet.

        A file that exists but cannot be read or parsed is an error: rewriting
        it would orphan the stores of every worktree it lists.
        """
        try:
            check_private_home(self.home, create=False)
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise unreadable(self.path, exc) from exc
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise unreadable(self.path, "it is not valid JSON") from exc
        if not isinstance(data, dict):
            raise unreadable(self.path, "it does not hold a JSON object")
        return data

    def path_of(self, worktree_id: str) -> str:
        """Where the records put the worktree ``worktree_id`` (its id when they hold no path for it)."""
        return str(self.load().get(worktree_id, {}).get("path") or worktree_id)

    def claim_folder(self, root: str, st: os.stat_result, claim: str) -> str:
        """Find or create the id of a folder known by its records alone (plain folders, copies).

        Done under the records lock so two processes meeting the folder agree on one id.
        """
        self._ensure()
        with file_lock(self._lock_path):
            data = self.load()
            worktree_id = _folder_id_for(data, root, claim)
            if worktree_id is None:
                worktree_id = new_worktree_id()
            record = data.get(worktree_id, {})
            if record.get("path") != root or record.get("claim") != claim:
                data[worktree_id] = {**record, "claim": claim, "path": root, "dev": st.st_dev, "ino": st.st_ino}
                atomic_write(self.path, json.dumps(data, indent=1, sort_keys=True).encode(), 0o600)
            return worktree_id

    def update(self, worktree_id: str, record: dict[str, Any] | None) -> None:
        """Set (or with None, drop) one record under the records lock."""
        self._ensure()
        with file_lock(self._lock_path):
            data = self.load()
            if record is None:
                data.pop(worktree_id, None)
            else:
                data[worktree_id] = record
            atomic_write(self.path, json.dumps(data, indent=1, sort_keys=True).encode(), 0o600)


def _folder_id_for(known: dict[str, dict[str, Any]], root: str, claim: str) -> str | None:
    """The id recorded for the folder at ``root``: by path, or by device and inode after a rename."""
    for candidate_id, record in known.items():
        if record.get("claim") == claim and record.get("path") == root:
            return candidate_id
    for candidate_id, record in known.items():
        if record.get("claim") == claim and _same_folder(record, root) and not os.path.isdir(record.get("path", "")):
            return candidate_id
    return None


def _copy_of_linked_worktree(located: Located) -> bool:
    """True for a copy of a linked worktree: git's back link names another live folder using our admin dir."""
    git_dir, common = located.git_dir, located.common_dir
    if git_dir is None or common is None or os.path.realpath(git_dir) == os.path.realpath(common):
        return False
    try:
        backlink = Path(git_dir, "gitdir").read_text().strip()
    except OSError:
        return False
    owner = os.path.dirname(os.path.normpath(backlink))
    if os.path.realpath(owner) == os.path.realpath(located.root) or not os.path.isfile(backlink):
        return False
    owner_git_dir = read_gitfile(Path(backlink))
    return owner_git_dir is not None and os.path.realpath(owner_git_dir) == os.path.realpath(git_dir)


def _is_copy(other: dict[str, Any], st: os.stat_result) -> bool:
    """Whether the worktree recorded as ``other`` (same id, another path) is the original of this one.

    While the original folder is in place and still holds the id, this is a
    copy. Once it is gone, a move kept the folder's inode and a copy did not
    (a move across file systems looks like a copy: a fresh id, never a shared one).
    """
    if os.path.isdir(other.get("path", "")):
        return read_id_of(other.get("git_dir") or "/nonexistent") == other.get("id")
    return "ino" in other and (other.get("dev"), other.get("ino")) != (st.st_dev, st.st_ino)


def _same_folder(record: dict[str, Any], path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return record.get("dev") == st.st_dev and record.get("ino") == st.st_ino


def _own_id(git_dir: str, known: dict[str, dict[str, Any]], root: str, st: os.stat_result) -> str:
    """The id a git worktree keeps in its git dir, given one on first sight (or when a copy shares it)."""
    folder = state_folder(git_dir)
    fd = open_state_folder(git_dir)  # checked before anything is written through it
    try:
        worktree_id = read_id(fd, folder)
        other = known.get(worktree_id) if worktree_id else None
        if worktree_id and other is not None and other.get("path") != root and _is_copy(other, st):
            # a copy (cp -a) holds the id too: never share it
            return claim_id(fd, folder, new_worktree_id(), replace=True)
        if worktree_id is None:
            return claim_id(fd, folder, new_worktree_id(), replace=False)
        return worktree_id
    finally:
        os.close(fd)


def _refuse_own_data(root: str, home: Path) -> None:
    """A plain folder at or inside snapshotd's home is refused: its records, stores and page tokens are no project."""
    own = os.path.realpath(home)
    if root == own or root.startswith(own.rstrip("/") + "/"):
        raise PathOutsideWorktree(
            f"The path {root} is in snapshotd's own data folder {own}, which is never captured; "
            "give a folder of your project instead.",
            path=root,
        )


def identify(located: Located, records: Records) -> WorktreeInfo:
    """Give the located worktree its stable id, creating one on first sight."""
    home = records.home
    root = located.root
    st = os.stat(root)
    known = records.load()
    if located.git_dir is not None:
        fmt = object_format(located.common_dir or located.git_dir)
        if fmt not in ("sha1", "sha256"):
            raise Unsupported(f"The repository at {root} uses the object format {fmt!r}, which snapshotd does not know.")
        state_dir = state_folder(located.git_dir)
        if _copy_of_linked_worktree(located):
            # Its .git file names another folder's admin dir: the id there is not ours.
            claim = "git-copy"
            worktree_id = records.claim_folder(root, st, claim)
            state_dir = home / "state" / worktree_id
        else:
            claim = None
            worktree_id = _own_id(located.git_dir, known, root, st)
        info = WorktreeInfo(
            id=worktree_id,
            path=root,
            kind="git",
            git_dir=located.git_dir,
            common_dir=located.common_dir,
            store_dir=located.common_dir or located.git_dir,
            state_dir=str(state_dir),
            home=str(home),
        )
    else:
        _refuse_own_data(root, home)
        claim = "plain"
        worktree_id = records.claim_folder(root, st, claim)
        store_dir = home / "repos" / f"{worktree_id}.git"
        if not (store_dir / "HEAD").exists():
            checked_private_folder(store_dir.parent, 1)
            pygit2.init_repository(str(store_dir), bare=True)
        state_dir = home / "state" / worktree_id
        info = WorktreeInfo(
            id=worktree_id,
            path=root,
            kind="plain",
            git_dir=None,
            common_dir=None,
            store_dir=str(store_dir),
            state_dir=str(state_dir),
            home=str(home),
        )
    # Made 0700 through descriptors of folders already checked to be ours, never through a link.
    checked_private_folder(Path(info.state_dir, "tmp"), 2 if claim is None else 3)
    record = {**asdict(info), "dev": st.st_dev, "ino": st.st_ino, "claim": claim}
    if known.get(info.id) != record:
        records.update(info.id, record)
    return info
