"""A store with N checkpoints in one session, written as one pack instead of through the daemon.

The worktree is opened by the engine (so it has its id and record), then the
history is written as the daemon writes it: per checkpoint, a commit whose
tree is the worktree's tree with ``turn.txt`` changed and whose parent is
HEAD, carrying the ``Snapshotd-*`` trailers (message from the store's own
code), and a pin on top of the previous one; commit times and ids follow
from ``created_at`` as :func:`snapshotd.store.pins.commit_signature` makes
them. Every object goes into one pack (``git index-pack``) and the session's
ref is set last, so 100,000 checkpoints take seconds rather than an hour of
captures.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from snapshotd.git.packwrite import entry_header
from snapshotd.store.checkpoints import Checkpoint
from snapshotd.store.message import checkpoint_message
from snapshotd.store.pins import IDENTITY
from snapshotd.store.refnames import ref_name

EMPTY_TREE = hashlib.sha1(b"tree 0\x00").hexdigest()


class PackWriter:
    """Objects as git stores them, hashed here and written to one pack."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.count = 0

    def add(self, kind: str, body: bytes) -> str:
        oid = hashlib.sha1(f"{kind} {len(body)}\x00".encode() + body).hexdigest()
        self.chunks.append(entry_header(kind, len(body)) + zlib.compress(body, 1))
        self.count += 1
        return oid

    def finish(self, git_dir: Path) -> None:
        head = b"PACK" + (2).to_bytes(4, "big") + self.count.to_bytes(4, "big")
        data = head + b"".join(self.chunks)
        data += hashlib.sha1(data).digest()
        subprocess.run(["git", "--git-dir", str(git_dir), "index-pack", "--stdin"], input=data, check=True,
                       capture_output=True)


def _tree(entries: dict[str, tuple[str, str]]) -> bytes:
    """A tree's body from ``name -> (mode, hex id)``; names sorted as git sorts them (folders as name/)."""
    def key(name: str) -> bytes:
        return (name + "/").encode() if entries[name][0] == "40000" else name.encode()

    return b"".join(
        f"{entries[name][0]} {name}".encode() + b"\x00" + bytes.fromhex(entries[name][1])
        for name in sorted(entries, key=key)
    )


def _commit(tree: str, parents: list[str], when: int, message: str) -> bytes:
    person = f"{IDENTITY[0]} <{IDENTITY[1]}> {when} +0000"
    lines = [f"tree {tree}"] + [f"parent {p}" for p in parents] + [f"author {person}", f"committer {person}"]
    return ("\n".join(lines) + "\n\n" + message).encode()


def _git(worktree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(worktree), *args], check=True, capture_output=True, text=True).stdout.strip()


def build_history(
    worktree: Path, worktree_id: str, session: str, count: int, label: Callable[[int], str] | None = None
) -> list[str]:
    """Write ``count`` checkpoints of ``session`` (oldest first) and point its ref at the newest pin.

    ``label`` names checkpoint ``seq`` (default ``turn <seq>``).
    """
    git_dir = Path(_git(worktree, "rev-parse", "--absolute-git-dir"))
    head = _git(worktree, "rev-parse", "HEAD")
    top = {}
    for line in _git(worktree, "ls-tree", "HEAD").splitlines():
        meta, name = line.split("\t", 1)
        mode, _kind, oid = meta.split()
        top[name] = (mode.lstrip("0") if mode == "040000" else mode, oid)
    pack = PackWriter()
    start = datetime.now(UTC) - timedelta(milliseconds=10 * (count + 1000))
    previous_cp: str | None = None
    previous_pin: str | None = None
    ids = []
    for seq in range(1, count + 1):
        moment = start + timedelta(milliseconds=10 * seq)
        created = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
        blob = pack.add("blob", f"turn {seq}\n".encode())
        tree = pack.add("tree", _tree({**top, "turn.txt": ("100644", blob)}))
        checkpoint = Checkpoint(id="", tree=tree, parent=previous_cp, worktree=worktree_id, session=session,
                                label=label(seq) if label else f"turn {seq}", seq=seq, created_at=created, base=head, changed=True)
        when = int(moment.replace(microsecond=0).timestamp())
        cp = pack.add("commit", _commit(tree, [head], when, checkpoint_message(checkpoint)))
        parents = [cp] + ([previous_pin] if previous_pin else [])
        previous_pin = pack.add("commit", _commit(EMPTY_TREE, parents, when, f"snapshotd pin {seq}\n"))
        previous_cp = cp
        ids.append(cp)
    pack.add("tree", b"")
    pack.finish(git_dir)
    assert previous_pin is not None
    _git(worktree, "update-ref", ref_name(worktree_id, session), previous_pin)
    return ids


def main() -> None:
    """``python -m bench.history_build WORKTREE WORKTREE_ID SESSION COUNT``: prints the ids as JSON."""
    import sys

    worktree, worktree_id, session, count = sys.argv[1:5]
    print(json.dumps(build_history(Path(worktree), worktree_id, session, int(count))))


if __name__ == "__main__":
    main()
