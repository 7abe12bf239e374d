"""Running git: one argv and environment policy for every git process.

Every git the daemon starts goes through :func:`run_git` (or its blocking twin
:func:`run_git_sync`, or :func:`start_git_session` for a long-lived one): a
clean environment (no inherited ``GIT_DIR``, ``GIT_WORK_TREE`` or
``GIT_INDEX_FILE``), a C locale, ``GIT_OPTIONAL_LOCKS=0`` so it never takes the
user's index lock to refresh, ``gc.auto=0`` so writing objects never starts a
collection, and a bounded pool so a burst of captures cannot fork-bomb the
machine. Nothing a repository's configuration names is ever run: no hooks, no
``core.fsmonitor`` program, and no fetch of any kind (a partial clone's lazy
fetch would run ``core.sshCommand`` or ``remote.*.uploadpack``): git older
than 2.45 ignores ``GIT_NO_LAZY_FETCH``, so ``GIT_ALLOW_PROTOCOL`` names no
protocol at all, which stops every transport before it starts a program.
The one exception is ``push`` and ``fetch`` of checkpoints, asked for by the
user: :func:`transport_env` lets git reach the remote with the user's own
authentication (credential helpers, the ssh agent), never a terminal prompt.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypedDict, Unpack

import trio

from snapshotd.errors import GitError, NotFound, SpawnTimeout
from snapshotd.git import spawn

# Variables a user may set that decide which configuration git reads; every
# other GIT_* variable of the caller is dropped.
_KEPT_VARIABLES = (
    "PATH",
    "HOME",
    "XDG_CONFIG_HOME",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_EXEC_PATH",
    "TMPDIR",
)

# What a push or fetch of checkpoints may use to reach a remote and authenticate, besides the above.
TRANSPORT_PROTOCOLS = "file:git:ssh:http:https"
_AUTH_VARIABLES = (
    "SSH_AUTH_SOCK",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "http_proxy",
    "https_proxy",
    "HTTPS_PROXY",
    "no_proxy",
    "NO_PROXY",
    "all_proxy",
    "ALL_PROXY",
)

GIT_TIMEOUT_S = 600.0

_pool = trio.CapacityLimiter(max(2, 2 * (len(os.sched_getaffinity(0)) or 1)))


@dataclass(frozen=True)
class GitTarget:
    """Where a git command runs: the repository and its work tree."""

    git_dir: str
    work_tree: str | None


def git_env(target: GitTarget, index_file: str | None = None) -> dict[str, str]:
    """The complete environment of a git process for ``target``."""
    env = {name: os.environ[name] for name in _KEPT_VARIABLES if name in os.environ}
    env.setdefault("PATH", os.defpath)
    env.update(
        LC_ALL="C",
        LANG="C",
        GIT_OPTIONAL_LOCKS="0",
        GIT_TERMINAL_PROMPT="0",
        GIT_NO_LAZY_FETCH="1",
        GIT_ALLOW_PROTOCOL="",
        GIT_PROTOCOL_FROM_USER="0",
        GIT_DIR=target.git_dir,
    )
    if target.work_tree is not None:
        env["GIT_WORK_TREE"] = target.work_tree
    if index_file is not None:
        env["GIT_INDEX_FILE"] = index_file
    return env


def transport_env() -> dict[str, str]:
    """What a push or fetch adds to :func:`git_env`: the transports, and the user's means of authentication.

    Prompts stay off (``GIT_TERMINAL_PROMPT=0``): the daemon has no terminal,
    so a missing credential fails at once with git's own message.
    """
    env = {name: os.environ[name] for name in _AUTH_VARIABLES if name in os.environ}
    env["GIT_ALLOW_PROTOCOL"] = TRANSPORT_PROTOCOLS
    return env


def git_argv(args: Sequence[str]) -> list[str]:
    # No program a repository names ever runs: no hook (update-index and update-ref
    # would start post-index-change and reference-transaction), no fsmonitor. A
    # private index is written whole: split, it would leave a sharedindex file in the
    # user's git dir, and libgit2 cannot read it.
    return [
        "git",
        "-c", "gc.auto=0",
        "-c", "maintenance.auto=false",
        "-c", "core.quotePath=false",
        "-c", "core.hooksPath=/dev/null",
        "-c", "core.fsmonitor=",
        "-c", "core.splitIndex=false",
        *args,
    ]


class GitOptions(TypedDict, total=False):
    """The options of one git command, the same for both faces (:func:`run_git`, :func:`run_git_sync`)."""

    index_file: str | None  # GIT_INDEX_FILE
    input: bytes | None  # written to its stdin (None: /dev/null)
    ok_codes: Sequence[int]  # exit statuses that are not a failure (default: only 0)
    env_extra: Mapping[str, str] | None  # added to the environment
    nice: int  # run under nice(1) at this niceness (work that must yield the machine: background pushes)


@dataclass(frozen=True)
class _Call:
    """One git command, ready for either face of the spawn helper."""

    args: Sequence[str]
    argv: list[str]
    cwd: str
    env: dict[str, str]
    input: bytes | None = None
    ok_codes: Sequence[int] = (0,)

    @classmethod
    def make(cls, target: GitTarget, args: Sequence[str], options: GitOptions) -> _Call:
        env = git_env(target, options.get("index_file"))
        env.update(options.get("env_extra") or {})
        cwd = target.work_tree or target.git_dir
        argv = git_argv(args)
        if options.get("nice"):
            argv = ["nice", "-n", str(options["nice"]), *argv]
        return cls(args, argv, cwd, env, options.get("input"), options.get("ok_codes", (0,)))

    def output(self, result: spawn.Completed) -> bytes:
        """The command's standard output, or GitError when its exit status is not one of ``ok_codes``."""
        if result.returncode not in self.ok_codes:
            detail = result.stderr.decode("utf-8", "replace").strip().splitlines()
            reason = detail[-1] if detail else f"exit status {result.returncode}"
            raise GitError(f"git {self.args[0]} failed: {reason}", argv=list(self.args), status=result.returncode)
        return result.stdout

    async def run(self) -> bytes:
        """Run it on the trio loop, at most as many at once as the pool allows; its standard output."""
        return self.output(await self.completed())

    async def completed(self) -> spawn.Completed:
        """Run it on the trio loop under the pool; its exit status and both outputs, whatever the status."""
        async with _pool:
            with self.errors():
                return await spawn.run(self.argv, cwd=self.cwd, env=self.env, input=self.input, timeout=GIT_TIMEOUT_S)

    def run_sync(self) -> bytes:
        """Run it in the calling thread (the blocking face); its standard output."""
        with self.errors():
            result = spawn.run_sync(self.argv, cwd=self.cwd, env=self.env, input=self.input, timeout=GIT_TIMEOUT_S)
        return self.output(result)

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Spawn failures and timeouts become GitError."""
        try:
            yield
        except SpawnTimeout as exc:
            raise GitError(
                f"git {self.args[0]} did not finish within {GIT_TIMEOUT_S:.0f} s and was stopped"
            ) from exc
        except OSError as exc:
            if not os.path.isdir(self.cwd):  # the folder it runs in went away: the worktree's doing, say so
                raise NotFound(
                    f"git could not start in {self.cwd}: that folder is gone (deleted or moved meanwhile); "
                    "check the path, or run 'snapshotd repair NEW_PATH' if the worktree moved."
                ) from exc
            raise GitError(f"could not start git: {exc.strerror or exc}") from exc


async def run_git(target: GitTarget, args: Sequence[str], **options: Unpack[GitOptions]) -> bytes:
    """Run one git command and return its standard output, or raise GitError."""
    return await _Call.make(target, args, options).run()


async def run_git_completed(target: GitTarget, args: Sequence[str], **options: Unpack[GitOptions]) -> spawn.Completed:
    """:func:`run_git` for a caller that reads git's standard error itself (push and fetch): never raises on a status."""
    return await _Call.make(target, args, options).completed()


def run_git_sync(target: GitTarget, args: Sequence[str], **options: Unpack[GitOptions]) -> bytes:
    """The blocking twin of :func:`run_git`, for code already on a worker thread."""
    return _Call.make(target, args, options).run_sync()


def start_git_session(
    target: GitTarget, args: Sequence[str], *, timeout: float = GIT_TIMEOUT_S, index_file: str | None = None
) -> spawn.Session:
    """Start one long-lived git (``cat-file --batch-command``) under the same policy as :func:`run_git_sync`.

    The caller talks to it through the returned session and must close it.
    """
    call = _Call.make(target, args, {"index_file": index_file})
    with call.errors():
        return spawn.Session(call.argv, cwd=call.cwd, env=call.env, timeout=timeout)


def run_git_without_repository(args: Sequence[str], *, ok_codes: Sequence[int] = (0,)) -> bytes:
    """Run git from ``/`` with no repository (``GIT_DIR`` is /dev/null): it reads only the user's configuration."""
    env = git_env(GitTarget(git_dir=os.devnull, work_tree=None))
    return _Call(args, git_argv(args), "/", env, ok_codes=ok_codes).run_sync()
