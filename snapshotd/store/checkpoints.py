"""Checkpoints as git commits, kept alive by one ref per worktree and session.

Layout, in the repository that holds the worktree's objects:

* A **checkpoint** is a commit whose tree is the captured tree, whose parent is
  the worktree's HEAD at capture time (so ``git show <id>`` shows the
  uncommitted work), and whose message carries ``Snapshotd-*`` trailers: the
  worktree id, session, label, seq, previous checkpoint, base, time, the
  changed flag and the machine it was taken on (so a fetched one says where it comes from),
  and the calling agent's ids (:mod:`snapshotd.store.message`). The store can be rebuilt from git alone.
* A **pin** is a small commit with the empty tree whose parents are the
  checkpoint and the previous pin. ``refs/snapshotd/<worktree>/<session>``
  points at the newest pin. Checkpoints never point at each other, so deleting
  or collecting old ones only rewrites pins (internal, ids never shown) and
  leaves every kept checkpoint's id unchanged; what is dropped becomes
  unreachable and ``git gc`` frees it.
* Sequence numbers only grow in a session: a pin also records the highest seq
  the session has given (``Snapshotd-Last-Seq``), and a session whose
  checkpoints were all dropped keeps a **floor** pin (no parents) with it.

Pins and the ref updates (compare-and-swap under the back-end's ref lock, so
two writers never lose each other's checkpoint) are :mod:`snapshotd.store.pins`;
this module reads and writes the checkpoints on top of them. Which checkpoints
a session holds, their seqs and positions, come from this process's index of
the chains (:mod:`snapshotd.store.index`), checked against the ref at every use.

The repository is either back-end of :mod:`snapshotd.git.repository`
(libgit2, or the git command where libgit2 cannot open it: SHA-256); the
store calls the same methods on both. Ids are then hex strings rather than
``pygit2.Oid``.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, TypeAlias, cast

import pygit2

from snapshotd.contract.trailers import Agent
from snapshotd.errors import NotFound, RefRaced
from snapshotd.git.repository import ObjectId, Repository
from snapshotd.settings import host_name
from snapshotd.store.heads import Head, HeadCache
from snapshotd.store.index import StoreIndex, index_of
from snapshotd.store.message import checkpoint_message, message_fields, parses_back
from snapshotd.store.pins import Pin, SessionChains, now_iso, now_stamp, read_pin
from snapshotd.store.refnames import REF_ROOT, ref_name


@dataclass(frozen=True)
class Checkpoint:
    id: str
    tree: str
    parent: str | None
    worktree: str
    session: str | None
    label: str | None
    seq: int
    created_at: str
    base: str | None
    changed: bool
    host: str | None = None
    agent: Agent = ()  # the calling agent's ids, (key, value) pairs: Snapshotd-Agent-* trailers

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "id": self.id,
            "tree": self.tree,
            "parent": self.parent,
            "worktree": self.worktree,
            "session": self.session,
            "label": self.label,
            "seq": self.seq,
            "created_at": self.created_at,
            "base": self.base,
            "changed": self.changed,
            "host": self.host,
        }
        if self.agent:
            wire["agent"] = dict(self.agent)
        return wire


def _is_commit(obj: object) -> bool:
    return getattr(obj, "type_str", None) == "commit"


def _text_or_none(field: str) -> str | None:
    """A JSON string trailer's text; None when absent, null or not a string."""
    value = json.loads(field)
    return value if isinstance(value, str) else None


def parse_checkpoint(commit: pygit2.Commit) -> Checkpoint | None:
    """Read a checkpoint back from its commit, or None if the commit is not one."""
    fields, agent = message_fields(commit.message)
    if "Worktree" not in fields or "Seq" not in fields:
        return None
    try:
        return Checkpoint(
            id=str(commit.id),
            tree=str(commit.tree_id),
            parent=None if fields.get("Previous", "none") == "none" else fields["Previous"],
            worktree=fields["Worktree"],
            session=json.loads(fields.get("Session", "null")),
            label=json.loads(fields.get("Label", "null")),
            seq=int(fields["Seq"]),
            created_at=fields.get("Created", ""),
            base=None if fields.get("Base", "none") == "none" else fields["Base"],
            changed=fields.get("Changed", "true") == "true",
            host=_text_or_none(fields.get("Host", "null")),
            agent=agent,
        )
    except ValueError:
        return None


Outcomes: TypeAlias = "list[Checkpoint | Exception]"  # per request of Store.record_many
Request: TypeAlias = "tuple[str | None, str | None, Agent]"  # session, label, the agent's ids
Prepared: TypeAlias = "list[tuple[str, ObjectId, ObjectId | None, Checkpoint] | Exception]"


class Store(SessionChains):
    """The checkpoints of the worktrees whose objects live in one repository."""

    def __init__(self, repo: Repository, heads: HeadCache | None = None) -> None:
        super().__init__(repo)
        self.hex_length = repo.hex_length
        self.heads = heads  # the heads the worktree's open store keeps (capture/resident.py), if any

    @cached_property
    def index(self) -> StoreIndex:
        """This process's index of the store's chains (not needed to record)."""
        return index_of(self.repo.path)

    # --- reading -----------------------------------------------------------

    def load(self, oid: ObjectId) -> Checkpoint:
        try:
            commit = self.repo[oid]
        except (KeyError, ValueError) as exc:
            raise NotFound(f"No checkpoint {oid} exists.") from exc
        checkpoint = parse_checkpoint(cast(pygit2.Commit, commit)) if _is_commit(commit) else None
        if checkpoint is None:
            raise NotFound(f"The object {oid} is not a snapshotd checkpoint.")
        return checkpoint

    def session_refs(self, worktree_id: str) -> list[str]:
        prefix = f"{REF_ROOT}{worktree_id}/"
        return sorted(self.repo.ref_names(prefix))

    def head(self, worktree_id: str, session: str | None) -> Checkpoint | None:
        for pin in self.pins(ref_name(worktree_id, session)):
            assert pin.checkpoint is not None  # pins() yields the pins of checkpoints only
            return self.load(pin.checkpoint)
        return None

    def newest_ids(self, name: str, count: int | None = None) -> list[str]:
        """The ids of the session's newest ``count`` checkpoints (all when None), newest first."""
        with self.index.lock:
            return self.index.refresh(self, name).newest(count)

    def past_newest(self, name: str, keep: int) -> list[str]:
        """The ids of the session's checkpoints but its newest ``keep``, newest first."""
        with self.index.lock:
            return self.index.refresh(self, name).past_newest(keep)

    def count(self, name: str) -> int:
        """How many checkpoints the session holds."""
        with self.index.lock:
            return len(self.index.refresh(self, name))

    def at_seq(self, name: str, seq: int) -> Checkpoint | None:
        """The session's live checkpoint with ``seq``, or None."""
        with self.index.lock:
            found = self.index.refresh(self, name).at_seq(seq)
        return None if found is None else self.load(found)

    def iter_session(self, name: str, count: int | None = None) -> Iterator[Checkpoint]:
        """The session's checkpoints newest first (the newest ``count`` of them), each read when reached."""
        for checkpoint_id in self.newest_ids(name, count):
            yield self.load(checkpoint_id)

    def list(self, worktree_id: str, session: str | None, limit: int | None, all_sessions: bool) -> list[Checkpoint]:
        """Newest first; across every session of the worktree when ``all_sessions``."""
        if all_sessions:
            streams = [self.iter_session(name, limit) for name in self.session_refs(worktree_id)]
            merged: Iterator[Checkpoint] = heapq.merge(
                *streams, key=lambda cp: (cp.created_at, cp.seq), reverse=True
            )
        else:
            merged = self.iter_session(ref_name(worktree_id, session), limit)
        out: list[Checkpoint] = []
        for checkpoint in merged:
            if limit is not None and len(out) >= limit:
                break
            out.append(checkpoint)
        return out

    def summary(self, worktree_id: str) -> tuple[int, str | None]:
        """How many checkpoints the worktree holds and when its newest was taken, every session counted.

        The counts come from the index and one commit is read per session (its
        newest), so this costs the sessions, not the checkpoints.
        """
        total, newest = 0, None
        for name in self.session_refs(worktree_id):
            with self.index.lock:
                entry = self.index.refresh(self, name)
                head = entry.checkpoints[-1] if entry.checkpoints else None
                total += len(entry)
            if head is not None:
                created_at = self.load(head).created_at
                newest = created_at if newest is None else max(newest, created_at)
        return total, newest

    def is_live(self, checkpoint: Checkpoint) -> bool:
        """True while the checkpoint is still pinned (not deleted or collected)."""
        with self.index.lock:
            entry = self.index.refresh(self, ref_name(checkpoint.worktree, checkpoint.session))
            return checkpoint.id in entry.position

    def holds(self, name: str, checkpoint_id: str) -> bool:
        """True while the chain of the ref ``name`` (a session's, or a fetched one) pins ``checkpoint_id``."""
        with self.index.lock:
            return checkpoint_id in self.index.refresh(self, name).position

    # --- writing -----------------------------------------------------------

    def record(
        self,
        *,
        worktree_id: str,
        session: str | None,
        label: str | None,
        tree: str,
        base: str | None,
        agent: Agent = (),
    ) -> Checkpoint:
        """Write a checkpoint commit and pin it; retried if another writer raced us."""
        (outcome,) = self.record_many(worktree_id=worktree_id, requests=[(session, label, agent)], tree=tree, base=base)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def record_many(
        self,
        *,
        worktree_id: str,
        requests: Sequence[Request],
        tree: str,
        base: str | None,
    ) -> Outcomes:
        """One checkpoint of ``tree`` per (session, label, agent ids), in order: the commits and pins written,
        one flush, then each ref swapped; per request its checkpoint, or the exception that refused it.

        A ref another writer moved meanwhile is recorded again on its own (written, flushed, swapped).
        """
        prepared: Prepared = []
        for request in requests:
            try:
                prepared.append(self._prepare(worktree_id, request, tree, base))
            except Exception as exc:
                prepared.append(exc)
        if any(not isinstance(item, Exception) for item in prepared):
            self.repo.flush()  # a queued commit and pin are written now, not at the ref update
            self.repo.make_durable()  # its blobs, trees, commits and pins are on disk before a ref names them
        out: Outcomes = []
        for request, item in zip(requests, prepared, strict=True):
            if isinstance(item, Exception):
                out.append(item)
                continue
            try:
                while True:
                    name, pin, head_pin, checkpoint = item
                    try:
                        self.swap(name, pin, head_pin)
                        break
                    except RefRaced:
                        item = self._prepare(worktree_id, request, tree, base)
                        self.repo.flush()
                        self.repo.make_durable()
                if self.repo.oid(checkpoint.id) not in self.repo.odb:  # gone since (``rm -rf`` of the worktree)
                    self.load(checkpoint.id)  # the error a read of it gives
                if self.heads is not None:
                    self.heads.put(name, Head(str(pin), checkpoint.seq, checkpoint.id, checkpoint.tree))
                out.append(checkpoint)
            except Exception as exc:
                out.append(exc)
        return out

    def _head(self, name: str, head_pin: ObjectId | None) -> Head | None:
        """What the next checkpoint needs of the session's head pin ``head_pin``: kept, or read from git."""
        known = None if self.heads is None else self.heads.get(name, head_pin)
        if known is not None or head_pin is None:
            return known
        pin = read_pin(self.repo, head_pin)
        cp = None if pin.checkpoint is None else self.load(pin.checkpoint)  # None: a floor, the seq kept
        return Head(str(head_pin), pin.last_seq, cp.id if cp else None, cp.tree if cp else None)

    def _prepare(
        self, worktree_id: str, request: Request, tree: str, base: str | None
    ) -> tuple[str, ObjectId, ObjectId | None, Checkpoint]:
        """The checkpoint commit and its pin on top of the session's head: (ref, pin, expected head pin, checkpoint
        as :meth:`load` would read it back, made from what was written)."""
        session, label, agent = request
        name = ref_name(worktree_id, session)
        head_pin = self.ref_target(name)
        head = self._head(name, head_pin)
        created_at, signature = now_stamp()
        checkpoint = Checkpoint(
            id="",
            tree=tree,
            parent=head.checkpoint if head is not None else None,
            worktree=worktree_id,
            session=session,
            label=label,
            seq=(head.last_seq if head else 0) + 1,
            created_at=created_at,
            base=base,
            changed=head is None or head.checkpoint is None or head.tree != tree,
            host=host_name(),
            agent=agent,
        )
        message = checkpoint_message(checkpoint)
        parents = [self.repo.oid(base)] if base else []
        commit_id = self.repo.create_commit(None, signature, signature, message, self.repo.oid(tree), parents)
        chained = head_pin if head is not None and head.checkpoint is not None else None
        pin = self.write_pin(commit_id, chained, checkpoint.seq, created_at, checkpoint.seq, signature)
        written = replace(checkpoint, id=str(commit_id))
        ids = [tree] + [cp for cp in (written.parent, base) if cp is not None]  # as git names them, or read back
        plain = all(len(cp) == self.hex_length and cp == cp.lower() for cp in ids) and parses_back(message, agent)
        return name, pin, head_pin, written if plain else self.load(commit_id)

    def _empty_tree(self) -> ObjectId:
        """The pins' tree, written once per open store (:class:`HeadCache`), else at each pin."""
        if self.heads is None:
            return self.repo.write_empty_tree()
        self.heads.empty_tree = self.heads.empty_tree or self.repo.write_empty_tree()
        return self.heads.empty_tree

    def rewrite(self, name: str, keep: Sequence[Checkpoint] | None = None, drop: set[str] | None = None) -> int:
        """Re-pin one session keeping only some checkpoints; return how many were dropped.

        ``drop`` names checkpoints to remove; otherwise ``keep`` lists the ones to keep.
        Pins older than the oldest dropped one are reused as they are, so the
        cost is the checkpoints dropped and those newer than them.
        """
        while True:
            with self.index.lock:
                head_pin = self.ref_target(name)
                entry = self.index.refresh(self, name)
                if drop is not None:
                    places = sorted(entry.position[cp] for cp in drop if cp in entry.position)
                else:
                    keep_ids = {cp.id for cp in keep or ()}
                    places = [index for index, cp in enumerate(entry.checkpoints) if cp not in keep_ids]
                if not places:
                    return 0
                if head_pin is None or str(head_pin) != entry.head:
                    continue  # the ref moved between the two reads
                oldest_dropped = places[0]
                going = {entry.checkpoints[index] for index in places}
                above = [pin for pin in entry.pin_objects(oldest_dropped) if pin.checkpoint not in going]
                base: ObjectId | None = entry.pins[oldest_dropped - 1] if oldest_dropped > 0 else None
            # The new head is always written anew, to carry the session's highest seq.
            last_seq = read_pin(self.repo, head_pin).last_seq
            if not above and base is not None:
                base_pin = read_pin(self.repo, base)
                above, base = [base_pin], base_pin.previous
            new_head = self._repin(above, None if base is None else self.repo.oid(str(base)), last_seq)
            self.repo.make_durable()  # the new pins are on disk before the ref names them
            try:
                self.swap(name, new_head, head_pin)
            except RefRaced:
                continue
            return len(places)

    def _repin(self, pins: Sequence[Pin], base: ObjectId | None, last_seq: int) -> ObjectId:
        """Pin ``pins`` (newest first) again on top of ``base``; the newest carries ``last_seq``.

        With no pins left this is a floor, so the next checkpoint still gets ``last_seq + 1``.
        """
        if not pins:
            return self.write_pin(None, None, 0, now_iso(), last_seq)
        new_head = base
        for pin in reversed(pins):
            assert pin.checkpoint is not None
            created_at = self.load(pin.checkpoint).created_at
            new_head = self.write_pin(
                pin.checkpoint, new_head, pin.seq, created_at, last_seq if pin is pins[0] else pin.seq
            )
        assert new_head is not None
        return new_head
