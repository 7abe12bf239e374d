"""Files with several names (hard links): inotify names a write by the name it was made through only.

A capture that meets a regular file with a link count above one looks up its
other names in the index once; the warm state then re-checks every name by
stat at each capture, until one name is left.
"""

from __future__ import annotations

import os

import pygit2

from snapshotd.capture.walker import Walker
from snapshotd.git.modes import MODE_EXEC, MODE_FILE

__all__ = ["other_names"]


def other_names(index: pygit2.Index, files: set[tuple[int, int]], walker: Walker) -> set[str]:
    """The index's paths of the files ``(device, inode)``: those whose entries keep that inode (32 bits), and
    of the entries that keep none (captured since the user's index was read), those whose lstat says so."""
    get = pygit2.C.git_index_get_byindex
    pointer = index._index
    inodes = {ino & 0xFFFFFFFF for _, ino in files}
    found = set()
    for position in range(len(index)):
        entry = get(pointer, position)
        if (entry.ino in inodes or entry.ino == 0) and entry.mode in (MODE_FILE, MODE_EXEC):
            path = os.fsdecode(pygit2.ffi.string(entry.path))
            st = walker.lstat(path)
            if st is not None and (st.st_dev, st.st_ino) in files:
                found.add(path)
    return found
