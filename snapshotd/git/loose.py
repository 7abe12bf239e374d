"""Loose objects written from Python, and made durable before a reference names them.

pygit2 keeps the interpreter's lock while libgit2 writes an object
(``TreeBuilder.write``, ``create_commit``: a file made, written, renamed, and
every entry looked up first). Under a few hundred sessions the daemon's one
Python core spent a third of its time waiting there on the disk. Here an
object's bytes are hashed and compressed in Python and its file is written
with ``os`` calls, which let go of the lock: the format is git's own
(``<kind> <size>\\0<body>``, zlib, in ``objects/xx/``, read-only, written
under a temporary name and renamed).

Durability: :func:`make_durable` flushes the store's file system before a
reference names what was written, one ``syncfs`` shared by every caller
waiting at that moment (group commit). An fsync of each object file written
instead was measured ten times slower on the project's busy 2-core machines
(10 small files: 28 ms median against 2.6 ms for one ``syncfs``): each fsync
is a flush of the disk's cache of its own there.

Where there is no ``syncfs`` (macOS, the BSDs, a sandbox refusing it,
``SNAPSHOTD_DISABLE=syncfs``), what was written is flushed instead: each
object file here is fsynced before its rename and its folder after, and
libgit2 is told to do the same with what it writes (:func:`fsync_each_write`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import threading
import zlib
from collections.abc import Iterable

import pygit2

from snapshotd import facilities
from snapshotd.fsutil import fsync_dir
from snapshotd.git.flush import sync_filesystem
from snapshotd.git.modes import MODE_TREE

COMPRESSION = 1  # zlib level: libgit2's for loose objects


class _Flushes:
    """Group commit of one store's flushes: a caller waits for a flush that began after it asked."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.started = 0
        self.finished = 0
        self.running = False


_libgit2_fsyncs = False


def fsync_each_write() -> bool:
    """Whether each object is flushed as it is written (no ``syncfs`` here); if so, libgit2's writes are too."""
    global _libgit2_fsyncs
    if facilities.available("syncfs"):
        return False
    if not _libgit2_fsyncs:
        pygit2.settings.enable_fsync_gitdir(True)  # its blobs, packs and refs: fsynced with their folders
        _libgit2_fsyncs = True
    return True


_stores: dict[str, _Flushes] = {}
_stores_lock = threading.Lock()


def _flushes(git_dir: str) -> _Flushes:
    key = os.path.normpath(git_dir)
    with _stores_lock:
        found = _stores.get(key)
        if found is None:
            found = _stores[key] = _Flushes()
        return found


def write_object(git_dir: str, kind: str, body: bytes, odb: pygit2.Odb | None = None) -> pygit2.Oid:
    """Store one object of ``kind`` (a SHA-1 repository's) as a loose file unless it is there; its id.

    ``odb``, when given, is asked too, so an object already packed is not written again.
    """
    data = f"{kind} {len(body)}\0".encode("ascii") + body
    hex_id = hashlib.sha1(data).hexdigest()
    oid = pygit2.Oid(hex=hex_id)
    folder = os.path.join(git_dir, "objects", hex_id[:2])
    path = os.path.join(folder, hex_id[2:])
    if os.path.exists(path):
        return oid
    if odb is not None and oid in odb:
        return oid  # packed
    compressed = zlib.compress(data, COMPRESSION)
    made = False
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder)
        made = True
    each = fsync_each_write()
    temporary = os.path.join(folder, f"tmp_obj_{os.getpid()}_{secrets.token_hex(6)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o444)
    try:
        view = memoryview(compressed)
        while view:
            view = view[os.write(fd, view) :]
        if each:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    os.close(fd)
    os.rename(temporary, path)  # the same bytes if another writer got there first
    if each:
        fsync_dir(folder)
        if made:
            fsync_dir(os.path.dirname(folder))
    return oid


def tree_body(entries: Iterable[tuple[bytes, int, pygit2.Oid]]) -> bytes:
    """A tree object's body from (name, mode, id) entries, in git's order (a folder sorts as ``name/``)."""
    ordered = sorted(entries, key=lambda entry: entry[0] + b"/" if entry[1] == MODE_TREE else entry[0])
    return b"".join(b"%o %s\0%s" % (mode, name, oid.raw) for name, mode, oid in ordered)


def signature_text(signature: pygit2.Signature) -> str:
    """An author or committer line's value as git and libgit2 write it."""
    offset = int(signature.offset)
    sign = "-" if offset < 0 else "+"
    hours, minutes = divmod(abs(offset), 60)
    return f"{signature.name} <{signature.email}> {int(signature.time)} {sign}{hours:02d}{minutes:02d}"


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


def make_durable(git_dir: str) -> None:
    """Every object written into the store before this call is on disk when it returns (before a ref names one).

    One ``syncfs`` serves every caller that asked before it began: while one
    runs, later callers wait and the next one flushes for all of them.
    Blocking: on a worker thread. Without ``syncfs`` each write was flushed
    as it was made (:func:`fsync_each_write`), so there is nothing left to do.
    """
    if fsync_each_write():
        return
    flushes = _flushes(git_dir)
    with flushes.cond:
        wanted = flushes.started + 1  # a flush that begins after this call
        while flushes.finished < wanted:
            if flushes.running:
                flushes.cond.wait()
                continue
            flushes.running = True
            flushes.started += 1
            mine = flushes.started
            flushes.cond.release()
            try:
                sync_filesystem(git_dir)
            finally:
                flushes.cond.acquire()
                flushes.running = False
                flushes.cond.notify_all()
            flushes.finished = mine
