"""A session's chain of pins, and the compare-and-swap of the ref that points at its head.

A pin is a small commit with the empty tree whose parents are a checkpoint and
the previous pin; ``refs/snapshotd/<worktree>/<session>`` points at the newest.
A floor pin (no parents) only keeps the highest seq a session has given
(``Snapshotd-Last-Seq``). The ref is only ever moved by :meth:`SessionChains.swap`:
compare-and-swap under the back-end's reference lock, so two writers (the
daemon and an ``--embedded`` command) never lose each other's checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pygit2

from snapshotd.errors import GitError, RefLocked, RefMoved, RefRaced
from snapshotd.git.repository import Backend, ObjectId, Repository
from snapshotd.store.identity import unreadable

TRAILER = "Snapshotd-"
IDENTITY = ("snapshotd", "snapshotd@localhost")
STALE_LOCK_S = 30.0
LOCK_WAIT_S = 10.0  # how long a reference's lock held by another writer is waited out


def now_iso() -> str:
    """The time now as the store writes it (UTC, milliseconds), which also orders checkpoints."""
    return now_stamp()[0]


def now_stamp() -> tuple[str, pygit2.Signature]:
    """The time now as :func:`now_iso` writes it, and :func:`commit_signature` of it (made without parsing it)."""
    moment = datetime.now(UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return text, pygit2.Signature(IDENTITY[0], IDENTITY[1], int(moment.timestamp()), 0)


def commit_signature(created_at: str) -> pygit2.Signature:
    """snapshotd's author and committer at ``created_at``, so a commit's id follows from its content."""
    when = datetime.strptime(created_at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return pygit2.Signature(IDENTITY[0], IDENTITY[1], int(when.timestamp()), 0)


LAST_SEQ = TRAILER + "Last-Seq: "


@dataclass(frozen=True)
class Pin:
    """One link of a session's chain; a floor (``checkpoint`` None) only remembers ``last_seq``."""

    id: ObjectId
    checkpoint: ObjectId | None
    previous: ObjectId | None
    seq: int
    last_seq: int  # the highest seq given in the session when this pin was written


def _number(text: str) -> int:
    return int(text) if text.isdigit() else 0


def read_pin(repo: Repository, oid: ObjectId) -> Pin:
    """The pin commit ``oid``: its parents, and the seq in its subject and ``Last-Seq`` trailer."""
    commit = cast(pygit2.Commit, repo[oid])  # a pin is a commit (GitCommit in the git back-end)
    parents = commit.parent_ids
    lines = commit.message.splitlines()
    words = lines[0].split() if lines else []
    seq = _number(words[-1]) if words else 0
    last_seq = next((_number(line[len(LAST_SEQ) :]) for line in lines if line.startswith(LAST_SEQ)), seq)
    return Pin(
        id=oid,
        checkpoint=parents[0] if parents else None,
        previous=parents[1] if len(parents) > 1 else None,
        seq=seq,
        last_seq=max(seq, last_seq),
    )


class SessionChains:
    """Reading and moving the pin chains of the sessions stored in one repository."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo

    def ref_target(self, name: str) -> ObjectId | None:
        """The pin a session's ref points at; None only when there is no such ref.

        A ref that exists but cannot be read is an error: taken for "no ref",
        the next checkpoint would start the session's history anew.
        """
        try:
            target = self.repo.resolve_ref(name)
            # The git command reads a broken ref as absent (unless another writer created it meanwhile).
            if target is None and os.path.lexists(os.path.join(self.repo.path, name)):
                target = self.repo.resolve_ref(name)
                if target is None:
                    raise unreadable(Path(self.repo.path, name), "it does not name an object")
        except pygit2.GitError as exc:
            raise unreadable(Path(self.repo.path, name), str(exc).removesuffix(f": {name}")) from exc
        return target

    def _head_pin(self, name: str) -> Pin | None:
        """The pin a session's ref points at (a floor when all its checkpoints were dropped)."""
        oid = self.ref_target(name)
        return None if oid is None else read_pin(self.repo, oid)

    def pins(self, name: str) -> Iterator[Pin]:
        """Walk one session's pins of checkpoints, newest first."""
        pin = self._head_pin(name)
        while pin is not None and pin.checkpoint is not None:
            yield pin
            pin = None if pin.previous is None else read_pin(self.repo, pin.previous)

    def _empty_tree(self) -> ObjectId:
        return self.repo.write_empty_tree()

    def write_pin(
        self,
        checkpoint: ObjectId | None,
        previous: ObjectId | None,
        seq: int,
        created_at: str,
        last_seq: int,
        signature: pygit2.Signature | None = None,
    ) -> ObjectId:
        """A pin of ``checkpoint`` on top of ``previous``; with no checkpoint, a floor keeping ``last_seq``.

        ``signature`` is :func:`commit_signature` of ``created_at``, when the caller has it already.
        """
        signature = signature or commit_signature(created_at)
        parents = [] if checkpoint is None else [checkpoint] + ([previous] if previous is not None else [])
        message = f"snapshotd pin {seq}\n"
        if last_seq > seq:
            message += f"\n{LAST_SEQ}{last_seq}\n"
        return self.repo.create_commit(None, signature, signature, message, self._empty_tree(), parents)

    def swap(self, name: str, new: ObjectId | None, expected: ObjectId | None) -> None:
        """Point ``name`` at ``new`` (or delete it) only if it still points at ``expected``.

        The back-end checks under the reference's lock; a lock held by another
        writer is waited out for up to 10 s (a lock left by a crash is cleared
        once it is stale), then refused naming the lock file. Each attempt
        first checks that the repository is still there (:meth:`_require_repository`).
        """
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            self._require_repository(name)
            try:
                cast(Backend, self.repo).swap_ref(name, new, expected)  # each back-end takes its own ids
                return
            except RefMoved as exc:
                raise RefRaced(name) from exc
            except RefLocked as exc:
                if time.monotonic() > deadline:
                    lock = os.path.join(self.repo.path, name + ".lock")
                    if not os.path.lexists(lock):  # git's update-ref also takes packed-refs' lock
                        lock = os.path.join(self.repo.path, "packed-refs.lock")
                    raise GitError(
                        f"Could not update {name}: another process held its lock file {lock} for {LOCK_WAIT_S:g} s; "
                        "retry, and if no git or snapshotd process is running, remove that stale lock file."
                    ) from exc
                self._clear_stale_lock(name)
                time.sleep(0.005)

    def _require_repository(self, name: str) -> None:
        """Refuse to update ``name`` in a repository that lost its ``HEAD`` or ``refs`` (deleted or moved meanwhile).

        The lock of a reference is made with the folders leading to it, so an
        update in a repository gone from its path would make those folders
        anew there (a skeleton ``.git`` where the user deleted a worktree), and
        a repository moved mid-update refuses the rename of its lock, which is
        no lock held by another writer to wait for. The error's cause names
        the path that is missing, as a vanished worktree's are (``presence``).
        """
        for part in ("HEAD", "refs"):
            path = os.path.join(self.repo.path, part)
            if not os.path.lexists(path):
                missing = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
                raise GitError(
                    f"Could not update {name}: the repository {self.repo.path.rstrip('/')} has no {part} any more "
                    "(it was moved or deleted meanwhile)."
                ) from missing

    def _clear_stale_lock(self, name: str) -> None:
        lock = os.path.join(self.repo.path, name + ".lock")
        with contextlib.suppress(OSError):
            if time.time() - os.stat(lock).st_mtime > STALE_LOCK_S:
                os.unlink(lock)
