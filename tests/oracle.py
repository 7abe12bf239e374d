"""Git's own answer to "what tree should a capture of this worktree give".

The contract (docs: protocol.md, Checkpoint ``tree``) defines a capture as the
tree that ``git add -A && git write-tree`` gives when run on a copy of the
user's index. :func:`oracle_tree` computes exactly that with git commands and
nothing else, so tests compare the engine against git itself, never against a
second copy of the engine's logic.

Rules carried over from the contract:

- the user's index is copied (with no index, a fresh one is used); the copy's
  mtime is set to 1970, which makes every entry "racily clean" to git, so
  git compares the content of every entry whose stat data look clean (see
  ``trust_stat``): "tracked files as they are on disk", even where a rewrite
  fooled git's stat check;
- assume-unchanged and skip-worktree flags are cleared on entries whose file
  exists on disk, so those are taken from disk; entries whose file is absent
  keep their flags and so their index content (sparse checkout), as the
  contract says for both flags;
- ``git add -A --sparse`` so that files present outside a sparse-checkout cone
  are taken from disk too;
- untracked files larger than ``size_cap`` are left out;
- a nested repository with no commit checked out is left out (git 2.39 makes
  ``git add -A`` fail on it);
- a folder that is not a git worktree is captured with a temporary bare
  repository and a fresh index.

The user's index file must be byte-identical and keep its mtime afterwards;
the oracle checks that itself and raises ``AssertionError`` otherwise.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["OracleError", "clean_git_env", "oracle_tree"]

# Variables that point git at another repository, index or work tree
# (`git rev-parse --local-env-vars`), plus the ones that change how pathspecs
# are read. None of them may leak into the oracle.
_REDIRECTING_ENV = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_OBJECT_DIRECTORY",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_GRAFT_FILE",
    "GIT_INDEX_FILE",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_REPLACE_REF_BASE",
    "GIT_PREFIX",
    "GIT_INTERNAL_SUPER_PREFIX",
    "GIT_SHALLOW_FILE",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    "GIT_LITERAL_PATHSPECS",
    "GIT_GLOB_PATHSPECS",
    "GIT_NOGLOB_PATHSPECS",
    "GIT_ICASE_PATHSPECS",
    "GIT_TEMPLATE_DIR",
    "GIT_INDEX_VERSION",
    "GIT_TEST_SPLIT_INDEX",
)

# Settings that only change how fast git finds its answer, never the answer.
_SPEED_ONLY_CONFIG = (
    "-c",
    "gc.auto=0",
    "-c",
    "maintenance.auto=false",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.untrackedCache=false",
    "-c",
    "advice.addEmbeddedRepo=false",
)


# One second after the epoch (0 would switch git's racy check off).
_RACY_EPOCH_NS = 10**9


class OracleError(RuntimeError):
    """A git command the oracle ran failed; carries its argv and stderr."""

    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        super().__init__(f"{' '.join(argv)} exited {returncode}: {stderr.strip()}")
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr


def clean_git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` without anything that would redirect git, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _REDIRECTING_ENV}
    env["GIT_OPTIONAL_LOCKS"] = "0"
    if extra:
        env.update(extra)
    return env


def _run(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    input: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(
        argv,
        cwd=cwd,
        env=dict(env),
        input=input,
        capture_output=True,
        check=False,
    )
    if check and proc.returncode != 0:
        raise OracleError(argv, proc.returncode, proc.stderr.decode(errors="replace"))
    return proc


def _git(
    cwd: Path,
    env: Mapping[str, str],
    *args: str,
    input: bytes | None = None,
    check: bool = True,
    prefix: Iterable[str] = (),
) -> subprocess.CompletedProcess[bytes]:
    argv = ["git", *prefix, *_SPEED_ONLY_CONFIG, *args]
    return _run(argv, cwd=cwd, env=env, input=input, check=check)


def _fsdecode_z(out: bytes) -> list[str]:
    return [os.fsdecode(item) for item in out.split(b"\0") if item]


def _toplevel(folder: Path, env: Mapping[str, str]) -> Path | None:
    proc = _git(folder, env, "rev-parse", "--show-toplevel", check=False)
    if proc.returncode != 0:
        return None
    out = proc.stdout.rstrip(b"\n")
    if not out:  # inside a .git folder or a bare repository
        return None
    return Path(os.fsdecode(out))


def _has_commit(repo: Path, env: Mapping[str, str]) -> bool:
    """True when the nested repository at ``repo`` has HEAD pointing at a commit."""
    top = _toplevel(repo, env)
    if top is None or top.resolve() != repo.resolve():
        return False
    proc = _git(repo, env, "rev-parse", "-q", "--verify", "HEAD^{commit}", check=False)
    return proc.returncode == 0


def _literal_exclude(path: str) -> bytes:
    return b":(exclude,top,literal)" + os.fsencode(path)


def _add_and_write_tree(
    top: Path,
    env: Mapping[str, str],
    size_cap: int | None,
    *,
    prefix: Iterable[str] = (),
) -> str:
    """Run the contract's ``add -A`` + ``write-tree`` against ``env``'s index."""
    prefix = list(prefix)

    listing = _git(top, env, "ls-files", "-v", "-z", prefix=prefix).stdout
    assume_unchanged: list[str] = []
    skip_present: list[str] = []
    for item in _fsdecode_z(listing):
        tag, path = item[0], item[2:]
        if not os.path.lexists(top / path):
            continue  # flagged and absent from disk: the index's entry stands
        if tag.islower():
            assume_unchanged.append(path)
        if tag in ("S", "s"):
            skip_present.append(path)
    for flag, paths in (
        ("--no-assume-unchanged", assume_unchanged),
        ("--no-skip-worktree", skip_present),
    ):
        if paths:
            data = b"".join(os.fsencode(p) + b"\0" for p in sorted(set(paths)))
            _git(top, env, "update-index", flag, "-z", "--stdin", input=data, prefix=prefix)

    untracked = _fsdecode_z(
        _git(top, env, "ls-files", "-o", "--exclude-standard", "-z", prefix=prefix).stdout
    )
    excludes: list[bytes] = []
    for path in untracked:
        if path.endswith("/"):
            # git lists a nested repository as one entry with a trailing slash.
            if not _has_commit(top / path, clean_git_env()):
                excludes.append(_literal_exclude(path.rstrip("/")))
            continue
        if size_cap:
            st = os.lstat(top / path)
            if stat.S_ISREG(st.st_mode) and st.st_size > size_cap:
                excludes.append(_literal_exclude(path))

    if excludes:
        spec = b"".join(item + b"\0" for item in [b".", *excludes])
        _git(
            top,
            env,
            "add",
            "-A",
            "--sparse",
            "--pathspec-from-file=-",
            "--pathspec-file-nul",
            input=spec,
            prefix=prefix,
        )
    else:
        _git(top, env, "add", "-A", "--sparse", prefix=prefix)
    return _git(top, env, "write-tree", prefix=prefix).stdout.decode().strip()


def _file_fingerprint(path: Path) -> tuple[bytes, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return path.read_bytes(), st.st_mtime_ns


def oracle_tree(
    worktree: str | Path,
    *,
    size_cap: int | None = None,
    fresh_index: bool = False,
    trust_stat: bool = False,
    config: Mapping[str, str] | None = None,
) -> str:
    """The tree id git gives for ``worktree`` under the contract's rules.

    Args:
      worktree: any folder; the git worktree containing it is used, or the
        folder itself when it is not inside a git worktree.
      size_cap: untracked regular files larger than this many bytes are left
        out (None or 0: no cap).
      fresh_index: ignore the user's index and start from an empty one (what
        the contract gives a folder with no index).
      trust_stat: let git trust the index's stat data as it does every day
        (the copy keeps the user's index mtime). By default the copy's mtime
        is set to 1970, older than every entry, so git treats every entry as
        racily clean and compares the content of each tracked file whose stat
        data match. The answer is the same except where git's stat check is
        fooled: a same-size rewrite with its mtime put back, in the same
        second as the ctime git recorded (this git compares mtime and ctime
        in whole seconds), which git alone reports as unchanged.
      config: settings given to every git command the oracle runs (as ``git
        -c``), over the repository's own.

    Returns:
      The tree id as hex (40 digits, or 64 in a SHA-256 repository).

    Raises:
      OracleError: a git command failed (for example, an unreadable file).
      AssertionError: the user's index changed, which must never happen.
    """
    folder = Path(worktree).absolute()
    given = dict(config or {})
    settings = {"GIT_CONFIG_COUNT": str(len(given))} if given else {}
    for number, (key, value) in enumerate(given.items()):
        settings.update({f"GIT_CONFIG_KEY_{number}": key, f"GIT_CONFIG_VALUE_{number}": value})
    base_env = clean_git_env(settings)
    top = _toplevel(folder, base_env)
    with tempfile.TemporaryDirectory(prefix="snapshotd-oracle-") as tmp:
        tmpdir = Path(tmp)
        temp_index = tmpdir / "index"
        if top is None:
            bare = tmpdir / "plain.git"
            _run(
                ["git", "init", "-q", "--bare", "--template=", str(bare)],
                cwd=tmpdir,
                env=base_env,
            )
            env = clean_git_env({**settings, "GIT_INDEX_FILE": str(temp_index)})
            prefix = [f"--git-dir={bare}", f"--work-tree={folder}"]
            return _add_and_write_tree(folder, env, size_cap, prefix=prefix)

        user_index = Path(
            os.fsdecode(
                _git(
                    top, base_env, "rev-parse", "--path-format=absolute", "--git-path", "index"
                ).stdout.rstrip(b"\n")
            )
        )
        before = _file_fingerprint(user_index)
        if before is not None and not fresh_index:
            shutil.copy2(user_index, temp_index)
            if not trust_stat:
                # Every entry written after this instant is "racily clean" to git.
                os.utime(temp_index, ns=(_RACY_EPOCH_NS, _RACY_EPOCH_NS))
        env = clean_git_env({**settings, "GIT_INDEX_FILE": str(temp_index)})
        tree = _add_and_write_tree(top, env, size_cap)
        after = _file_fingerprint(user_index)
        assert after == before, f"the oracle changed the user's index {user_index}"
        return tree
