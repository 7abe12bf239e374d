"""Push and fetch of checkpoint refs over git's own transport, and nothing else of the repository.

Both name their refspecs explicitly, so no configured refspec, branch, tag or
note of the user's ever moves: a push sends exactly the ids it is given, each
under ``--force-with-lease=<ref>:<expected>`` and all of them ``--atomic``
(the remote's receive-pack checks each old value under its ref lock: a
compare-and-swap), and a fetch writes only below its destination folder
(``--refmap=`` turns off git's opportunistic update of configured
remote-tracking refs). Hooks, tags, submodules, signing and automatic gc are
off. git runs through :mod:`snapshotd.git.process` with
:func:`~snapshotd.git.process.transport_env`, so authentication is git's own;
its failures become one sentence in :func:`snapshotd.errors.transfer_error`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from snapshotd.errors import InvalidParams, transfer_error
from snapshotd.git.child import Completed
from snapshotd.git.process import GitTarget, run_git_completed, transport_env

PUSH_OPTIONS = (
    "--porcelain",
    "--atomic",
    "--no-verify",
    "--no-follow-tags",
    "--no-signed",
    "--recurse-submodules=no",
)
FETCH_OPTIONS = ("--no-tags", "--no-write-fetch-head", "--prune", "--refmap=", "--no-recurse-submodules", "--no-auto-gc")


@dataclass(frozen=True)
class RefUpdate:
    """One ref to push: the id it gets, and the id the remote must hold now (None: it must not exist)."""

    ref: str
    new: str
    expected: str | None


@dataclass(frozen=True)
class PushReport:
    """What the remote did with each ref: updated, or already at that id."""

    pushed: list[str]
    up_to_date: list[str]


def check_remote_argument(remote: str) -> None:
    """A remote is a name or a URL, never something git would read as an option."""
    if not remote or remote.startswith("-") or any(ch in remote for ch in "\0\n"):
        raise InvalidParams(f"{remote!r} is not a remote: give a remote's name ('git remote' lists them) or a URL.")


def push_args(remote: str, updates: Sequence[RefUpdate]) -> list[str]:
    """``git push`` of exactly ``updates`` to ``remote``, each one leased."""
    leases = [f"--force-with-lease={u.ref}:{u.expected or ''}" for u in updates]
    return ["push", *PUSH_OPTIONS, *leases, "--", remote, *(f"{u.new}:{u.ref}" for u in updates)]


def parse_porcelain(out: str) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """(updated, up to date, rejected (ref, reason)) from ``git push --porcelain``'s lines."""
    pushed: list[str] = []
    same: list[str] = []
    rejected: list[tuple[str, str]] = []
    for line in out.splitlines():
        fields = line.split("\t")
        if len(fields) < 3 or len(fields[0]) != 1:
            continue
        flag, ref, summary = fields[0], fields[1].rpartition(":")[2], fields[2]
        if flag == "=":
            same.append(ref)
        elif flag == "!":
            reason = summary.partition("(")[2].rstrip(")") or summary.strip("[] ")
            rejected.append((ref, reason))
        else:
            pushed.append(ref)
    return pushed, same, rejected


def _said(result: Completed) -> str:
    """git's standard error, or how it ended when it wrote none (a signal: SIGPIPE when the remote hung up)."""
    text = os.fsdecode(result.stderr).strip()
    if text or result.returncode >= 0:
        return text or f"git ended with exit status {result.returncode}"
    number = -result.returncode
    name = signal.Signals(number).name if number in signal.valid_signals() else str(number)
    return f"git was ended by {name}" + (" (the connection closed under it)" if number == signal.SIGPIPE else "")


async def push(target: GitTarget, remote: str, updates: Sequence[RefUpdate], nice: int = 0) -> PushReport:
    """Push ``updates`` to ``remote`` all or none; GitError (one sentence, ``data.reason``) when it fails.

    git that ends without its report (a signal, a connection reset: send-pack
    dies of SIGPIPE when receive-pack hangs up first, which it does when no
    ref needs sending) leaves the remote as the judge: what it holds now says
    whether the push took, or was refused. ``nice`` runs it (and what it
    starts) at that niceness.
    """
    check_remote_argument(remote)
    if not updates:
        return PushReport([], [])
    result = await run_git_completed(target, push_args(remote, updates), env_extra=transport_env(), nice=nice)
    pushed, same, rejected = parse_porcelain(os.fsdecode(result.stdout))
    if result.returncode != 0 and not rejected and not pushed and not same:
        held = await _remote_values(target, remote, updates)
        if held is not None:
            if all(held.get(u.ref) == u.new for u in updates):
                return PushReport([u.ref for u in updates], [])
            rejected = [(u.ref, "stale info") for u in updates if held.get(u.ref) not in (u.new, u.expected)]
    if result.returncode != 0 or rejected:
        raise transfer_error("pushed", remote, _said(result), rejected)
    return PushReport(pushed, same)


async def _remote_values(target: GitTarget, remote: str, updates: Sequence[RefUpdate]) -> dict[str, str] | None:
    """ref -> id on the remote for the refs of ``updates`` (absent ones left out); None when it cannot be asked."""
    args = ["ls-remote", "--refs", "--", remote, *(u.ref for u in updates)]
    result = await run_git_completed(target, args, env_extra=transport_env())
    if result.returncode != 0:
        return None
    held = {}
    for line in os.fsdecode(result.stdout).splitlines():
        oid, _, name = line.partition("\t")
        held[name] = oid
    return held


async def fetch(target: GitTarget, remote: str, refspec: str) -> None:
    """Fetch ``refspec`` from ``remote`` (its destination pruned); GitError (one sentence) when it fails."""
    check_remote_argument(remote)
    result = await run_git_completed(target, ["fetch", *FETCH_OPTIONS, "--", remote, refspec], env_extra=transport_env())
    if result.returncode != 0:
        raise transfer_error("fetched", remote, _said(result))


async def config_values(target: GitTarget, pattern: str) -> list[tuple[str, str]]:
    """(name, value) of every setting whose name matches ``pattern`` (git's ``--get-regexp``), in git's order."""
    result = await run_git_completed(target, ["config", "-z", "--get-regexp", pattern])
    pairs = []
    for item in os.fsdecode(result.stdout).split("\0"):
        if item:
            name, _, value = item.partition("\n")
            pairs.append((name, value))
    return pairs
