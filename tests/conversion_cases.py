"""Random repositories where content conversion depends on attributes, config and the user's index.

Shared by the differential fuzz in CI (tests/test_conversion_fuzz.py) and its
longer run (``python -m bench.conversion_fuzz``). An example is a repository
(SHA-1 or SHA-256) whose files are first committed as they are, then given
``.gitattributes`` (root and ``d/``) and conversion settings, so the index holds
blobs with and without CR under rules that convert; then a list of operations:
edits keeping or changing line endings, touches, same-size rewrites (also in
place with the mtime put back, a write in the same second git cannot see by its
stat data but for ctime), renames,
deletions, ``git add``, commits, index blobs set with or without CR, a
``.gitattributes`` changed in the worktree only, kept only in the index
(skip-worktree, missing on disk) or deleted, a folder moved in whole with a
``.gitattributes`` of its own (no event names that file), ``d`` moved out whole
and another moved in, and captures (warm, cold,
``exact``). After every capture the tree must equal ``git add -A`` +
``write-tree`` on a copy of the user's index (tests/oracle.py), run with
``core.safecrlf`` off, which changes no content (see snapshotd/capture/checkin.py).
Both of the oracle's answers count: by default it hashes every tracked file
again; with ``trust_stat`` it is ``git add -A`` as git runs it every day, which
keeps the blob of a file whose stat data match the index even where the rules
changed since (a new ``.gitattributes`` does not renormalise files git calls
clean).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from hypothesis import strategies as st
from oracle import OracleError, oracle_tree
from repo_helpers import git_run

from snapshotd.engine.core import Engine
from snapshotd.errors import SnapshotdError

FOLDERS = ["", "d"]
FILES = ["a.txt", "b.c", "d/e.txt", "d/f.bin", "u.u16", "d/g.c"]
# LF, CRLF, mixed, lone CR, NUL, an ident, empty; equal sizes (ab\r\n, abc\n) make same-size rewrites.
CONTENTS = [
    b"lf\nlf\n",
    b"cr\r\ncr\r\n",
    b"ab\r\n",
    b"abc\n",
    b"mixed\r\nlf\n",
    b"lone\rcr\n",
    b"nul\x00\r\n",
    b"$Id: 0123 $\r\n",
    b"\xff\xfeb\x00\r\x00\n\x00",
    b"",
]
UTF16 = [b"\xff\xfea\x00\n\x00", b"\xff\xfea\x00\r\x00\n\x00", b"\xfe\xff\x00a\x00\r\x00\n"]
ATTRIBUTE_LINES = [
    "* text=auto",
    "* text=auto eol=lf",
    "* text=auto eol=crlf",
    "*.txt text",
    "*.txt eol=crlf",
    "*.c -text",
    "*.bin binary",
    "*.c crlf",
    "*.c -crlf",
    "*.txt crlf=input",
    "*.c filter=up",
    "*.txt ident",
    "*.c text eol=lf",
    "*.u16 working-tree-encoding=UTF-16",
    "* -text",
]
SETTINGS = {
    "core.autocrlf": [None, "true", "input", "false"],
    "core.eol": [None, "lf", "crlf"],
    "core.safecrlf": [None, "true", "warn"],
}

Op = tuple[Any, ...]


def _content_for(path: str) -> st.SearchStrategy[bytes]:
    return st.sampled_from(UTF16 if path.endswith(".u16") else CONTENTS)


_file_and_content = st.sampled_from(FILES).flatmap(lambda p: st.tuples(st.just(p), _content_for(p)))
_lines = st.lists(st.sampled_from(ATTRIBUTE_LINES), min_size=1, max_size=3)
# Rules of line endings alone: a warm capture converts files with a CR byte in-process under them (capture/eol.py).
_line_ending_lines = st.lists(
    st.sampled_from([line for line in ATTRIBUTE_LINES if not any(word in line for word in ("filter", "ident", "encoding"))]),
    min_size=1, max_size=3,
)

# What happens in the worktree alone: a warm capture after these stays warm.
_worktree_changes = [
    _file_and_content.map(lambda pc: ("write", *pc)),
    _file_and_content.map(lambda pc: ("write", *pc)),
    st.tuples(st.just("touch"), st.sampled_from(FILES)),
    _file_and_content.map(lambda pc: ("same_second", *pc)),
    st.tuples(st.just("rename"), st.sampled_from(FILES), st.sampled_from(FILES)),
    st.tuples(st.just("delete"), st.sampled_from(FILES)),
    st.tuples(st.just("swap_d"), st.sampled_from(CONTENTS)),
]

operations = st.one_of(
    *_worktree_changes,
    st.tuples(st.just("stage"), st.sampled_from([*FILES, "."])),
    st.tuples(st.just("commit")),
    _file_and_content.map(lambda pc: ("index_blob", *pc)),
    st.tuples(st.just("attrs"), st.sampled_from(FOLDERS), _lines),
    st.tuples(st.just("hide_attrs"), st.sampled_from(FOLDERS)),
    st.tuples(st.just("drop_attrs"), st.sampled_from(FOLDERS)),
    st.tuples(st.just("move_in"), _lines, st.sampled_from(CONTENTS)),
    st.tuples(st.just("capture"), st.sampled_from(["warm", "exact"])),
    st.tuples(st.just("capture"), st.sampled_from(["warm", "exact"])),
)
# Only the worktree changes between warm captures: each is warm, and its files with a CR byte are converted in-process.
_worktree_operations = st.one_of(*_worktree_changes, st.tuples(st.just("capture"), st.just("warm")))


@dataclass
class Example:
    """One repository and what happens to it."""

    object_format: str
    files: dict[str, bytes]
    attributes: dict[str, list[str]]
    config: dict[str, str]
    ops: list[Op] = field(default_factory=list)


def _examples(
    object_format: str, lines: st.SearchStrategy[list[str]], ops: st.SearchStrategy[Op], max_ops: int, min_ops: int
) -> st.SearchStrategy[Example]:
    files = st.dictionaries(st.sampled_from(FILES), st.sampled_from(CONTENTS), min_size=1).map(
        lambda found: {path: (UTF16[1] if path.endswith(".u16") else data) for path, data in found.items()}
    )
    attributes = st.dictionaries(st.sampled_from(FOLDERS), lines, min_size=1)
    config = st.fixed_dictionaries({name: st.sampled_from(values) for name, values in SETTINGS.items()}).map(
        lambda drawn: {name: value for name, value in drawn.items() if value is not None}
    )
    return st.builds(Example, st.just(object_format), files, attributes, config, st.lists(ops, min_size=min_ops, max_size=max_ops))


def examples(object_format: str, max_ops: int = 12, min_ops: int = 0) -> st.SearchStrategy[Example]:
    return _examples(object_format, _lines, operations, max_ops, min_ops)


def line_ending_examples(object_format: str, max_ops: int = 12, min_ops: int = 0) -> st.SearchStrategy[Example]:
    """Examples for the warm path's own conversion (capture/eol.py): rules of line endings alone, the index as
    built (files committed as they were, CRLF ones too, then the rules), and only the worktree changing."""
    return _examples(object_format, _line_ending_lines, _worktree_operations, max_ops, min_ops)


def _attributes_path(folder: str) -> str:
    return f"{folder}/.gitattributes" if folder else ".gitattributes"


def _write(root: Path, rel: str, data: bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    path.write_bytes(data)


def _raw_blob(root: Path, data: bytes) -> str:
    return os.fsdecode(git_run(root, "hash-object", "-w", "--no-filters", "--stdin", input=data).stdout).strip()


def _rewrite_in_place(root: Path, rel: str, data: bytes) -> None:
    """Rewrite a file in place with ``data`` cut or padded to its size, its mtime put back: only ctime moves."""
    path = root / rel
    if not path.is_file() or path.is_symlink():
        return
    st_ = os.stat(path)
    with open(path, "r+b") as handle:
        handle.write((data * (st_.st_size // max(len(data), 1) + 1))[: st_.st_size] if data else b"\0" * st_.st_size)
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns))


def build(base: Path, example: Example) -> Path:
    """The example's repository: files committed as they are, then attributes, then the settings."""
    repo = base / "repo"
    repo.mkdir(parents=True)
    git_run(repo, "init", "-q", f"--object-format={example.object_format}")
    for rel, data in example.files.items():
        _write(repo, rel, data)
    git_run(repo, "add", "-A")
    git_run(repo, "commit", "-q", "--allow-empty", "-m", "files as they are")
    for folder, lines in example.attributes.items():
        _write(repo, _attributes_path(folder), "".join(line + "\n" for line in lines).encode())
    git_run(repo, "-c", "core.safecrlf=false", "add", "-A")
    git_run(repo, "commit", "-q", "--allow-empty", "-m", "attributes")
    git_run(repo, "config", "filter.up.clean", "tr a-z A-Z")
    for name, value in example.config.items():
        git_run(repo, "config", name, value)
    return repo


def apply(repo: Path, op: Op) -> None:
    """Apply one operation; one that cannot apply (renaming what is not there) does nothing."""
    kind = op[0]
    if kind == "write":
        _write(repo, op[1], op[2])
    elif kind == "touch":
        if (repo / op[1]).is_file():
            st_ = os.stat(repo / op[1])
            os.utime(repo / op[1], ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))
    elif kind == "same_second":
        _rewrite_in_place(repo, op[1], op[2])
    elif kind == "rename":
        src, dst = repo / op[1], repo / op[2]
        if src.is_file() and src != dst:
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.rename(src, dst)
    elif kind == "delete":
        if (repo / op[1]).is_file():
            (repo / op[1]).unlink()
    elif kind == "stage":
        git_run(repo, "-c", "core.safecrlf=false", "add", "-A", "--", op[1], check=False)
    elif kind == "commit":
        git_run(repo, "-c", "core.safecrlf=false", "commit", "-q", "-a", "-m", "user commit", check=False)
    elif kind == "index_blob":
        blob = _raw_blob(repo, op[2])
        git_run(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{op[1]}", check=False)
    elif kind == "attrs":
        _write(repo, _attributes_path(op[1]), "".join(line + "\n" for line in op[2]).encode())
    elif kind == "hide_attrs":
        name = _attributes_path(op[1])
        if git_run(repo, "ls-files", "--error-unmatch", "--", name, check=False).returncode == 0:
            git_run(repo, "update-index", "--skip-worktree", "--", name)
            if (repo / name).is_file():
                (repo / name).unlink()
    elif kind == "drop_attrs":
        if (repo / _attributes_path(op[1])).is_file():
            (repo / _attributes_path(op[1])).unlink()
    elif kind == "move_in":  # a folder moved in whole, its .gitattributes with it: no event names that file
        staged = Path(tempfile.mkdtemp(prefix="incoming-", dir=repo.parent))
        (staged / ".gitattributes").write_text("".join(line + "\n" for line in op[1]))
        (staged / "m.txt").write_bytes(op[2])
        shutil.rmtree(repo / "m", ignore_errors=True)
        os.rename(staged, repo / "m")
    elif kind == "swap_d":  # d moved out whole (its .gitattributes with it: no event names it), another moved in
        staged = Path(tempfile.mkdtemp(prefix="incoming-", dir=repo.parent))
        (staged / "e.txt").write_bytes(op[1])
        if (repo / "d").is_dir():
            os.rename(repo / "d", Path(tempfile.mkdtemp(prefix="away-", dir=repo.parent)) / "d")
        os.rename(staged, repo / "d")
    else:
        raise AssertionError(f"unknown operation {op!r}")


def describe(example: Example, upto: int) -> str:
    ops = "\n".join(f"  {i}: {op!r}" for i, op in enumerate(example.ops[: upto + 1]))
    return (
        f"object format {example.object_format}\nfiles {example.files!r}\n"
        f"attributes {example.attributes!r}\nconfig {example.config!r}\nops:\n{ops}"
    )


async def _capture(engine: Engine, repo: Path, kind: str) -> str | SnapshotdError:
    try:
        with trio.fail_after(60):
            result = await engine.call("checkpoint", {"path": str(repo), "session": "f", "exact": kind == "exact"})
    except SnapshotdError as exc:
        return exc
    return result["checkpoint"]["tree"]


def _oracle(repo: Path, *, trust_stat: bool = False) -> str | OracleError:
    try:
        return oracle_tree(repo, config={"core.safecrlf": "false"}, trust_stat=trust_stat)
    except OracleError as exc:
        return exc


async def run_example(tmp_path: Path, example: Example, *, watched: bool) -> list[str]:
    """Play ``example``; every capture that differs from git, described (empty: none differs).

    ``watched`` gives the engine a watcher, so captures are warm (or ``exact``,
    as drawn); without one every capture is cold. A capture fails only where
    git's own ``add`` fails too.
    """
    base = Path(tempfile.mkdtemp(prefix="conv-", dir=tmp_path))
    repo = build(base, example)
    differences: list[str] = []
    async with trio.open_nursery() as nursery:
        engine = Engine(nursery=nursery) if watched else Engine()
        try:
            for step, op in enumerate([*example.ops, ("capture", "warm")]):
                if op[0] != "capture":
                    apply(repo, op)
                    continue
                kind = op[1] if watched else "cold"
                got = await _capture(engine, repo, kind)
                want = _oracle(repo)
                if isinstance(got, str) and isinstance(want, str) and got == want:
                    continue
                if isinstance(got, str) and got == _oracle(repo, trust_stat=True):
                    continue  # git's everyday answer: a stat-clean file keeps its blob under new rules
                if not isinstance(got, str) and not isinstance(want, str):
                    continue  # git cannot add it either (an encoding git refuses)
                paths = ""
                if isinstance(got, str) and isinstance(want, str):
                    listing = git_run(repo, "diff-tree", "-r", "--name-status", want, got, check=False).stdout
                    paths = os.fsdecode(listing)
                differences.append(
                    f"[{kind}] capture {got!r} differs from git's {want!r}:\n{paths}{describe(example, step)}"
                )
                break
        finally:
            await engine.aclose()
            nursery.cancel_scope.cancel()
    shutil.rmtree(base, ignore_errors=True)
    return differences
