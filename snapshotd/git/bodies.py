"""Object bodies as git and libgit2 write them: a tree's entries in git's order, a commit's headers.

The bytes :func:`snapshotd.git.loose.write_object` hashes and stores; tested
against ``git hash-object``, libgit2's commits and ``git fsck --strict``.
"""

from __future__ import annotations

from collections.abc import Iterable

import pygit2

from snapshotd.git.modes import MODE_EXEC, MODE_FILE, MODE_GITLINK, MODE_LINK, MODE_TREE

SHA1_BYTES = 20
_CANONICAL_MODES = {b"%o" % mode: mode for mode in (MODE_FILE, MODE_EXEC, MODE_LINK, MODE_GITLINK, MODE_TREE)}


def tree_body(entries: Iterable[tuple[bytes, int, bytes]]) -> bytes:
    """A tree object's body from (name, mode, raw id) entries, in git's order (a folder sorts as ``name/``)."""
    ordered = sorted(
        entries, key=lambda entry: entry[0] + b"/" if entry[1] == MODE_TREE else entry[0]
    )
    return b"".join(b"%o %s\0%s" % (mode, name, raw_id) for name, mode, raw_id in ordered)


def tree_entries(body: bytes) -> dict[bytes, tuple[int, bytes]]:
    """A SHA-1 tree's body as {name: (mode, raw id)}, each mode as git reads it into an index (``100664`` is
    ``100644``: an old git's mode is written as git writes it now)."""
    entries: dict[bytes, tuple[int, bytes]] = {}
    start, end = 0, len(body)
    while start < end:
        space = body.index(b" ", start)
        nul = body.index(b"\0", space)
        stored = body[start:space]
        mode = _CANONICAL_MODES.get(stored)
        start = nul + 1 + SHA1_BYTES
        entries[body[space + 1:nul]] = (_normalized_mode(int(stored, 8)) if mode is None else mode, body[nul + 1:start])
    return entries


def _normalized_mode(mode: int) -> int:
    """The mode git's ``read-tree`` gives an entry stored otherwise than git writes it now (``canon_mode``)."""
    kind = mode & 0o170000
    if kind == 0o100000:
        return MODE_EXEC if mode & 0o100 else MODE_FILE
    return kind if kind in (MODE_LINK, MODE_TREE) else MODE_GITLINK


def signature_text(signature: pygit2.Signature) -> str:
    """An author or committer line's value as git and libgit2 write it."""
    offset = int(signature.offset)
    sign = "-" if offset < 0 else "+"
    hours, minutes = divmod(abs(offset), 60)
    return (
        f"{signature.name} <{signature.email}> {int(signature.time)} {sign}{hours:02d}{minutes:02d}"
    )


def commit_body(
    tree: str,
    parents: Iterable[str],
    author: pygit2.Signature,
    committer: pygit2.Signature,
    message: str,
    encoding: str | None = None,
) -> bytes:
    """A commit object's body as libgit2's ``git_commit_create`` writes it (ids in hex)."""
    lines = [f"tree {tree}", *(f"parent {parent}" for parent in parents)]
    lines.append(f"author {signature_text(author)}")
    lines.append(f"committer {signature_text(committer)}")
    if encoding is not None:
        lines.append(f"encoding {encoding}")
    return "\n".join(lines).encode("utf-8") + b"\n\n" + message.encode(encoding or "utf-8")
