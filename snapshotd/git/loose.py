"""Loose objects written from Python, and made durable before a reference names them.

pygit2 keeps the interpreter's lock while libgit2 writes an object
(``TreeBuilder.write``, ``create_commit``: a file made, written, renamed, and
every entry looked up first). Under a few hundred sessions the daemon's one
Python core spent a third of its time waiting there on the disk. Here an
object's bytes are hashed and compressed in Python and its file is written
with ``os`` calls, which let go of the lock: the format is git's own
(``<kind> <size>\\0<body>``, zlib, in ``objects/xx/``, read-only, written
under a temporary name and renamed).

Durability: each object file written here is recorded, unflushed; before a
reference names what was written, :func:`make_durable` fsyncs those files,
and each distinct folder they were renamed into once (``objects/xx/``, and
``objects/`` when a folder was made) unless the file's fsync makes the rename
durable too (xfs, ext3/ext4 with a journal: :func:`~snapshotd.git.flush.fsync_covers_rename`;
there, under other writers, each folder's fsync was a journal commit of its own),
every file's writeback started before the
first fsync (:func:`~snapshotd.git.flush.start_writeback`: on a journaled file
system they then share one journal commit), one flush shared by every caller
waiting at that moment (group commit). A clean checkpoint so flushes two small files
(its commit and pin) and their folders, not the file system: a ``syncfs``
there also flushed every other process's dirty data, which on a busy disk
took hundreds of milliseconds inside the worktree's lock (bench/durability.py).

Objects written by libgit2 or git (a cold capture's ``write_tree``, a large
file streamed, git's filters, the fallback capture) are not followed file by
file: their writer holds :func:`written_elsewhere` around them, and the next
flush is a ``syncfs`` of that store's file system as before (``sync`` where
there is none: without ``syncfs`` libgit2 fsyncs its own writes, see
:func:`fsync_each_write`). Objects found already present and written by
another process (the user's git, which does not fsync loose objects unless
``core.fsync`` says so) are as durable as it made them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import threading
import zlib
from collections.abc import Iterator

import pygit2

from snapshotd import facilities
from snapshotd.fsutil import write_all
from snapshotd.git.flush import FDS_AT_ONCE, fsync_covers_rename, fsync_together, sync_filesystem
from snapshotd.git.packwrite import PackedObject, prepare_pack

COMPRESSION = 1  # zlib level: libgit2's for loose objects
PACK_AT_LEAST = 32  # new objects of one capture from which they are written as one pack, not loose files
PENDING_BYTES = 64 * 1024 * 1024  # bodies a batch holds before it writes them out as a pack


class _Flushes:
    """Group commit of the process's flushes: a caller waits for a flush that began after it asked."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.started = 0
        self.finished = 0
        self.running = False


class _Written:
    """What the next flush makes durable: files and folders written here, stores written to elsewhere."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held from an object's rename until it is recorded
        self.files: list[str] = []
        self.folders: set[str] = set()
        self.elsewhere: set[str] = set()  # git dirs written by libgit2 or git since the last flush
        self.busy: dict[str, int] = {}  # git dir: writes elsewhere under way
        self.counts: dict[str, int] = {}  # git dir: loose objects written here since :func:`take_written_count`

    def take(self) -> tuple[list[str], set[str], set[str]]:
        with self.lock:
            files, folders, elsewhere = self.files, self.folders, self.elsewhere
            self.files, self.folders = [], set()
            self.elsewhere = {git_dir for git_dir, count in self.busy.items() if count}  # flushed again after
            return files, folders, elsewhere


_libgit2_fsyncs = False


def fsync_each_write() -> bool:
    """Whether libgit2 is to fsync what it writes (no ``syncfs`` here to flush it); if so, it has been told."""
    global _libgit2_fsyncs
    if facilities.available("syncfs"):
        return False
    if not _libgit2_fsyncs:
        pygit2.settings.enable_fsync_gitdir(True)  # its blobs, packs and refs: fsynced with their folders
        _libgit2_fsyncs = True
    return True


_flushes = _Flushes()
_written = _Written()


@contextlib.contextmanager
def written_elsewhere(git_dir: str) -> Iterator[None]:
    """Around objects libgit2 or git writes into ``git_dir``: the flush after (or during) it is a ``syncfs``.

    Marked on entry and again on exit, and a flush that begins meanwhile marks
    the store again for the next one: whoever sees such an object and then
    asks for a flush gets one that covers it.
    """
    fsync_each_write()  # without syncfs, libgit2 fsyncs what it writes
    key = os.path.normpath(git_dir)
    with _written.lock:
        _written.busy[key] = _written.busy.get(key, 0) + 1
        _written.elsewhere.add(key)
    try:
        yield
    finally:
        with _written.lock:
            _written.busy[key] -= 1
            if not _written.busy[key]:
                del _written.busy[key]
            _written.elsewhere.add(key)


def with_header(kind: str, body: bytes) -> bytes:
    """An object as git hashes and stores it loose: ``<kind> <size>\\0`` then the body."""
    return f"{kind} {len(body)}\0".encode("ascii") + body


def write_object(
    git_dir: str, kind: str, body: bytes, odb: pygit2.Odb | None = None, batch: Batch | None = None
) -> pygit2.Oid:
    """Store one object of ``kind`` (a SHA-1 repository's) as a loose file unless it is there; its id.

    ``odb``, when given, is asked too, so an object already packed is not
    written again. ``batch``, when given, holds the new object to be written
    with the others of its capture (:class:`Batch`).
    """
    data = with_header(kind, body)
    digest = hashlib.sha1(data).digest()
    oid = pygit2.Oid(raw=digest)
    if batch is not None and digest in batch:
        return oid
    folder, path = _loose_path(git_dir, digest)
    if os.path.exists(path):
        _freshen(path)
        return oid
    if odb is not None and oid in odb:
        return oid  # packed
    if batch is not None:
        batch.add(PackedObject(digest, kind, body))
        return oid
    _write_loose(git_dir, folder, path, data)
    return oid


def _loose_path(git_dir: str, raw_id: bytes) -> tuple[str, str]:
    """The folder and the path of the loose object ``raw_id`` in ``git_dir``."""
    hex_id = raw_id.hex()
    folder = os.path.join(git_dir, "objects", hex_id[:2])
    return folder, os.path.join(folder, hex_id[2:])


_renames_covered: dict[str, bool] = {}  # git dir: whether a file's fsync makes its rename into objects/ durable


def _folders_need_fsync(git_dir: str) -> bool:
    """Whether the folders objects are renamed into in ``git_dir`` are fsynced too (:func:`fsync_covers_rename`)."""
    key = os.path.normpath(git_dir)
    covered = _renames_covered.get(key)
    if covered is None:
        covered = _renames_covered[key] = fsync_covers_rename(os.path.join(key, "objects"))
    return not covered


FOLDER_TRIES = 5  # makings of an objects/xx folder a packing may remove as fast


def _create_temporary(folder: str) -> tuple[str, int, bool]:
    """A new temporary file in the loose folder ``folder`` (made if missing): its path, its descriptor open for
    writing, and whether the folder was made.

    ``git repack -d`` (the background packing, the user's ``git gc``) removes
    a folder it emptied: one found present may be gone by the time the file
    is made in it, so it is made again. The folder holds the file from then
    on, and is not removed under it.
    """
    tries, made = 0, False
    while True:
        temporary = os.path.join(folder, f"tmp_obj_{os.getpid()}_{secrets.token_hex(6)}")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o444)
        except FileNotFoundError:  # the folder is missing: made, then the file tried again
            tries += 1
            if tries > FOLDER_TRIES or not os.path.isdir(os.path.dirname(folder)):
                raise  # removed as often as it was made, or the store itself is gone
            made = False
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder)
                made = True
            continue
        return temporary, fd, made


def _write_loose(git_dir: str, folder: str, path: str, data: bytes) -> None:
    """The loose file at ``path`` in ``folder`` holding ``data`` (header and body), recorded for the next flush."""
    compressed = zlib.compress(data, COMPRESSION)
    temporary, fd, made = _create_temporary(folder)
    try:
        write_all(fd, compressed)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    os.close(fd)
    sync_folders = _folders_need_fsync(git_dir)
    with _written.lock:  # a flush that begins once the file is seen takes it along
        os.rename(temporary, path)  # the same bytes if another writer got there first
        _written.files.append(path)
        if sync_folders:
            _written.folders.add(folder)
        if sync_folders and made:
            _written.folders.add(os.path.dirname(folder))
        key = os.path.normpath(git_dir)
        _written.counts[key] = _written.counts.get(key, 0) + 1


class Batch:
    """The new objects of one capture, written together: one pack from :data:`PACK_AT_LEAST` of them, else loose.

    A capture that hashes thousands of new files wrote a loose file for each,
    and the flush before its ref synced each file and up to 256 folders; a
    pack is two files and one folder (:mod:`snapshotd.git.packwrite`). The
    objects wait here, unreadable, until :meth:`write`, which the capture
    calls before it writes the trees that name them; past
    :data:`PENDING_BYTES` they are written as a pack at once. A capture that
    fails before :meth:`write` leaves them unwritten: the stat cache may name
    one, and it hashes again a cached id its store does not hold.
    """

    def __init__(self, git_dir: str) -> None:
        self.git_dir = git_dir
        self.objects: dict[bytes, PackedObject] = {}
        self.size = 0

    def __contains__(self, raw_id: bytes) -> bool:
        return raw_id in self.objects

    def add(self, item: PackedObject) -> None:
        """Hold ``item`` (not yet in the store) for the next :meth:`write`; written now as a pack if enough is held."""
        self.objects[item.raw_id] = item
        self.size += len(item.body)
        if self.size >= PENDING_BYTES:
            self._write_pack()

    def write(self) -> None:
        """Write what is held: as one pack from :data:`PACK_AT_LEAST` objects, else as loose files."""
        if len(self.objects) >= PACK_AT_LEAST:
            self._write_pack()
            return
        held, self.objects, self.size = list(self.objects.values()), {}, 0
        for item in held:  # each found absent when it was added; a rename over a copy written since is harmless
            _write_loose(self.git_dir, *_loose_path(self.git_dir, item.raw_id), with_header(item.kind, item.body))

    def _write_pack(self) -> None:
        held, self.objects, self.size = list(self.objects.values()), {}, 0
        folder = os.path.join(self.git_dir, "objects", "pack")
        os.makedirs(folder, exist_ok=True)
        prepared = prepare_pack(folder, held)
        sync_folders = _folders_need_fsync(self.git_dir)
        with _written.lock:  # as a loose file's rename: a flush that begins once the pack is seen takes it along
            prepared.publish()
            _written.files.extend(prepared.paths)
            if sync_folders:
                _written.folders.add(folder)


def _freshen(path: str) -> None:
    """Mark a loose object found present as new, as git does: ``git gc`` prunes an unreachable one only when old,
    so one a checkpoint is about to name is not pruned before its ref is written."""
    with contextlib.suppress(OSError):  # read-only store, or pruned meanwhile: then it is written again next time
        os.utime(path)


def written_count(git_dir: str) -> int:
    """Loose objects written into ``git_dir`` by this process since :func:`take_written_count` last reset it."""
    with _written.lock:
        return _written.counts.get(os.path.normpath(git_dir), 0)


def take_written_count(git_dir: str) -> int:
    """:func:`written_count`, and start counting again from zero."""
    with _written.lock:
        return _written.counts.pop(os.path.normpath(git_dir), 0)


def make_durable(git_dir: str) -> None:
    """Every object written before this call is on disk when it returns (before a ref names one).

    One flush serves every caller that asked before it began: while one runs,
    later callers wait and the next one flushes for all of them (objects of
    every store of the process: ``git_dir`` is one more store to flush whole
    if git wrote into it). Blocking: on a worker thread.
    """
    with _flushes.cond:
        wanted = _flushes.started + 1  # a flush that begins after this call
        while _flushes.finished < wanted:
            if _flushes.running:
                _flushes.cond.wait()
                continue
            _flushes.running = True
            _flushes.started += 1
            mine = _flushes.started
            _flushes.cond.release()
            try:
                _flush()
            finally:
                _flushes.cond.acquire()
                _flushes.running = False
                _flushes.cond.notify_all()
            _flushes.finished = mine


def _flush() -> None:
    """Flush what :data:`_written` holds: the stores written elsewhere whole, then each file, then each folder.

    A file or store gone since (pruned, deleted) has nothing left to flush. One
    that cannot be opened or flushed otherwise (a folder made unreadable) is
    covered by a ``sync`` of every file system instead; an I/O error is raised,
    and what this flush held is left for the next one.
    """
    files, folders, elsewhere = _written.take()
    failed: list[OSError] = []
    for git_dir in sorted(elsewhere):
        try:
            sync_filesystem(git_dir)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            failed.append(exc)
    targets = [(path, os.O_RDONLY) for path in files]
    targets += [(folder, os.O_RDONLY | os.O_DIRECTORY) for folder in sorted(folders)]
    for start in range(0, len(targets), FDS_AT_ONCE):
        _fsync_all(targets[start : start + FDS_AT_ONCE], failed)
    if not failed:
        return
    os.sync()
    broken = next((exc for exc in failed if exc.errno == errno.EIO), None)
    if broken is not None:
        with _written.lock:  # flushed again by the next one
            _written.files[:0] = files
            _written.folders |= folders
            _written.elsewhere |= elsewhere
        raise broken


def _fsync_all(targets: list[tuple[str, int]], failed: list[OSError]) -> None:
    """Fsync every path (opened with its flags) that is still there (:func:`fsync_together`)."""
    fds: list[int] = []
    try:
        for path, flags in targets:
            try:
                fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW)
            except (FileNotFoundError, NotADirectoryError):
                continue  # pruned since (a gc), or its store deleted: no ref names it
            except OSError as exc:
                failed.append(exc)
                continue
            fds.append(fd)
        failed += fsync_together(fds)
    finally:
        for fd in fds:
            os.close(fd)
