"""Object bodies as git and libgit2 write them: a tree's entries in git's order, a commit's headers.

The bytes :func:`snapshotd.git.loose.write_object` hashes and stores; tested
against ``git hash-object``, libgit2's commits and ``git fsck --strict``.
"""

from __future__ import annotations

from collections.abc import Iterable

import pygit2

from snapshotd.git.modes import MODE_TREE


def tree_body(entries: Iterable[tuple[bytes, int, pygit2.Oid]]) -> bytes:
    """A tree object's body from (name, mode, id) entries, in git's order (a folder sorts as ``name/``)."""
    ordered = sorted(
        entries, key=lambda entry: entry[0] + b"/" if entry[1] == MODE_TREE else entry[0]
    )
    return b"".join(b"%o %s\0%s" % (mode, name, oid.raw) for name, mode, oid in ordered)


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
