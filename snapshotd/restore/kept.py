"""What a restore leaves in place that the user may not expect: the ``kept`` list.

A restore never touches what no checkpoint holds: files ignored when it
began, and untracked files the capture left out (over the size cap, or not a
regular file). Those left out are always reported, within the restore's
paths. Ignored files are reported only when the restore changed the rules
that ignored them: after restoring an older ``.gitignore`` they show up as
untracked files nobody can explain, so they are listed with the reason.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterable, Iterator, Sequence

import pygit2

from snapshotd.capture.watchpaths import is_ignore_rules
from snapshotd.git.modes import MODE_TREE, is_file_mode
from snapshotd.git.process import GitTarget, run_git_sync
from snapshotd.git.repository import Repository
from snapshotd.paths import folders_above, path_matches
from snapshotd.store.diff import load_tree

__all__ = ["REASON_IGNORED", "REASON_IGNORED_THERE", "REASON_LEFT_OUT", "IgnoredFiles", "empty_index_path", "ignored_there",
           "left_out"]

REASON_IGNORED = "ignored when the restore began, so in no checkpoint; left in place"
REASON_IGNORED_THERE = "ignored by the restored checkpoint's own rules, so in none of its files; left in place"
REASON_LEFT_OUT = "left out of every checkpoint (over the size cap, or not a regular file); left in place"


def _folders_ruled(paths: Iterable[str]) -> list[str]:
    """The folders whose ignore rules change when these paths are written or deleted."""
    return sorted({path.rpartition("/")[0] for path in paths if is_ignore_rules(path)})


class IgnoredFiles:
    """The ignored files under folders whose ``.gitignore`` a plan changes, seen before it is applied.

    ``index_file`` is the index git compares with (None: the worktree's own,
    only read); for a plain folder it names a file that does not exist, an
    empty index.
    """

    def __init__(self, target: GitTarget, index_file: str | None, changed: Iterable[str]) -> None:
        self.target = target
        self.index_file = index_file
        self.before: list[str] = []
        folders = _folders_ruled(changed)
        if folders:
            listing = run_git_sync(
                target,
                ["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory", "--",
                 *(f":(top){folder}" if folder else ":(top)" for folder in folders)],
                index_file=index_file,
            )
            self.before = sorted(os.fsdecode(raw) for raw in listing.split(b"\0") if raw)

    def no_longer_ignored(self) -> list[dict[str, str]]:
        """Those of the files seen before that the rules on disk now no longer ignore."""
        if not self.before:
            return []
        listing = run_git_sync(
            self.target,
            ["check-ignore", "-z", "--stdin"],
            index_file=self.index_file,
            input=b"".join(os.fsencode(path) + b"\0" for path in self.before),
            ok_codes=(0, 1),
        )
        still = {os.fsdecode(raw) for raw in listing.split(b"\0") if raw}
        return [{"path": path, "reason": REASON_IGNORED} for path in self.before if path not in still]


def ignored_there(repo: Repository, tree: str, paths: Sequence[str], target: GitTarget, tmp_dir: str) -> set[str]:
    """Of ``paths``, those the ignore rules of ``tree`` ignore: its ``.gitignore`` files, with the repository's
    ``info/exclude`` and the user's excludes file, as git would read them once the tree is checked out.

    A file ignored when its checkpoint was taken is in none of its files; a
    restore to that checkpoint would delete it as made since (a restore that
    took its ``.gitignore`` away, then ``undo``): git leaves ignored files,
    and so does a restore. The rules of the folders above ``paths`` (the only
    ones git reads for them) are written alone into a scratch folder for
    ``git check-ignore --no-index``; none when those folders have no
    ``.gitignore`` (the other rules are the same now and then).
    """
    if not paths:
        return set()
    above = {"", *(folder for path in paths for folder in folders_above(path))}
    rules = list(_rules_above(repo, load_tree(repo, tree), above, ""))
    if not rules:
        return set()
    with tempfile.TemporaryDirectory(prefix="rules-", dir=tmp_dir) as scratch:
        for path, data in rules:
            os.makedirs(os.path.join(scratch, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(scratch, path), "wb") as handle:
                handle.write(data)
        listing = run_git_sync(
            GitTarget(git_dir=target.git_dir, work_tree=scratch),
            ["check-ignore", "--no-index", "-z", "--stdin"],
            input=b"".join(os.fsencode(path) + b"\0" for path in paths),
            ok_codes=(0, 1),
        )
    return {os.fsdecode(raw) for raw in listing.split(b"\0") if raw}


def _rules_above(
    repo: Repository, tree: pygit2.Tree | None, folders: set[str], prefix: str
) -> Iterator[tuple[str, bytes]]:
    """Each ``.gitignore`` blob of ``tree`` in one of ``folders``, with its path; no other folder is read."""
    for entry in tree or ():
        name = str(entry.name)
        if name in ("", ".", "..", ".git") or "/" in name:
            continue  # no name git itself would check out (a fetched tree may hold anything)
        path = prefix + name
        if entry.filemode == MODE_TREE:
            if path in folders:
                yield from _rules_above(repo, load_tree(repo, str(entry.id)), folders, path + "/")
        elif is_ignore_rules(name) and is_file_mode(entry.filemode):
            yield path, bytes(repo.odb.read(entry.id)[1])


def empty_index_path(tmp_dir: str) -> str:
    """A name for an index that does not exist (git reads it as empty), in the worktree's temp folder."""
    return os.path.join(tmp_dir, f"index-kept-{secrets.token_hex(6)}")


def left_out(skipped: Iterable[str], paths: Sequence[str] | None) -> list[dict[str, str]]:
    """The capture's left-out paths (``CaptureStats.skipped``) within ``paths`` (None: all), as ``kept`` entries."""
    return [
        {"path": path, "reason": REASON_LEFT_OUT}
        for path in skipped
        if paths is None or path_matches(path.rstrip("/"), paths)
    ]
