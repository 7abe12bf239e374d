"""Checkpoints on remotes: the ref names a push and a fetch use, and what this machine last pushed.

A push sends ``refs/snapshotd/<worktree>/<session>`` to the same name on the
remote; a fetch brings every ``refs/snapshotd/*`` of the remote to
``refs/snapshotd-remote/<remote>/*`` here, so another machine's checkpoints
are pinned, listed and read like local ones but never taken for them. The
value each ref had when this machine last pushed it is kept in the store
(``<store>/snapshotd/pushed``, 0600): it is the compare-and-swap's expected
value of the next push, so two machines never overwrite each other.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator

from snapshotd.errors import Ambiguous, NotFound, Untrusted
from snapshotd.fsutil import (
    atomic_write,
    checked_private_folder,
    file_lock,
    open_private_folder,
    read_private_file,
)
from snapshotd.settings import SAFETY_SESSION
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.refnames import REF_ROOT, session_key

REMOTE_ROOT = "refs/snapshotd-remote/"
PUSHED = "pushed"
MAX_PUSHED_BYTES = 64 << 20
_NAME_SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")


def remote_key(remote: str) -> str:
    """The ref name component for a remote: its name when it is a plain one, else a digest of it (a URL)."""
    if _NAME_SAFE.match(remote) and ".." not in remote and not remote.endswith(".lock"):
        return remote
    return "url-" + hashlib.sha256(remote.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def remote_prefix(key: str) -> str:
    """Where a fetch from the remote ``key`` puts its checkpoint refs."""
    return f"{REMOTE_ROOT}{key}/"


def fetch_refspec(key: str) -> str:
    """Every checkpoint ref of the remote, to its own folder here (forced: the remote is the truth of its refs)."""
    return f"+{REF_ROOT}*:{remote_prefix(key)}*"


def local_name(fetched: str) -> tuple[str, str]:
    """(remote key, the ref's name on the remote) for a fetched ref name."""
    key, _, rest = fetched[len(REMOTE_ROOT) :].partition("/")
    return key, REF_ROOT + rest


def remote_refs(store: Store, key: str | None) -> list[str]:
    """The fetched checkpoint refs of one remote (every remote when None), sorted."""
    return sorted(store.repo.ref_names(REMOTE_ROOT if key is None else remote_prefix(key)))


def remote_of(store: Store, checkpoint: Checkpoint) -> str | None:
    """The remote whose fetched refs pin ``checkpoint`` when no local ref does; None for a local one."""
    if store.is_live(checkpoint):
        return None
    suffix = f"/{checkpoint.worktree}/{session_key(checkpoint.session)}"
    for name in remote_refs(store, None):
        if name.endswith(suffix) and store.holds(name, checkpoint.id):
            return local_name(name)[0]
    return None


def iter_remote(store: Store, key: str | None, limit: int | None) -> Iterator[tuple[str, Checkpoint]]:
    """(remote key, checkpoint) for the fetched checkpoints, each ref's newest ``limit``, ref by ref."""
    for name in remote_refs(store, key):
        for checkpoint in store.iter_session(name, limit):
            yield local_name(name)[0], checkpoint


def back_from_remote_head(store: Store, key: str, session: str | None, named: bool, back: int) -> Checkpoint:
    """``SESSION@{REMOTE}~N``: ``back`` before the newest of the session fetched from ``key``.

    Without a session, the session whose newest fetched checkpoint is newest,
    never the safety checkpoints' (as ``@`` never means one). A session
    fetched from two worktrees of the remote is ambiguous: the reference names
    no worktree, so the candidates are their newest.
    """
    wanted = f"/{session_key(session)}" if named else None
    safety = f"/{session_key(SAFETY_SESSION)}"
    heads = []
    for name in remote_refs(store, key):
        if name.endswith(wanted) if wanted is not None else not name.endswith(safety):
            newest = store.newest_ids(name, 1)
            if newest:
                heads.append((store.load(newest[0]), name))
    heads.sort(key=lambda pair: (pair[0].created_at, pair[0].seq), reverse=True)
    where = f"session {session!r}" if named and session is not None else "the default session" if named else "the newest session"
    if not heads:
        what = f"no checkpoint of {where}" if named else "no checkpoint"
        raise NotFound(f"There is {what} fetched from the remote {key}; 'snapshotd fetch {key}' brings its checkpoints.")
    if named and len({cp.worktree for cp, _ in heads}) > 1:
        shown = ", ".join(f"{cp.id[:12]} of worktree {cp.worktree}" for cp, _ in heads[:5])
        raise Ambiguous(f"{where[0].upper()}{where[1:]} was fetched from {len(heads)} worktrees of {key}: {shown}; name one by id.")
    ids = store.newest_ids(heads[0][1], back + 1)
    if len(ids) <= back:
        held = f"{len(ids)} checkpoint" if len(ids) == 1 else f"{len(ids)} checkpoints"
        raise NotFound(f"{where[0].upper()}{where[1:]} fetched from {key} holds {held}, so none is {back} before its newest.")
    return store.load(ids[back])


# --- what this machine last pushed ------------------------------------------------


def _folder(store_path: str) -> str:
    return os.path.join(store_path, "snapshotd")


def load_pushed(store_path: str, key: str) -> dict[str, str]:
    """ref -> id as this machine last pushed them to the remote ``key`` (nothing yet: empty)."""
    try:
        fd = open_private_folder(_folder(store_path), 1, create=False)
    except (OSError, Untrusted):
        return {}
    try:
        data = json.loads(read_private_file(fd, PUSHED, MAX_PUSHED_BYTES))
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    found = data.get(key) if isinstance(data, dict) else None
    return {str(ref): str(oid) for ref, oid in found.items()} if isinstance(found, dict) else {}


def save_pushed(store_path: str, key: str, pushed: dict[str, str]) -> None:
    """Record ``pushed`` (ref -> id) as sent to the remote ``key``, beside what other remotes got."""
    folder = checked_private_folder(_folder(store_path), 1)
    with file_lock(os.path.join(folder, PUSHED + ".lock")):
        fd = open_private_folder(folder, 1)
        try:
            data = json.loads(read_private_file(fd, PUSHED, MAX_PUSHED_BYTES))
        except (OSError, ValueError):
            data = {}
        finally:
            os.close(fd)
        if not isinstance(data, dict):
            data = {}
        data.setdefault(key, {}).update(pushed)
        atomic_write(os.path.join(folder, PUSHED), json.dumps(data, sort_keys=True).encode(), 0o600)
