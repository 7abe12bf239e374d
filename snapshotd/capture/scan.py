"""The cold scan's facts: git's tagged ``ls-files`` listing and the user's index read in-process.

git names the paths that changed, were removed, are untracked or flagged;
the index copy (seeded from the user's, keeping its mtime for git's racy
check) says which entries are flagged and whether a ``.gitattributes`` is tracked.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass

import pygit2
from pygit2.errors import check_error

from snapshotd.git.attrindex import mentions_attributes
from snapshotd.git.modes import MODE_GITLINK
from snapshotd.git.process import GitTarget
from snapshotd.store.identity import WorktreeInfo

LS_FILES = ["ls-files", "-z", "-v", "-m", "-d", "-o", "--exclude-standard"]
_INTERESTING = re.compile(rb"(?:^|\0)([^H\0]) ([^\0]*)")
_ATTRIBUTES = re.compile(rb"(?:^|\0). ((?:[^\0]*/)?\.gitattributes)(?=\0|$)")
FLAG_ASSUME_VALID = 0x8000
FLAG_EXTENDED_SKIP_WORKTREE = 0x4000


def attributes_in(listing: bytes) -> list[str]:
    """The ``.gitattributes`` files a tagged listing names (changed or untracked), sorted."""
    return sorted(os.fsdecode(match.group(1)) for match in _ATTRIBUTES.finditer(listing))


def parse_listing(listing: bytes) -> tuple[set[str], set[str], set[str], set[str]]:
    """Split tagged ``ls-files`` output into modified, removed, untracked and flagged paths."""
    modified: set[str] = set()
    removed: set[str] = set()
    untracked: set[str] = set()
    flagged: set[str] = set()
    for match in _INTERESTING.finditer(listing):
        tag = match.group(1)
        path = os.fsdecode(match.group(2))
        if tag == b"?":
            untracked.add(path)
        elif tag == b"C":
            modified.add(path)
        elif tag == b"R":
            removed.add(path)
        elif tag == b"S" or tag.islower():
            flagged.add(path)
        else:
            modified.add(path)  # unmerged ("M") and other tags: let the disk decide
    return modified, removed, untracked, flagged


def index_facts(index: pygit2.Index, raw: bytes) -> tuple[set[str], bool, set[str], list[str]]:
    """Entries flagged assume-unchanged or skip-worktree, whether a .gitattributes is tracked, the gitlinks,
    and the paths of the .gitattributes the index holds.

    Walks libgit2's entries through cffi (about 0.5 us an entry), which is far
    cheaper than having ``ls-files -c`` print every entry. Each entry's path is
    read only when the index's bytes may name a ``.gitattributes``.
    """
    flagged: set[str] = set()
    gitlinks: set[str] = set()
    attributes: dict[str, None] = {}  # in index order, once for a path in conflict
    get = pygit2.C.git_index_get_byindex
    pointer = index._index
    mentioned = mentions_attributes(raw)  # None: version 4 compresses paths, so its entries are walked instead
    for position in range(len(index)):
        entry = get(pointer, position)
        if entry.flags & FLAG_ASSUME_VALID or entry.flags_extended & FLAG_EXTENDED_SKIP_WORKTREE:
            flagged.add(os.fsdecode(pygit2.ffi.string(entry.path)))
        if entry.mode == MODE_GITLINK:
            gitlinks.add(os.fsdecode(pygit2.ffi.string(entry.path)))
        if mentioned is not False:
            path = pygit2.ffi.string(entry.path)
            if path == b".gitattributes" or path.endswith(b"/.gitattributes"):
                attributes[os.fsdecode(path)] = None
    tracked = bool(attributes) if mentioned is None else mentioned
    return flagged, tracked, gitlinks, list(attributes)


def seed_index(user_index: str, index_path: str) -> bool:
    """Copy the user's index to the capture's own file, keeping its mtime; False when there is none.

    A hard link would save the copy but changes the user's file (its ctime and
    link count), which watchers, including ours, see as a change to the index.
    """
    try:
        shutil.copy2(user_index, index_path)
    except FileNotFoundError:
        return False
    return True


def read_index(path: str | None) -> pygit2.Index:
    """Load an index file into memory (an empty index for None).

    Goes through libgit2 directly so that a file it cannot read (split or sparse
    index) raises GitError without leaving a half-built ``pygit2.Index`` behind.
    """
    if path is None:
        return pygit2.Index()
    cindex = pygit2.ffi.new("git_index **")
    check_error(pygit2.C.git_index_open(cindex, os.fsencode(path)))
    # pygit2's Index.from_c (pure Python) carries no annotations; what it returns is the Index built on cindex
    index: pygit2.Index = pygit2.Index.from_c(None, cindex)  # type: ignore[no-untyped-call]
    return index


@dataclass
class LoadedIndex:
    """The user's index read in-process, with the facts the capture needs from it."""

    index: pygit2.Index
    flagged: set[str]
    tracked_attributes: bool
    gitlinks: set[str]  # the user's index's gitlink paths
    attributes: list[str]  # the paths of its .gitattributes entries


def load_index(index_path: str | None) -> LoadedIndex | str:
    """Read the index copy (runs while git scans), once; the reason as a string if libgit2 cannot."""
    try:
        index = read_index(index_path)
    except pygit2.GitError as exc:
        return f"index not readable in-process ({exc})"
    raw = b""
    if index_path is not None:
        with open(index_path, "rb") as handle:
            raw = handle.read()
    flagged, tracked_attributes, gitlinks, attributes = index_facts(index, raw)
    return LoadedIndex(index, flagged, tracked_attributes, gitlinks, attributes)

def flag_kinds(listing: bytes) -> tuple[set[str], set[str]]:
    """Skip-worktree and assume-unchanged paths of a tagged ``ls-files -v`` listing."""
    skip: set[str] = set()
    valid: set[str] = set()
    for match in _INTERESTING.finditer(listing):
        tag = match.group(1)
        if tag in (b"S", b"s"):
            skip.add(os.fsdecode(match.group(2)))
        if tag.islower():
            valid.add(os.fsdecode(match.group(2)))
    return skip, valid

_WILDCARD = re.compile(r"([*?\[\\ ])")


def own_data_excludes(info: WorktreeInfo) -> list[str]:
    """``ls-files`` options that leave snapshotd's own data out of a scan of ``info``'s worktree.

    Its home (records and the repositories of plain folders) changes at every
    checkpoint, so a worktree holding it (a plain folder at ``$HOME``, say)
    would otherwise capture the store's new objects forever.
    """
    home = os.path.realpath(info.home)
    root = os.path.realpath(info.path)
    if not home.startswith(root.rstrip("/") + "/"):
        return []
    relative = os.path.relpath(home, root)
    return ["--exclude=/" + _WILDCARD.sub(r"\\\1", relative) + "/"]


def git_target(info: WorktreeInfo) -> GitTarget:
    return GitTarget(git_dir=info.git_dir or info.store_dir, work_tree=info.path)

