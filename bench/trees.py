"""The trees the benchmark runs on, built once under bench/work/ and reused.

* Synthetic trees of N files from ``fixtures/repos/make_synthetic.py``,
  committed, with a second branch ``bench-other`` (1 % of the files changed,
  20 added, 20 removed) for the branch-switch case.
* A real project's source: consecutive sdists of one release series,
  downloaded with pip and unpacked; each release applied over the worktree is
  one "turn" with a real diff.
* Linked worktrees (``git worktree add``) of one synthetic repository, for
  the many-sessions run and the memory figures.

A tree is reused when its ``<name>.json`` record exists; a half-built one
(folder without record) is removed and built again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .common import REPO_ROOT, WORK, git, human_count, refresh_index

sys.path.insert(0, str(REPO_ROOT / "fixtures" / "repos"))
from make_synthetic import make_synthetic

OTHER_BRANCH = "bench-other"
MAIN_BRANCH = "main"


@dataclass
class Tree:
    """One worktree the cases run on."""

    name: str
    path: str
    files: int  # tracked files
    bytes: int
    kind: str  # "synthetic" | "real" | "linked"
    extra: dict = field(default_factory=dict)

    def tracked(self) -> list[str]:
        """Tracked paths, in git's order (read fresh: the real-project tree changes)."""
        out = git(self.path, "ls-files", "-z")
        return [os.fsdecode(p) for p in out.split(b"\0") if p]


def _record_path(name: str) -> Path:
    return WORK / f"{name}.json"


def _load(name: str) -> Tree | None:
    record = _record_path(name)
    if not record.exists():
        return None
    data = json.loads(record.read_text())
    tree = Tree(**data)
    if not Path(tree.path, ".git").exists():
        return None
    return tree


def _save(tree: Tree) -> Tree:
    _record_path(tree.name).write_text(json.dumps(asdict(tree), indent=1))
    return tree


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)


def _make_other_branch(path: Path, files: int) -> dict:
    """Commit a sibling branch with 1 % of files changed, 20 added and 20 removed."""
    tracked = [os.fsdecode(p) for p in git(path, "ls-files", "-z").split(b"\0") if p]
    tracked = [p for p in tracked if p != ".gitignore"]
    changed = tracked[:: max(1, len(tracked) // max(10, files // 100))][: max(10, files // 100)]
    removed = tracked[-20:]
    git(path, "checkout", "-q", "-b", OTHER_BRANCH)
    for rel in changed:
        with open(path / rel, "ab") as fh:
            fh.write(b"\n// changed on the other branch\n")
    for rel in removed:
        os.unlink(path / rel)
    for i in range(20):
        target = path / "added_on_branch" / f"new{i:02}.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"file {i} that only the other branch has\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "the other branch")
    git(path, "checkout", "-q", MAIN_BRANCH)
    return {"branch_changed": len(changed), "branch_added": 20, "branch_removed": len(removed)}


def synthetic(files: int, *, seed: int = 0, log: bool = True) -> Tree:
    """A committed synthetic tree of ``files`` files, with the ``bench-other`` branch."""
    name = f"syn-{human_count(files)}"
    found = _load(name)
    if found is not None:
        return found
    path = WORK / name
    _fresh_dir(path)
    if log:
        print(f"  building {name} ({files} files) ...", flush=True)
    made = make_synthetic(path, files, seed=seed, commit=True)
    extra = _make_other_branch(path, files)
    extra["build_s"] = made.seconds
    refresh_index(path)
    return _save(Tree(name, str(path), files, made.bytes, "synthetic", extra))


# --------------------------------------------------------------------------- real project


def _download(project: str, version: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for candidate in dest.iterdir():
        stem = candidate.name.lower()
        if stem.startswith(f"{project.lower()}-{version}.tar") or stem == f"{project.lower()}-{version}.zip":
            return candidate
    proc = subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--disable-pip-version-check", "-q", f"{project}=={version}", "-d", str(dest),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {project}=={version} failed: {proc.stderr.strip()[-400:]}")
    for candidate in dest.iterdir():
        if candidate.name.lower().startswith(f"{project.lower()}-{version}.tar"):
            return candidate
    raise RuntimeError(f"pip download {project}=={version} left no sdist in {dest}")


def _unpack(archive: Path, dest: Path) -> None:
    """Unpack an sdist into ``dest`` without its top folder."""
    tmp = dest.with_name(dest.name + ".tmp")
    _fresh_dir(tmp)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
    tops = list(tmp.iterdir())
    inner = tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp
    _fresh_dir(dest)
    os.rename(inner, dest)
    shutil.rmtree(tmp, ignore_errors=True)


def release_files(release: Path) -> dict[str, Path]:
    """Relative path -> file of one unpacked release."""
    found = {}
    for root, dirs, names in os.walk(release):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            full = Path(root, name)
            found[full.relative_to(release).as_posix()] = full
    return found


def apply_release(worktree: str | Path, release: Path) -> dict[str, int]:
    """Make the worktree's files equal a release: write what differs, remove what it dropped."""
    worktree = Path(worktree)
    wanted = release_files(release)
    present = release_files(worktree)
    written = removed = 0
    for rel, source in wanted.items():
        data = source.read_bytes()
        target = worktree / rel
        try:
            if target.read_bytes() == data and not target.is_symlink():
                continue
        except OSError:
            pass
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.write_bytes(data)
        written += 1
    for rel in present.keys() - wanted.keys():
        (worktree / rel).unlink()
        removed += 1
    for root, dirs, _ in os.walk(worktree, topdown=False):
        if ".git" in Path(root).relative_to(worktree).parts:
            continue
        for d in dirs:
            full = Path(root, d)
            if d != ".git" and full.is_dir() and not any(full.iterdir()):
                full.rmdir()
    return {"written": written, "removed": removed}


def unpacked_releases(project: str, versions: list[str], cache: Path, *, log: bool = True) -> list[Path]:
    """Each release's sdist, downloaded once into ``cache``/sdists and unpacked under ``cache``/releases.

    Raises RuntimeError when a download fails.
    """
    releases_dir = cache / "releases" / project.lower()
    releases = []
    for version in versions:
        unpacked = releases_dir / version
        if not (unpacked.exists() and any(unpacked.iterdir())):
            if log:
                print(f"  downloading {project} {version} sdist ...", flush=True)
            archive = _download(project, version, cache / "sdists")
            _unpack(archive, unpacked)
        releases.append(unpacked)
    return releases


def release_history(project: str, versions: list[str], cache: Path, *, log: bool = True) -> Path:
    """A repository under ``cache`` with one commit per release, oldest first, built once.

    A history the replay can play where only PyPI is reachable. Raises
    RuntimeError when a download fails.
    """
    releases = unpacked_releases(project, versions, cache, log=log)
    path = cache / "histories" / f"{project.lower()}-{versions[0]}-{versions[-1]}-{len(versions)}"
    record = path.parent / f"{path.name}.done"
    if record.exists() and Path(path, ".git").exists():
        return path
    _fresh_dir(path)
    path.mkdir()
    git(path, "init", "-q", "-b", MAIN_BRANCH)
    for version, release in zip(versions, releases, strict=True):
        apply_release(path, release)
        git(path, "add", "-A")
        git(path, "commit", "-q", "--allow-empty", "-m", f"{project} {version}")
    record.write_text("\n".join(versions) + "\n")
    return path


def real_project(project: str, versions: list[str], *, log: bool = True) -> tuple[Tree, list[Path]]:
    """A worktree holding ``versions[0]`` of ``project``, committed, and every release unpacked.

    Raises RuntimeError when a download fails.
    """
    name = f"real-{project.lower()}"
    releases = unpacked_releases(project, versions, WORK, log=log)
    found = _load(name)
    if found is not None and found.extra.get("versions") == versions:
        return found, releases
    path = WORK / name
    _fresh_dir(path)
    path.mkdir()
    apply_release(path, releases[0])
    git(path, "init", "-q", "-b", MAIN_BRANCH)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", f"{project} {versions[0]}")
    refresh_index(path)
    count = len(git(path, "ls-files", "-z").split(b"\0")) - 1
    size = sum(p.stat().st_size for p in release_files(path).values())
    tree = Tree(name, str(path), count, size, "real", {"project": project, "versions": versions})
    return _save(tree), releases


# --------------------------------------------------------------------------- linked worktrees


def linked_worktrees(count: int, files: int, *, log: bool = True) -> list[Tree]:
    """``count`` linked worktrees (``git worktree add``) of one synthetic repository."""
    name = f"linked-{count}x{human_count(files)}"
    root = WORK / name
    record = _record_path(name)
    if record.exists():
        data = json.loads(record.read_text())
        trees = [Tree(**item) for item in data]
        if all(Path(t.path, ".git").exists() for t in trees):
            return trees
    _fresh_dir(root)
    if log:
        print(f"  building {count} linked worktrees of {files} files ...", flush=True)
    base = root / "base"
    made = make_synthetic(base, files, seed=1, commit=True)
    trees = []
    for i in range(count):
        path = root / f"wt{i:02}"
        git(base, "worktree", "add", "-q", "-b", f"wt{i:02}", str(path))
        trees.append(Tree(f"{name}/wt{i:02}", str(path), files, made.bytes, "linked"))
    refresh_index(base)
    for tree in trees:
        git(tree.path, "update-index", "-q", "--refresh", ok=(0, 1))
    record.write_text(json.dumps([asdict(t) for t in trees], indent=1))
    return trees
