"""The index a patch reads ``.gitattributes`` from: only those entries of the repository's own index.

Each file's patch asks for its ``diff`` attribute (binary, a driver's hunk
headers) in the worktree's ``.gitattributes`` files and then in the index's,
and libgit2 loads the whole index for that: 200 to 600 ms for a
200,000-entry index, on every diff, however small. A lookup there only ever
finds a ``.gitattributes`` entry, so the patches are made by the repository
opened again with an index of just those entries (mostly none): the same
attributes, and the same patches.

Which entries they are is read once per state of the index file (its stat
data): in an index of version 2 or 3 a search of its bytes says when there
is none (:func:`mentions_attributes`); otherwise libgit2 reads it and its
entries are walked. A split index, or ``core.ignoreCase`` with such entries,
keeps the index as it is.
"""

from __future__ import annotations

import os

import pygit2

from snapshotd.git import capi
from snapshotd.git.libgit import LibgitRepository

__all__ = ["mentions_attributes", "patch_repository"]

ATTRIBUTES = b".gitattributes"
_SET_INDEX = "int (*)(git_repository *, git_index *)"
_CACHE_SIZE = 256
_FLAG_STAGE = 0x3000

Entries = tuple[tuple[str, pygit2.Oid, pygit2.enums.FileMode], ...]
_cache: dict[str, tuple[tuple[int, int, int, int], Entries]] = {}


def mentions_attributes(raw: bytes) -> bool | None:
    """Whether an index file's bytes hold a ``.gitattributes`` entry; None when its version (4) compresses paths.

    In versions 2 and 3 a path ends in NUL and is preceded by '/' or by the
    binary flags field, so a match is certain to be seen (and a false one
    only costs the walk).
    """
    version = int.from_bytes(raw[4:8], "big") if len(raw) >= 8 else 2
    if version >= 4:
        return None
    at = raw.find(ATTRIBUTES + b"\0", 12)
    while at != -1:
        before = raw[at - 1]
        if before == 0x2F or before < 0x20 or before >= 0x80:
            return True
        at = raw.find(ATTRIBUTES + b"\0", at + 1)
    return False


def patch_repository(repo: LibgitRepository) -> LibgitRepository:
    """``repo``, or the same repository opened again with an index of its own index's ``.gitattributes`` entries."""
    setter = capi.function("git_repository_set_index", _SET_INDEX)
    entries = _attribute_entries(repo.path) if setter is not None else None
    if entries is None or (entries and _ignores_case(repo)):
        return repo
    small = pygit2.Index()
    for path, oid, mode in entries:
        small.add(pygit2.IndexEntry(path, oid, mode))
    reader = LibgitRepository(repo.path, pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
    if setter(reader._repo, small._index) < 0:
        return repo
    return reader


def _ignores_case(repo: LibgitRepository) -> bool:
    try:
        return bool(repo.config.get_bool("core.ignorecase"))
    except (KeyError, pygit2.GitError, ValueError):
        return False


def _attribute_entries(git_dir: str) -> Entries | None:
    """The stage-0 ``.gitattributes`` entries of ``git_dir``'s index (none without one); None: use the index itself."""
    path = os.path.join(git_dir, "index")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ()  # libgit2 starts an empty index
    except OSError:
        return None
    signature = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _cache.get(path)
    if known is not None and known[0] == signature:
        return known[1]
    entries = _read_entries(git_dir, path)
    if entries is not None:
        if len(_cache) >= _CACHE_SIZE:
            _cache.clear()
        _cache[path] = (signature, entries)
    return entries


def _read_entries(git_dir: str, path: str) -> Entries | None:
    try:
        if any(name.startswith("sharedindex.") for name in os.listdir(git_dir)):
            return None  # a split index: its entries are in another file
        with open(path, "rb") as handle:
            raw = handle.read()
        if not raw.startswith(b"DIRC"):
            return None
        if mentions_attributes(raw) is False:
            return ()
        index = pygit2.Index(path)
    except (OSError, pygit2.GitError):
        return None
    found = []
    get = pygit2.C.git_index_get_byindex
    for position in range(len(index)):
        entry = get(index._index, position)
        name = pygit2.ffi.string(entry.path)
        if entry.flags & _FLAG_STAGE or not (name == ATTRIBUTES or name.endswith(b"/" + ATTRIBUTES)):
            continue
        try:
            text, mode = name.decode("utf-8"), pygit2.enums.FileMode(int(entry.mode))
        except (UnicodeDecodeError, ValueError):
            return None
        found.append((text, pygit2.Oid(raw=bytes(pygit2.ffi.buffer(entry.id.id, 20))), mode))
    return tuple(found)
