"""Many new objects written as one pack and its index, in git's format, instead of a loose file each.

A capture that hashes thousands of new files (an agent's ``npm install``
outside the ignore rules, a restore's safety capture of the files it is
about to replace) wrote as many loose files, and the checkpoint's flush
then synced each of them and each of up to 256 folders before its ref named
them. Here they go into one pack (version 2, every object whole, no deltas)
with its index (version 2): two files and one folder to flush. A pack is
written under a temporary name and renamed once complete, and its index
after it, so git and libgit2, which find a pack by its index, never see
half of one. Background packing rolls these packs up with the rest.

Only SHA-1 stores come here, as for :func:`snapshotd.git.loose.write_object`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from snapshotd.fsutil import write_all

__all__ = ["PackedObject", "PreparedPack", "prepare_pack"]

COMPRESSION = 1  # zlib level, as for loose objects
TYPE_CODES = {"commit": 1, "tree": 2, "blob": 3, "tag": 4}
INDEX_MAGIC = b"\377tOc"
LARGE_OFFSET = 0x80000000  # offsets from here on would need the index's table of 8-byte offsets, not written here


@dataclass(frozen=True)
class PackedObject:
    """One object for a pack: its binary id, kind and body (without git's ``<kind> <size>`` header)."""

    raw_id: bytes
    kind: str
    body: bytes


def entry_header(kind: str, size: int) -> bytes:
    """A pack entry's header: the type in bits 4-6 of the first byte, the size 4 bits then 7 at a time."""
    byte = (TYPE_CODES[kind] << 4) | (size & 0x0F)
    size >>= 4
    out = bytearray()
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def index_bytes(entries: Sequence[tuple[bytes, int, int]], pack_checksum: bytes) -> bytes:
    """The version 2 index of a pack's ``(raw id, offset, crc32)`` entries."""
    ordered = sorted(entries)
    fanout = [0] * 256
    for raw_id, _, _ in ordered:
        fanout[raw_id[0]] += 1
    total = 0
    for first in range(256):
        total += fanout[first]
        fanout[first] = total
    if any(offset >= LARGE_OFFSET for _, offset, _ in ordered):
        raise ValueError("a pack written here stays below 2 GiB (its writer's batches are capped)")
    body = b"".join([
        INDEX_MAGIC,
        struct.pack(">I", 2),
        struct.pack(">256I", *fanout),
        b"".join(raw_id for raw_id, _, _ in ordered),
        struct.pack(f">{len(ordered)}I", *(crc for _, _, crc in ordered)),
        struct.pack(f">{len(ordered)}I", *(offset for _, offset, _ in ordered)),
        pack_checksum,
    ])
    return body + hashlib.sha1(body).digest()


def _write_new(path: str, chunks: Sequence[bytes] | None = None) -> int:
    """A new read-only file at ``path`` (never an existing one or a link), its descriptor open for writing."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o444)
    for chunk in chunks or ():
        write_all(fd, chunk)
    return fd


@dataclass
class PreparedPack:
    """A pack and its index written under temporary names: :meth:`publish` puts them in place, pack first."""

    temporary_pack: str
    temporary_index: str
    name: str  # the path without its ``.pack`` or ``.idx``

    @property
    def paths(self) -> list[str]:
        """The pack's and the index's paths once published."""
        return [self.name + ".pack", self.name + ".idx"]

    def publish(self) -> None:
        """Rename the pack, then its index, into place (git and libgit2 find a pack by its index)."""
        try:
            os.rename(self.temporary_pack, self.name + ".pack")
            os.rename(self.temporary_index, self.name + ".idx")
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Remove what is left under the temporary names."""
        _discard(self.temporary_pack)
        _discard(self.temporary_index)


def prepare_pack(pack_dir: str, objects: Sequence[PackedObject]) -> PreparedPack:
    """Write ``objects`` (distinct ids) as one pack and its index in ``pack_dir``, under temporary names.

    Nothing is flushed here: the caller's flush takes both files and the folder.
    """
    tag = f"{os.getpid()}_{secrets.token_hex(6)}"
    prepared = PreparedPack(os.path.join(pack_dir, f"tmp_pack_{tag}"), os.path.join(pack_dir, f"tmp_idx_{tag}"), "")
    checksum = hashlib.sha1()
    entries: list[tuple[bytes, int, int]] = []
    try:
        fd = _write_new(prepared.temporary_pack)
        try:
            head = b"PACK" + struct.pack(">II", 2, len(objects))
            write_all(fd, head)
            checksum.update(head)
            offset = len(head)
            for item in objects:
                data = entry_header(item.kind, len(item.body)) + zlib.compress(item.body, COMPRESSION)
                write_all(fd, data)
                checksum.update(data)
                entries.append((item.raw_id, offset, zlib.crc32(data)))
                offset += len(data)
            trailer = checksum.digest()
            write_all(fd, trailer)
        finally:
            os.close(fd)
        os.close(_write_new(prepared.temporary_index, [index_bytes(entries, trailer)]))
    except BaseException:
        prepared.discard()
        raise
    prepared.name = os.path.join(pack_dir, f"pack-{trailer.hex()}")
    return prepared


def _discard(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
