"""The git-command back-end: a repository libgit2 cannot open (SHA-256), read and written by git.

pygit2's libgit2 1.9 opens only SHA-1 repositories. For any other the store,
diff and restore work on a :class:`GitRepository`: exactly the part of
``pygit2.Repository`` they use (objects by id, references, commits, the empty
tree, the object database, the configuration), answered by git processes
started through :mod:`snapshotd.git.process`, so every one is counted.

Reads go to one long-lived ``git cat-file --batch-command`` per repository
object (started on first use; ended by :meth:`GitRepository.close`, by leaving
its ``with`` block, or when the object is collected). Commits get their id at
once (computed as git does) and are written together by one ``hash-object``
before the next reference update (or a read of one of them); a blob is one
``hash-object``, a reference update one ``update-ref``, git's own
compare-and-swap. Ids are hex strings (64 digits in a SHA-256 repository)
wherever pygit2 would give an ``Oid``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import pygit2

from snapshotd.errors import GitError, RefLocked, RefMoved, SpawnTimeout, Unsupported
from snapshotd.git import bodies, loose, spawn
from snapshotd.git.flush import sync_filesystem
from snapshotd.git.format import HEX_LENGTH, object_format
from snapshotd.git.objects import (
    CLASSES,
    EmptyTreeBuilder,
    GitConfig,
    GitObject,
    GitOdb,
    GitReferences,
    GitTree,
)
from snapshotd.git.process import GitTarget, run_git_sync, start_git_session


class _Reader:
    """The repository's ``cat-file --batch-command`` process, shared with its finalizer."""

    def __init__(self) -> None:
        self.session: spawn.Session | None = None
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            session, self.session = self.session, None
        if session is not None:
            session.close()


class GitRepository:
    """A repository read and written by git processes, with pygit2's interface where the code needs it."""

    in_process = False

    def __init__(self, path: str | os.PathLike[str]) -> None:
        git_dir = os.path.abspath(os.fspath(path))
        fmt = object_format(git_dir)
        if fmt not in HEX_LENGTH:
            raise Unsupported(f"The repository at {git_dir} uses the object format {fmt!r}, which snapshotd does not know.")
        self.git_dir = git_dir
        self.path = os.path.join(git_dir, "")
        self.object_format = fmt
        self.hex_length = HEX_LENGTH[fmt]
        self.target = GitTarget(git_dir=git_dir, work_tree=None)
        self._reader = _Reader()
        self._finalizer = weakref.finalize(self, self._reader.close)
        self._config: GitConfig | None = None
        self._empty_tree_written = False
        self._command_mode = True  # cat-file --batch-command (git 2.36+); else --batch
        self._pending: list[tuple[str, str, bytes]] = []  # (id, type, content) not yet written

    # --- life ------------------------------------------------------------------

    # Made on each use, so that the repository is in no reference cycle: it is freed,
    # and its reader ended, as soon as the last reference to it goes.
    @property
    def references(self) -> GitReferences:
        return GitReferences(self)

    @property
    def odb(self) -> GitOdb:
        return GitOdb(self)

    def close(self) -> None:
        """Write what is pending and end the reading process (a later read starts another)."""
        try:
            self.flush()
        finally:
            self._reader.close()

    def __enter__(self) -> GitRepository:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def workdir(self) -> str | None:
        """The main worktree (the folder holding a ``.git`` folder), None for a bare repository."""
        if os.path.basename(self.git_dir) != ".git":
            return None
        return os.path.dirname(self.git_dir)

    @property
    def empty_tree_id(self) -> str:
        return hashlib.new(self.object_format, b"tree 0\0").hexdigest()

    @property
    def zero_id(self) -> str:
        return "0" * self.hex_length

    # --- the reading process ---------------------------------------------------

    def _start(self) -> spawn.Session:
        mode = "--batch-command" if self._command_mode else "--batch"
        return start_git_session(self.target, ["cat-file", mode])

    def _ask(self, verb: str, name: str) -> tuple[str, str, int, bytes | None] | str:
        """One request: ``(oid, type, size, data)`` (data only for ``contents``), or "missing"/"ambiguous"."""
        if not name or any(ch in name for ch in " \t\r\n\0"):
            raise ValueError(f"{name!r} is not an object name")
        if any(oid.startswith(name.lower()) for oid, _, _ in self._pending):
            self.flush()  # references only ever name written objects
        with self._reader.lock:
            for attempt in (1, 2):
                if self._reader.session is None:
                    self._reader.session = self._start()
                session = self._reader.session
                try:
                    return self._exchange(session, verb, name)
                except (OSError, EOFError, SpawnTimeout, GitError) as exc:
                    self._reader.session = None
                    session.close(wait=1.0)
                    stderr = session.stderr.decode("utf-8", "replace").strip()
                    if attempt == 1 and self._command_mode and "batch-command" in stderr:
                        self._command_mode = False  # an older git: plain --batch reads whole objects
                        continue
                    if isinstance(exc, GitError):
                        raise
                    reason = stderr.splitlines()[-1] if stderr else "it stopped answering"
                    raise GitError(f"git cat-file failed: {reason}") from exc
        raise AssertionError("unreachable")

    def _exchange(self, session: spawn.Session, verb: str, name: str) -> tuple[str, str, int, bytes | None] | str:
        request = f"{verb} {name}\n" if self._command_mode else f"{name}\n"
        session.send(request.encode())
        header = session.read_line()
        if not header.endswith(b"\n"):
            raise EOFError("git cat-file ended its output")
        fields = header.decode("utf-8", "replace").rstrip("\n").split(" ")
        if len(fields) == 2 and fields[1] in ("missing", "ambiguous"):
            return fields[1]
        if len(fields) != 3 or not fields[2].isdigit():
            raise GitError(f"git cat-file gave an unexpected answer: {header[:200]!r}")
        oid, kind, size = fields[0], fields[1], int(fields[2])
        data = None
        if verb == "contents" or not self._command_mode:
            data = session.read_exact(size + 1)[:-1]
        return oid, kind, size, data

    def oid(self, hex_id: str) -> str:
        """``hex_id`` as this back-end names objects: the hex string itself."""
        return hex_id

    def check_id(self, oid: object) -> str:
        """``oid`` as a lowercase hex id (or prefix of 4+ digits) of this repository; ValueError otherwise."""
        text = str(oid)
        if not 4 <= len(text) <= self.hex_length or any(ch not in "0123456789abcdefABCDEF" for ch in text):
            raise ValueError(f"{text!r} is not an object id of this repository")
        return text.lower()

    def _object(self, answer: tuple[str, str, int, bytes | None]) -> GitObject:
        oid, kind, _, data = answer
        assert data is not None
        return CLASSES.get(kind, GitObject)(self, oid, data)

    def header(self, oid: str) -> tuple[str, int]:
        """``(type name, size)`` of an object; KeyError when it is missing."""
        answer = self._ask("info", self.check_id(oid))
        if isinstance(answer, str):
            raise KeyError(oid)
        return answer[1], answer[2]

    def __getitem__(self, oid: object) -> GitObject:
        answer = self._ask("contents", self.check_id(oid))
        if isinstance(answer, str):
            if answer == "ambiguous":
                raise ValueError(f"the short object id {oid} is ambiguous")
            raise KeyError(str(oid))
        return self._object(answer)

    def get(self, oid: object, default: Any = None) -> Any:
        try:
            return self[oid]
        except KeyError:
            return default

    def __contains__(self, oid: object) -> bool:
        try:
            self.header(str(oid))
        except (KeyError, ValueError):
            return False
        return True

    def tree(self, oid: str) -> GitTree:
        obj = self[oid]
        if not isinstance(obj, GitTree):
            raise ValueError(f"the object {oid} is not a tree")
        return obj

    def revparse_single(self, spec: str) -> GitObject:
        """The object ``spec`` names, as git resolves it; ValueError naming ambiguity, KeyError if none."""
        answer = self._ask("contents", spec)
        if answer == "ambiguous":
            raise ValueError(f"short object ID {spec} is ambiguous")
        if isinstance(answer, str):
            raise KeyError(spec)
        return self._object(answer)

    def resolve_ref(self, name: str) -> str | None:
        """The id a reference points at, or None when there is no such reference."""
        if not name.startswith("refs/") and name != "HEAD":
            raise ValueError(f"{name!r} is not a full reference name")
        answer = self._ask("info", name)
        return None if isinstance(answer, str) else answer[0]

    def ref_names(self, prefix: str = "") -> list[str]:
        """Every reference name, or those under ``prefix`` (a folder such as ``refs/snapshotd/x/``)."""
        args = ["for-each-ref", "--format=%(refname)"]
        if prefix.rstrip("/"):
            args.append(prefix.rstrip("/"))
        out = run_git_sync(self.target, args)
        names = (os.fsdecode(line) for line in out.split(b"\n") if line)
        return [name for name in names if name.startswith(prefix)]

    # --- writing -----------------------------------------------------------------

    @property
    def config(self) -> GitConfig:
        if self._config is None:
            self._config = GitConfig(run_git_sync(self.target, ["config", "--list", "-z"]))
        return self._config

    def write_object(self, kind: str, data: bytes) -> str:
        """Store ``data`` as an object of type ``kind`` (as is: no filters); its id."""
        out = run_git_sync(self.target, ["hash-object", "-t", kind, "-w", "--stdin"], input=data)
        return out.decode("ascii").strip()

    def object_id(self, kind: str, data: bytes) -> str:
        """The id git gives ``data`` as an object of type ``kind``."""
        return hashlib.new(self.object_format, loose.with_header(kind, data)).hexdigest()

    def _defer(self, kind: str, data: bytes) -> str:
        """Queue an object for the next :meth:`flush`; its id, known at once."""
        oid = self.object_id(kind, data)
        self._pending.append((oid, kind, data))
        return oid

    def flush(self) -> bool:
        """Write the queued objects (commits): one ``hash-object`` per type. True if any were.

        Runs before a read that may name a queued object, before every
        reference update and on close, so a queued object is never missed; the
        store calls it before syncing the file system for a new checkpoint.
        """
        if not self._pending:
            return False
        pending, self._pending = self._pending, []
        try:
            self._write_all(pending)
        except BaseException:
            self._pending = pending + self._pending  # kept for the next attempt
            raise
        return True

    def _write_all(self, pending: list[tuple[str, str, bytes]]) -> None:
        with tempfile.TemporaryDirectory(prefix="snapshotd-objects-") as folder:
            for kind in sorted({kind for _, kind, _ in pending}):
                group = [(oid, data) for oid, each, data in pending if each == kind]
                names = []
                for number, (_, data) in enumerate(group):
                    name = os.path.join(folder, f"{kind}-{number}")
                    with open(name, "wb") as handle:
                        handle.write(data)
                    names.append(name)
                out = run_git_sync(
                    self.target,
                    ["hash-object", "-t", kind, "-w", "--no-filters", "--stdin-paths"],
                    input="".join(name + "\n" for name in names).encode(),
                )
                written = out.decode("ascii").split()
                if written != [oid for oid, _ in group]:
                    raise GitError(f"git hash-object gave other ids than expected for {len(group)} {kind} objects")

    def create_blob(self, data: bytes) -> str:
        return self.write_object("blob", data)

    def write_empty_tree(self) -> str:
        oid = self.empty_tree_id
        loose = os.path.join(self.git_dir, "objects", oid[:2], oid[2:])
        if not self._empty_tree_written and not os.path.exists(loose):
            # git treats the empty tree as always present, but fsck wants it stored.
            self.write_object("tree", b"")
        self._empty_tree_written = True
        return oid

    def make_durable(self) -> None:
        """Every object git wrote so far is on disk: git's writes are not followed here, so the file system is flushed.

        Not git's ``core.fsync=loose-object``: git 2.39 fsyncs each object file
        but not the folder it is renamed into, and its ``core.fsyncMethod=batch``
        (writeback started for each file, one fsync of a dummy file at the end)
        is documented as safe on macOS and Windows file systems only; and the
        fallback capture's ``update-index``/``write-tree`` write objects no id
        here names. This back-end serves SHA-256 repositories, rare enough.
        """
        self.flush()
        sync_filesystem(self.git_dir)

    def TreeBuilder(self) -> EmptyTreeBuilder:  # pygit2's name
        return EmptyTreeBuilder(self)

    def create_commit(
        self,
        update_ref: str | None,
        author: pygit2.Signature,
        committer: pygit2.Signature,
        message: str,
        tree: object,
        parents: Sequence[object],
        encoding: str | None = None,
    ) -> str:
        """A commit as libgit2 would write it; its id (no reference is updated: ``update_ref`` must be None).

        The object is written by the next :meth:`flush` (a read of it, a reference update or close).
        """
        if update_ref is not None:
            raise NotImplementedError("create_commit here never updates a reference")
        body = bodies.commit_body(
            self.check_id(tree), [self.check_id(parent) for parent in parents], author, committer, message, encoding
        )
        return self._defer("commit", body)

    def swap_ref(self, name: str, new: str | None, expected: str | None) -> None:
        """Point ``name`` at ``new`` (None: delete it) only if it points at ``expected`` (None: absent).

        git's ``update-ref <ref> <new> <old>`` checks the old value under the
        reference's lock. Raises RefMoved when the reference holds another
        value, RefLocked when another writer holds its lock.
        """
        self.flush()
        if new is None and expected is None:
            if self.resolve_ref(name) is not None:
                raise RefMoved(name)
            return
        if new is None:
            assert expected is not None
            args = ["update-ref", "-m", "snapshotd", "-d", name, self.check_id(expected)]
        else:
            old = self.zero_id if expected is None else self.check_id(expected)
            args = ["update-ref", "-m", "snapshotd", name, self.check_id(new), old]
        try:
            run_git_sync(self.target, args)
        except GitError as exc:
            if self.resolve_ref(name) != expected:
                raise RefMoved(name) from exc
            locks = (os.path.join(self.git_dir, name + ".lock"), os.path.join(self.git_dir, "packed-refs.lock"))
            if any(os.path.exists(lock) for lock in locks):
                raise RefLocked(str(exc)) from exc
            raise



