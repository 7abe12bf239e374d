"""File content as ``git checkout`` writes it, prepared before a plan touches anything.

Blobs hold content as git stores it; a worktree may hold something else
(line endings, ``ident``, ``working-tree-encoding``, smudge filters such as
LFS). When :func:`snapshotd.git.attributes.may_convert` says that can happen,
git itself checks every file to write out into a private stage folder, under
the ``.gitattributes`` the worktree will hold once the plan is applied, and
cleans what is on disk under the rules that held when it was captured.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass

import pygit2

from snapshotd.errors import InternalError
from snapshotd.git.attributes import ATTRIBUTES_FILE, may_convert
from snapshotd.git.config import ConfigLookup
from snapshotd.git.modes import MODE_FILE, is_file_mode
from snapshotd.git.process import GitTarget, run_git_sync
from snapshotd.git.repository import Repository
from snapshotd.paths import folders_above
from snapshotd.restore.fileops import DiskReader
from snapshotd.restore.plan import Plan
from snapshotd.restore.trees import Entry, TreeIndex
from snapshotd.store.diff import load_tree


@dataclass(frozen=True)
class GitCheckout:
    """How to ask git for file content as ``git checkout`` would write it.

    Blobs hold content as git stores it; the worktree may hold something else
    (CRLF line endings with ``core.autocrlf`` or ``eol=crlf``, ``ident``,
    ``working-tree-encoding``, smudge filters such as LFS). When any of that can
    apply to a file being written, its content comes from ``git checkout-index``
    with the repository's configuration (read from ``git_dir``: the worktree's
    git dir, or a plain folder's store) and the ``.gitattributes`` files the
    worktree will hold once the plan is applied.
    """

    git_dir: str
    tree: str | None = None  # the worktree's tree before the plan (the safety checkpoint's)
    config: ConfigLookup | None = None  # the configuration git reads (capture/state.py's git_config); None: the store's


def _folders_of(path: str) -> list[str]:
    """Every folder from the root down to ``path``'s own ("" is the root)."""
    return ["", *folders_above(path)]


def _attributes_path(folder: str) -> str:
    """The ``.gitattributes`` of ``folder`` ("" is the root)."""
    return f"{folder}/{ATTRIBUTES_FILE}" if folder else ATTRIBUTES_FILE


class GitIndex:
    """The stage's index where libgit2 cannot write one: entries go in with ``update-index --index-info``."""

    def __init__(self, path: str, git_dir: str) -> None:
        self.path = path
        self.git_dir = git_dir
        self.pending: list[tuple[str, Entry]] = []

    def add(self, path: str, entry: Entry) -> None:
        """Queue ``entry`` at ``path`` for the next :meth:`write`."""
        self.pending.append((path, entry))

    def write(self) -> None:
        """Add the queued entries to the index file, in one git process."""
        if not self.pending:
            return
        listing = b"".join(
            f"{entry.mode:06o} {entry.oid}\t".encode() + os.fsencode(path) + b"\0" for path, entry in self.pending
        )
        run_git_sync(
            GitTarget(git_dir=self.git_dir, work_tree=None),
            ["update-index", "-z", "--add", "--index-info"],
            index_file=self.path,
            input=listing,
        )
        self.pending.clear()


class Stage:
    """Checked-out content of the files a plan writes, prepared before anything is touched.

    Once :meth:`prepare` found that conversion may apply, a file that was not
    staged (a mode-only change that turns out to need a rewrite) is checked
    out on its own when asked for.
    """

    def __init__(self, repo: Repository, directory: str, checkout: GitCheckout | None, workdir: str) -> None:
        self.repo = repo
        self.directory = directory
        self.checkout = checkout
        self.workdir = workdir
        self.out = os.path.join(directory, "out")
        self.index_path = os.path.join(directory, "index")
        self.index: pygit2.Index | GitIndex | None = None
        self.files: set[str] = set()
        self.rules_before: str | None = None
        self._before: TreeIndex | None = None

    def keep_attributes(self, root_fd: int, plan: Plan) -> None:
        """Copy the ``.gitattributes`` ruling the planned paths as they are now, when the plan changes one.

        Applying deletes and writes in path order, so a ``.gitattributes`` may
        be gone or rewritten before the files it rules are checked against
        the safety checkpoint; those were captured under the rules on disk
        now, so :meth:`clean_id` cleans them under this copy.
        """
        if self.checkout is None:
            return
        paths = [*plan.deletes, *(p for p, _ in plan.writes)]
        if not any(path.rpartition("/")[2] == ATTRIBUTES_FILE for path in paths):
            return
        self.rules_before = os.path.join(self.directory, "rules-before")
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.mkdir(self.rules_before, mode=0o700)
        with contextlib.closing(DiskReader(root_fd)) as disk:
            for folder in {folder for path in paths for folder in _folders_of(path)}:
                data = disk.read(_attributes_path(folder))
                if data is not None:
                    os.makedirs(os.path.join(self.rules_before, folder), mode=0o700, exist_ok=True)
                    with open(os.path.join(self.rules_before, _attributes_path(folder)), "wb") as handle:
                        handle.write(data)

    def prepare(self, root_fd: int, plan: Plan) -> None:
        """Have git check out every file the plan writes, if conversion may apply.

        Attributes are those the worktree will have once the plan is applied:
        each ``.gitattributes`` the plan writes, none where the plan deletes
        one, and the one on disk elsewhere. Nothing is run when neither the
        configuration nor any such file can change a file's content.
        """
        if self.checkout is None:
            return
        files = [(path, entry) for path, entry in plan.writes if is_file_mode(entry.mode)]
        if not files:
            return
        planned = dict(plan.writes)
        deleted = set(plan.deletes)
        attributes: dict[str, Entry] = {}
        with contextlib.closing(DiskReader(root_fd)) as disk:
            for folder in {folder for path, _ in files for folder in _folders_of(path)}:
                name = _attributes_path(folder)
                if name in planned:
                    if is_file_mode(planned[name].mode):
                        attributes[name] = planned[name]
                    continue
                if name in deleted:
                    continue
                data = disk.read(name)
                if data is not None:
                    oid = self.repo.odb.write(pygit2.enums.ObjectType.BLOB, data)
                    attributes[name] = Entry(str(oid), MODE_FILE)
                elif (kept := self._kept_in_index(name)) is not None:
                    attributes[name] = kept
        config = self.checkout.config if self.checkout.config is not None else self.repo.config
        if not may_convert(config, self.repo.path, worktree_attributes=bool(attributes)):
            return
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.makedirs(os.path.join(self.directory, "wt"), mode=0o700)  # empty: attributes from the index
        os.makedirs(self.out, mode=0o700)
        if not self.repo.in_process:
            self.index = GitIndex(self.index_path, self.checkout.git_dir)
        else:
            self.index = pygit2.Index(self.index_path)
        for path, entry in attributes.items():
            self._add(path, entry)
        # Mode-only changes keep their content on disk; they are checked out only if needed.
        self._check_out([(p, e) for p, e in files if p not in plan.chmod_only])

    def _kept_in_index(self, name: str) -> Entry | None:
        """The ``.gitattributes`` at ``name`` the worktree's tree holds with no file on disk, or None.

        Only one the user's index keeps while it is missing on disk (skip-worktree
        or assume-unchanged) is captured so; checkout reads attributes from the
        index first, so git applies it to the files the plan writes.
        """
        if self.checkout is None or self.checkout.tree is None:
            return None
        if self._before is None:
            self._before = TreeIndex(self.repo, load_tree(self.repo, self.checkout.tree))
        entry = self._before.leaf(name)
        return entry if entry is not None and is_file_mode(entry.mode) else None

    def _check_out(self, files: list[tuple[str, Entry]]) -> None:
        """Have git check ``files`` out into the stage folder, with the attributes staged so far."""
        assert self.index is not None and self.checkout is not None
        if not files:
            return
        for path, entry in files:
            self._add(path, entry)
        self.index.write()
        listing = b"".join(os.fsencode(path) + b"\0" for path, _ in files)
        run_git_sync(
            GitTarget(git_dir=self.checkout.git_dir, work_tree=os.path.join(self.directory, "wt")),
            ["checkout-index", "-f", "-z", "--stdin", f"--prefix={self.out}/"],
            index_file=self.index_path,
            input=listing,
        )
        self.files.update(path for path, _ in files)

    def _add(self, path: str, entry: Entry) -> None:
        """Put ``entry`` in the stage's index, whichever kind of index it is."""
        if isinstance(self.index, GitIndex):
            self.index.add(path, entry)
        elif self.index is not None:
            self.index.add(pygit2.IndexEntry(path, pygit2.Oid(hex=entry.oid), entry.mode))  # type: ignore[arg-type]  # an int mode; pygit2's stub says FileMode

    def clean_id(self, path: str, data: bytes) -> str | None:
        """The blob id git would record for ``data`` at ``path`` (clean filters, line endings), or None.

        Asked only when the raw bytes hash to another id, so a file that
        conversion cannot touch never costs a process. The attributes are
        those from before the plan was applied (see :meth:`keep_attributes`).
        """
        if self.checkout is None:
            return None
        out = run_git_sync(
            GitTarget(git_dir=self.checkout.git_dir, work_tree=self.rules_before or self.workdir),
            ["hash-object", "--stdin", f"--path={path}"],
            input=data,
        )
        return out.decode("ascii", "replace").strip()

    def take(self, path: str, entry: Entry) -> bytes:
        """The content to write at ``path``: as git checks it out, or the blob as it is."""
        if path not in self.files:
            if self.index is None:
                return self.repo.odb.read(entry.oid)[1]  # the bytes alone: no Blob made (0.6x the time)
            self._check_out([(path, entry)])
        self.files.discard(path)
        full = os.path.join(self.out, path)
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InternalError(f"git did not check out {path!r} as a file.", path=path)
            with os.fdopen(fd, "rb", closefd=False) as handle:
                data = handle.read()
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(full)
        return data

