"""How long git abbreviates object ids by default in a repository: ``core.abbrev``'s ``auto``.

git sizes an abbreviation by the repository's objects, so that two ids
rarely share one (object-name.c): the highest bit of the approximate count
of packed objects, plus one, halved and rounded up, and never under 7. A
repository of 16,384 packed objects or more prints 8 digits (``index
c785302e..ace005cc``) where libgit2 always prints 7; a set ``core.abbrev``
is a length libgit2 follows too.
"""

from __future__ import annotations

import glob
import os
import struct

from snapshotd.git.config import ConfigLookup, config_value

__all__ = ["FALLBACK_ABBREV", "auto_abbrev"]

FALLBACK_ABBREV = 7
_IDX_V2 = b"\377tOc\x00\x00\x00\x02"


def auto_abbrev(git_dir: str, config: ConfigLookup, hex_length: int) -> int | None:
    """The length git gives abbreviated ids in ``git_dir`` when ``core.abbrev`` is unset, ``auto`` or ``no``
    (``hex_length``, whole ids); None when it names a length, which libgit2 follows itself."""
    setting = (config_value(config, "core.abbrev") or "auto").strip().lower()
    if setting in ("no", "false", "off", "0"):
        return hex_length
    if setting != "auto":
        return None
    count = packed_objects(git_dir)
    length = (count.bit_length() + 1) // 2 if count else 0  # bit_length is the highest bit's index + 1
    return max(length, FALLBACK_ABBREV)


def packed_objects(git_dir: str) -> int:
    """The objects every pack index of ``git_dir`` counts (git's approximate object count; loose ones not)."""
    total = 0
    for path in glob.glob(os.path.join(glob.escape(git_dir), "objects", "pack", "*.idx")):
        try:
            with open(path, "rb") as handle:
                head = handle.read(8 + 256 * 4)
        except OSError:
            continue
        if len(head) == 8 + 256 * 4 and head[:8] == _IDX_V2:
            total += struct.unpack(">I", head[-4:])[0]  # the fan-out table's last entry: the pack's count
    return total
