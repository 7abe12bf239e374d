"""The saved copy of a store's session index: ``<store>/snapshotd/checkpoint-index``.

Only a head start for a new process: every session in it is checked against
its ref before use (:meth:`snapshotd.store.index.StoreIndex.refresh`), so a
stale copy costs the pins written since, and a missing, torn or corrupt one
(its SHA-256 trailer does not match, or it cannot be parsed) is ignored and
the chains are read from git again. It is written whole to a temporary file
in snapshotd's private folder (opened without following links, 0600) and
renamed over the old one; temporary files a crashed writer left are removed
by the next writer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from pathlib import Path

from snapshotd.errors import Untrusted
from snapshotd.fsutil import atomic_write_at, open_private_folder, pid_alive, read_private_file
from snapshotd.store.sessionindex import SessionIndex

NAME = "checkpoint-index"
TEMP_PREFIX = ".checkpoint-index-"
MAGIC = b"snapshotd checkpoint-index 1\n"
MAX_BYTES = 1 << 30
SEQ_BYTES = 8


def _folder(store_path: str) -> Path:
    return Path(store_path, "snapshotd")


def encode(sessions: dict[str, SessionIndex], id_bytes: int) -> bytes:
    """The file's bytes: per session a JSON header line, then its pins, checkpoints and seqs packed."""
    parts = [MAGIC]
    for name, entry in sessions.items():
        if entry.head is None and not entry.pins:
            continue
        header = {"name": name, "head": entry.head, "count": len(entry)}
        parts.append(json.dumps(header).encode() + b"\n")
        parts.append(bytes.fromhex("".join(entry.pins)))
        parts.append(bytes.fromhex("".join(entry.checkpoints)))
        parts.append(struct.pack(f">{len(entry.seqs)}Q", *entry.seqs))
    body = b"".join(parts)
    assert all(len(pin) == 2 * id_bytes for entry in sessions.values() for pin in entry.pins[:1])
    return body + hashlib.sha256(body).digest()


def decode(data: bytes, id_bytes: int) -> dict[str, SessionIndex]:
    """The sessions in ``data``; ValueError when it is not a whole, intact copy."""
    body, digest = data[:-32], data[-32:]
    if not body.startswith(MAGIC) or hashlib.sha256(body).digest() != digest:
        raise ValueError("not an intact checkpoint index")
    sessions: dict[str, SessionIndex] = {}
    at = len(MAGIC)
    while at < len(body):
        end = body.index(b"\n", at)
        header = json.loads(body[at:end])
        count, at = int(header["count"]), end + 1
        pins, at = body[at : at + count * id_bytes], at + count * id_bytes
        checkpoints, at = body[at : at + count * id_bytes], at + count * id_bytes
        seqs, at = body[at : at + count * SEQ_BYTES], at + count * SEQ_BYTES
        if len(seqs) != count * SEQ_BYTES:
            raise ValueError("a session is cut short")
        entry = SessionIndex(head=header["head"])
        entry.pins, entry.checkpoints = _hex_ids(pins, id_bytes), _hex_ids(checkpoints, id_bytes)
        entry.seqs = list(struct.unpack(f">{count}Q", seqs))
        entry.position = dict(zip(entry.checkpoints, range(count), strict=True))
        entry.pin_position = dict(zip(entry.pins, range(count), strict=True))
        sessions[str(header["name"])] = entry
    return sessions


def _hex_ids(raw: bytes, id_bytes: int) -> list[str]:
    text, width = raw.hex(), 2 * id_bytes
    return [text[at : at + width] for at in range(0, len(text), width)]


def load(store_path: str, id_bytes: int) -> dict[str, SessionIndex]:
    """The saved sessions of the store, or none when there is no usable copy."""
    try:
        fd = open_private_folder(_folder(store_path), 1, create=False)
    except (OSError, Untrusted):
        return {}
    try:
        return decode(read_private_file(fd, NAME, MAX_BYTES), id_bytes)
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    finally:
        os.close(fd)


def save(store_path: str, sessions: dict[str, SessionIndex], id_bytes: int) -> None:
    """Replace the saved copy whole; a failure leaves the old one (or none), which is only slower."""
    data = encode(sessions, id_bytes)
    with contextlib.suppress(OSError, Untrusted):
        fd = open_private_folder(_folder(store_path), 1)
        try:
            _remove_stale_temp_files(fd)
            atomic_write_at(fd, NAME, data, 0o600, temp_prefix=TEMP_PREFIX)
        finally:
            os.close(fd)


def _remove_stale_temp_files(folder_fd: int) -> None:
    """Remove the temporary copies of writers that are gone (a crash mid-write)."""
    for name in os.listdir(folder_fd):
        pid = name.removeprefix(TEMP_PREFIX).split("-", 1)[0]
        if name.startswith(TEMP_PREFIX) and pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=folder_fd)

