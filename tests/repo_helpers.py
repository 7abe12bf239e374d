"""Small helpers for tests that build real git repositories."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from oracle import clean_git_env

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "repos"

# Refs the daemon owns (its own, and those it fetched); everything else in a repository belongs to the user.
SNAPSHOTD_REFS = "refs/snapshotd/"
FETCHED_REFS = "refs/snapshotd-remote/"


def git_run(
    cwd: str | Path,
    *args: str,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """Run git in ``cwd`` with an environment that cannot redirect it."""
    proc = subprocess.run(
        ["git", "-c", "gc.auto=0", "-c", "core.fsmonitor=false", *args],
        cwd=cwd,
        env=clean_git_env(env),
        input=input,
        capture_output=True,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"git {' '.join(args)} in {cwd} exited {proc.returncode}: "
            f"{proc.stderr.decode(errors='replace').strip()}"
        )
    return proc


def git(
    cwd: str | Path,
    *args: str,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run git and return its stdout as text, without the final newline."""
    out = git_run(cwd, *args, input=input, env=env).stdout
    return os.fsdecode(out).rstrip("\n")


def git_bytes(cwd: str | Path, *args: str, env: Mapping[str, str] | None = None) -> bytes:
    """Run git and return its raw stdout."""
    return git_run(cwd, *args, env=env).stdout


def git_ok(cwd: str | Path, *args: str, env: Mapping[str, str] | None = None) -> bool:
    """True when git exits 0."""
    return git_run(cwd, *args, env=env, check=False).returncode == 0


def write(path: str | Path, content: str | bytes = "", mode: int | None = None) -> Path:
    """Write a file (creating its folders); ``mode`` is applied with chmod."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode() if isinstance(content, str) else content
    path.write_bytes(data)
    if mode is not None:
        path.chmod(mode)
    return path


def commit_all(repo: str | Path, message: str = "commit") -> str:
    """``git add -A`` and commit in the user's repository; returns the commit id."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def init_repo(path: str | Path, *files: tuple[str, str | bytes], commit: bool = True) -> Path:
    """A new repository at ``path`` with ``files``, committed unless told not to."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    for name, content in files:
        write(path / name, content)
    if commit and files:
        commit_all(path, "initial")
    return path


def load_fixture(name: str) -> ModuleType:
    """Import ``fixtures/repos/<name>.py`` as a module."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def git_path(repo: str | Path, name: str) -> Path:
    """Absolute ``git rev-parse --git-path NAME`` for the worktree at ``repo``."""
    return Path(git(repo, "rev-parse", "--path-format=absolute", "--git-path", name))


def tree_entries(
    repo: str | Path, treeish: str, *, git_dir: str | Path | None = None
) -> dict[str, tuple[str, str, str]]:
    """``{path: (mode, type, oid)}`` for every entry of ``treeish``, recursively."""
    prefix = [f"--git-dir={git_dir}"] if git_dir is not None else []
    out = git_bytes(repo, *prefix, "ls-tree", "-r", "-z", "--full-tree", treeish)
    entries: dict[str, tuple[str, str, str]] = {}
    for item in out.split(b"\0"):
        if not item:
            continue
        meta, _, name = item.partition(b"\t")
        mode, kind, oid = meta.decode().split()
        entries[os.fsdecode(name)] = (mode, kind, oid)
    return entries


def blob(repo: str | Path, treeish: str, path: str) -> bytes:
    """The bytes of ``path`` in ``treeish``."""
    oid = git(repo, "rev-parse", "--verify", "-q", f"{treeish}:{path}")
    return git_bytes(repo, "cat-file", "blob", oid)


def file_fingerprint(path: str | Path) -> tuple[bytes, int] | None:
    """``(bytes, mtime_ns)`` of a file, or None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return Path(path).read_bytes(), st.st_mtime_ns


def worktree_listing(root: str | Path) -> dict[str, tuple[Any, ...]]:
    """Everything under ``root`` except its top ``.git``: type, mode, size, mtime, content.

    Never follows symlinks and never opens anything but regular files, so
    FIFOs and devices are safe to list.
    """
    root = Path(root)
    listing: dict[str, tuple[Any, ...]] = {}
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            it = os.scandir(folder)
        except PermissionError:
            continue  # recorded by its parent; its contents cannot be listed
        with it:
            for entry in it:
                if folder == root and entry.name == ".git":
                    continue
                rel = os.path.relpath(entry.path, root)
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    listing[rel] = ("dir", st.st_mode, st.st_mtime_ns)
                    stack.append(Path(entry.path))
                elif stat.S_ISLNK(st.st_mode):
                    listing[rel] = ("link", os.readlink(entry.path))
                elif stat.S_ISREG(st.st_mode):
                    try:
                        digest = hashlib.sha256(Path(entry.path).read_bytes()).hexdigest()
                    except PermissionError:
                        digest = "unreadable"
                    listing[rel] = ("file", st.st_mode, st.st_size, st.st_mtime_ns, digest)
                else:
                    listing[rel] = ("special", st.st_mode, st.st_mtime_ns)
    return listing


def user_refs(repo: str | Path) -> dict[str, str]:
    """Every ref of the repository except the daemon's own."""
    out = git(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    refs: dict[str, str] = {}
    for line in out.splitlines():
        name, _, oid = line.partition(" ")
        if not name.startswith((SNAPSHOTD_REFS, FETCHED_REFS)):
            refs[name] = oid
    return refs


def user_state(repo: str | Path, *, with_worktree: bool = True) -> dict[str, Any]:
    """What a capture must leave exactly as it was: index, HEAD, refs, stash, files."""
    repo = Path(repo)
    git_dir = git_path(repo, ".")
    common = Path(git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir"))
    state: dict[str, Any] = {
        "index": file_fingerprint(git_path(repo, "index")),
        "index.lock": file_fingerprint(git_path(repo, "index.lock")),
        # git itself refreshes a shared index's mtime whenever it reads it.
        "shared_indexes": {p.name: p.read_bytes() for p in sorted(git_dir.glob("sharedindex.*"))},
        "HEAD file": file_fingerprint(git_dir / "HEAD"),
        "HEAD": git_run(repo, "rev-parse", "-q", "--verify", "HEAD", check=False).stdout,
        "refs": user_refs(repo),
        "stash": git_run(repo, "log", "-g", "--format=%H", "refs/stash", check=False).stdout,
        "HEAD reflog": file_fingerprint(git_dir / "logs" / "HEAD"),
        "config": file_fingerprint(common / "config"),
    }
    if with_worktree:
        state["worktree"] = worktree_listing(repo)
    return state


def assert_same_state(before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Fail naming the first part of the user's state that changed."""
    assert before.keys() == after.keys()
    for key in before:
        if key == "worktree":
            b, a = before[key], after[key]
            changed = sorted(k for k in b.keys() | a.keys() if b.get(k) != a.get(k))
            assert not changed, f"the capture changed the worktree: {changed[:10]}"
        else:
            assert before[key] == after[key], f"the capture changed the user's {key}"


def loose_objects(repo: Path) -> set[str]:
    """The ids of the loose objects in ``repo``'s ``.git`` (git's temporary files left out)."""
    objects = repo / ".git" / "objects"
    return {
        folder.name + entry.name
        for folder in objects.iterdir() if len(folder.name) == 2
        for entry in folder.iterdir() if not entry.name.startswith("tmp_")
    }
