"""Tree-to-tree diffs as the protocol's FileChange records, and git-style patches.

The diff is computed in-process with libgit2 (pygit2), which reads only the
subtrees whose ids differ (:mod:`snapshotd.git.treediff`): rename detection with
``find_similar`` (renames only, git's default threshold), plus the exact
renames of symlinks and gitlinks that libgit2 leaves out and git finds
(:mod:`snapshotd.store.renames`), type changes between
file, symlink and gitlink kept as one ``type_changed`` record. libgit2 prints a
type change as a mode change with no hunks and counts no lines for it, whereas
git shows the old side deleted and the new side added; so line counts and
patch text of type changes come from a second diff without type changes, which
splits each into exactly that pair.

In a repository libgit2 cannot open (SHA-256; the back-end is not
``in_process``), and for a diff with a file over :data:`IN_PROCESS_BLOB_BYTES`,
git computes the same records: one ``git diff-tree -r -z --raw --numstat``
(``-M`` for renames, ``-p`` for the patch), whose records and per-file
patches (a type change prints as a deletion and an addition, as above) are
read back in order by :mod:`snapshotd.store.gitdiff`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import cast

import pygit2
from pygit2.enums import DeltaStatus, DiffFind, DiffOption

from snapshotd.contract.params import DEFAULT_MAX_PATCH_BYTES, MAX_CONTEXT, MAX_PATCH_BYTES
from snapshotd.errors import GitError, InvalidParams, NotFound, TooLarge
from snapshotd.git.abbrev import FALLBACK_ABBREV, auto_abbrev
from snapshotd.git.attrindex import patch_repository
from snapshotd.git.command import GitRepository
from snapshotd.git.libgit import LibgitRepository
from snapshotd.git.process import GitTarget
from snapshotd.git.repository import Repository
from snapshotd.git.treediff import tree_diff
from snapshotd.paths import path_matches
from snapshotd.store.changes import DiffRequest, Entry, FileChange, TreeDiff
from snapshotd.store.gitdiff import entries_by_git
from snapshotd.store.renames import exact_rename_patch, exact_renames

__all__ = ["DEFAULT_MAX_PATCH_BYTES", "MAX_CONTEXT", "MAX_PATCH_BYTES", "diff_trees", "load_tree"]

IN_PROCESS_BLOB_BYTES = 256 * 1024
"""A diff with a file bigger than this is made by git: libgit2 holds Python's GIL (and so the daemon's
loop) while it builds one file's patch, about 30 ms a megabyte; git does it in a process of its own."""

_ZERO_OID = "0" * 40
# A hunk header's function name ends with no blank, as git cuts it (to 80 bytes, then blanks off the end);
# libgit2 leaves one where its cut falls after a blank.
_HUNK_HEADER_TAIL = re.compile(r"^(@@ -[0-9,]+ \+[0-9,]+ @@(?: [^\n]*?[^\s])?)[ \t\v\f\r]+$", re.MULTILINE)
_EMPTY_TREE_SHA1 = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_GITLINK = 0o160000

_STATUS = {
    DeltaStatus.ADDED: "added",
    DeltaStatus.DELETED: "deleted",
    DeltaStatus.MODIFIED: "modified",
    DeltaStatus.RENAMED: "renamed",
    DeltaStatus.TYPECHANGE: "type_changed",
}


def load_tree(repo: Repository, tree_hex: str | None) -> pygit2.Tree | None:
    """The tree named by ``tree_hex`` (a commit is peeled to its tree); None stays None.

    Raises NotFound when the repository holds no such tree.
    """
    if tree_hex is None:
        return None
    try:
        obj = repo.get(tree_hex)
    except (ValueError, TypeError) as exc:
        raise NotFound(f"{tree_hex!r} is not a valid object id.", oid=str(tree_hex)) from exc
    if obj is None:
        raise NotFound(f"The tree {tree_hex} is not in the repository.", oid=tree_hex)
    try:
        tree = obj.peel(pygit2.Tree)
    except (pygit2.GitError, ValueError, KeyError) as exc:
        raise NotFound(f"The object {tree_hex} is not a tree.", oid=tree_hex) from exc
    return tree


def _mode(mode: int) -> str | None:
    return f"{mode:06o}" if mode else None


def _oid(oid: pygit2.Oid) -> str | None:
    text = str(oid)
    return None if text == _ZERO_OID else text


def _patch_text(part: pygit2.Patch, abbrev: int | None = None) -> str:
    """The patch text of one file, with git's tab after ---/+++ names that hold a space, and its ids
    abbreviated to ``abbrev`` digits where git would not use libgit2's 7 (:mod:`snapshotd.git.abbrev`)."""
    text = _HUNK_HEADER_TAIL.sub(r"\1", part.text or "")
    if not part.hunks and part.delta.status in (DeltaStatus.ADDED, DeltaStatus.DELETED) and not part.delta.is_binary:
        # An empty file added or deleted: git prints no ---/+++ lines, having no hunk for them to head.
        text = "\n".join(line for line in text.split("\n") if not line.startswith(("--- ", "+++ ")))
    if abbrev is not None and abbrev != FALLBACK_ABBREV:
        text = _abbreviated(text, part.delta, abbrev)
    old_spaced = b" " in part.delta.old_file.raw_path
    new_spaced = b" " in part.delta.new_file.raw_path
    if not (old_spaced or new_spaced):
        return text
    head, sep, body = text.partition("\n@@ ")
    lines = head.split("\n")
    for i, line in enumerate(lines):
        if line.endswith("\t") or line in ("--- /dev/null", "+++ /dev/null"):
            continue
        if (line.startswith("--- ") and old_spaced) or (line.startswith("+++ ") and new_spaced):
            lines[i] = line + "\t"
    return "\n".join(lines) + sep + body


def _abbreviated(text: str, delta: pygit2.DiffDelta, abbrev: int) -> str:
    """``text`` with the ids of its ``index`` line cut to ``abbrev`` digits."""
    header_end = text.find("\n@@ ")
    at = text.find("\nindex ", 0, header_end if header_end >= 0 else len(text))
    if at < 0:
        return text
    end = text.find("\n", at + 1)
    end = len(text) if end < 0 else end
    _, _, mode = text[at + 7 : end].partition(" ")
    line = f"index {str(delta.old_file.id)[:abbrev]}..{str(delta.new_file.id)[:abbrev]}" + (f" {mode}" if mode else "")
    return text[: at + 1] + line + text[end:]


def _split_type_changes(
    repo: LibgitRepository, old: pygit2.Tree | None, new: pygit2.Tree | None, paths: set[str], context: int
) -> dict[str, list[pygit2.Patch]]:
    """For each type-changed path, its deletion and addition patches, in that order."""
    split = tree_diff(repo, old, new, DiffOption.NORMAL, context, sorted(os.fsencode(path) for path in paths))
    found: dict[str, list[pygit2.Patch]] = {path: [] for path in paths}
    if split is None:
        return found
    for index, delta in enumerate(split.deltas):
        added = delta.status == DeltaStatus.ADDED
        path = os.fsdecode(delta.new_file.raw_path if added else delta.old_file.raw_path)
        if path in found:
            patch = split[index]
            if patch is not None:
                found[path].append(patch)
    for pair in found.values():
        pair.sort(key=lambda p: p.delta.status != DeltaStatus.DELETED)
    return found


def diff_trees(
    repo: Repository,
    old_tree: str | None,
    new_tree: str | None,
    *,
    paths: Sequence[str] | None = None,
    patch: bool = False,
    context: int = 3,
    find_renames: bool = True,
    offset: int = 0,
    max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES,
) -> TreeDiff:
    """The changes from ``old_tree`` to ``new_tree`` (hex ids; None is the empty tree).

    The files come in git's order, with a unified git-style patch of the
    listed files when ``patch`` is true.
    ``paths`` keeps only files selected by those relative paths (a rename is
    kept when either side is selected); None keeps everything. The files
    start at ``offset`` in that order; see :func:`_paged` for how a patch
    is cut to ``max_patch_bytes``.
    """
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise InvalidParams("context must be a non-negative integer.", context=context)
    request = DiffRequest(old_tree, new_tree, paths, patch, context, find_renames)
    entries = _diff_in_process(repo, request) if repo.in_process else _diff_with_git(cast(GitRepository, repo), request)
    return _paged(entries, offset, patch, max_patch_bytes)


def _paged(entries: Sequence[Entry], offset: int, patch: bool, max_patch_bytes: int) -> TreeDiff:
    """The result for the files from ``offset`` on, with a patch cut at ``max_patch_bytes``.

    A patch holds whole files only: when the next file's patch would pass the
    limit, the result stops before it and ``next_offset`` names it (null
    when the patch is complete), so a client pages with ``offset``. A single
    file whose patch alone is over the limit is ``too_large``.
    """
    files: list[FileChange] = []
    texts: list[str] = []
    used = 0
    next_offset = None
    for number, entry in enumerate(entries[offset:], start=offset):
        change, text = entry()
        size = len(text.encode("utf-8", "surrogateescape"))
        if used + size > max_patch_bytes:
            if not files:
                raise TooLarge(
                    f"The patch of {change.path} has {size} bytes, over max_patch_bytes "
                    f"({max_patch_bytes}); ask for less with 'paths', or raise max_patch_bytes "
                    f"(at most {MAX_PATCH_BYTES}).",
                    path=change.path,
                    bytes=size,
                    limit=max_patch_bytes,
                )
            next_offset = number
            break
        used += size
        texts.append(text)
        files.append(change)
    return TreeDiff(files, "".join(texts) if patch else None, next_offset)


def _diff_in_process(repo: Repository, request: DiffRequest) -> list[Entry]:
    """:func:`diff_trees` by libgit2: one entry per selected file, its patch made when asked for."""
    repo = patch_repository(cast(LibgitRepository, repo))
    old = load_tree(repo, request.old_tree)
    new = load_tree(repo, request.new_tree)
    if old is not None and new is not None and old.id == new.id:
        return []
    diff = tree_diff(repo, old, new, DiffOption.INCLUDE_TYPECHANGE, request.context)
    if diff is None:
        return []
    if request.find_renames:
        diff.find_similar(flags=DiffFind.FIND_RENAMES)
    deltas = list(diff.deltas)
    exact = exact_renames(deltas) if request.find_renames else {}
    renamed_away = set(exact.values())

    selected: list[tuple[int, pygit2.DiffDelta, str, str]] = []
    for index, delta in enumerate(deltas):
        if delta.status not in _STATUS or index in renamed_away:
            continue
        new_path = os.fsdecode(delta.new_file.raw_path)
        old_path = os.fsdecode(deltas[exact[index]].old_file.raw_path if index in exact else delta.old_file.raw_path)
        renamed = delta.status == DeltaStatus.RENAMED or index in exact
        path = old_path if delta.status == DeltaStatus.DELETED else new_path
        if request.paths is not None and not (
            path_matches(path, request.paths) or (renamed and path_matches(old_path, request.paths))
        ):
            continue
        selected.append((index, delta, path, old_path))
    if _has_big_file(repo, selected):
        sides = [_EMPTY_TREE_SHA1 if tree is None else str(tree.id) for tree in (old, new)]
        return entries_by_git(GitTarget(git_dir=repo.path, work_tree=repo.workdir), sides, _ZERO_OID, request)

    type_changed = {
        path for _, delta, path, _ in selected if delta.status == DeltaStatus.TYPECHANGE
    }
    split = _split_type_changes(repo, old, new, type_changed, request.context) if type_changed else {}
    abbrev = auto_abbrev(repo.path, repo.config, repo.hex_length) if request.patch else None

    def entry(index: int, delta: pygit2.DiffDelta, path: str, old_path: str) -> Entry:
        def make() -> tuple[FileChange, str]:
            if index in exact:
                source = deltas[exact[index]].old_file
                change = FileChange(
                    path=path, old_path=old_path, status="renamed",
                    old_mode=_mode(source.mode), new_mode=_mode(delta.new_file.mode),
                    old_oid=_oid(source.id), new_oid=_oid(delta.new_file.id),
                    binary=False, additions=0, deletions=0,
                )  # fmt: skip
                return change, exact_rename_patch(old_path, path) if request.patch else ""
            if delta.status == DeltaStatus.TYPECHANGE:
                parts = split[path]
            else:
                one = diff[index]
                parts = [one] if one is not None else []
            additions = deletions = 0
            binary = False
            for part in parts:
                _, added, deleted = part.line_stats
                additions += added
                deletions += deleted
                binary = binary or bool(part.delta.is_binary)
            change = FileChange(
                path=path,
                old_path=old_path if delta.status == DeltaStatus.RENAMED else None,
                status=_STATUS[delta.status],
                old_mode=_mode(delta.old_file.mode),
                new_mode=_mode(delta.new_file.mode),
                old_oid=_oid(delta.old_file.id),
                new_oid=_oid(delta.new_file.id),
                binary=binary,
                additions=0 if binary else additions,
                deletions=0 if binary else deletions,
                old_size=_size(repo, delta.old_file.id) if binary else None,
                new_size=_size(repo, delta.new_file.id) if binary else None,
            )
            return change, "".join(_patch_text(part, abbrev) for part in parts) if request.patch else ""

        return make

    return [entry(*chosen) for chosen in selected]


def _size(repo: Repository, oid: pygit2.Oid) -> int | None:
    """The bytes of one side of a binary file, from its object's header (None where the path does not exist)."""
    return None if _oid(oid) is None else int(repo.odb.read_header(oid)[1])


def _has_big_file(repo: Repository, selected: Sequence[tuple[int, pygit2.DiffDelta, str, str]]) -> bool:
    """Whether a selected file has a side over :data:`IN_PROCESS_BLOB_BYTES` (read from object headers)."""
    for _, delta, _, _ in selected:
        for side in (delta.old_file, delta.new_file):
            stored = side.mode and side.mode != _GITLINK and _oid(side.id) is not None
            if stored and repo.odb.read_header(side.id)[1] > IN_PROCESS_BLOB_BYTES:
                return True
    return False


# --------------------------------------------------------------------------- through git (store/gitdiff.py)


def _diff_with_git(repo: GitRepository, request: DiffRequest) -> list[Entry]:
    """:func:`diff_trees` by one ``git diff-tree``: raw records, then line counts, then the patch.

    The trees are read by git alone; only when it fails are they looked up, to
    report a missing one as :func:`load_tree` does.
    """
    sides = []
    for tree_hex in (request.old_tree, request.new_tree):
        try:
            sides.append(repo.empty_tree_id if tree_hex is None else repo.check_id(tree_hex))
        except (ValueError, TypeError) as exc:
            raise NotFound(f"{tree_hex!r} is not a valid object id.", oid=str(tree_hex)) from exc
    if sides[0] == sides[1]:
        return []
    try:
        return entries_by_git(GitTarget(git_dir=repo.git_dir, work_tree=repo.workdir), sides, repo.zero_id, request)
    except GitError:
        load_tree(repo, request.old_tree)
        load_tree(repo, request.new_tree)
        raise
