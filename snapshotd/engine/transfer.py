"""``push`` and ``fetch``: a worktree's checkpoints to and from a remote, and reading what was fetched.

Which remote: the one named (a remote's name or a URL), else the setting
``snapshotd.remote``, else the upstream remote of the worktree's branch, else
``origin``, else the only remote there is. A plain folder's store is
snapshotd's own: the first remote named for it is kept as its ``snapshotd.remote``. A push sends each of the
worktree's session refs whose value differs from what this machine last
pushed there, leased on that value (:mod:`snapshotd.store.remotes`); with
``force``, leased on what the last fetch saw instead, to replace a ref
another machine moved once its checkpoints are kept here. Pushes and fetches
of one store run one at a time in this process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from snapshotd.contract.params import optional_bool, optional_str
from snapshotd.contract.refs import worktree_param
from snapshotd.engine.autopush import BackgroundPush, set_background
from snapshotd.engine.registry import Registry, WorktreeState, worktree_head
from snapshotd.engine.subscriptions import Subscriptions
from snapshotd.errors import NotFound, WorktreeMismatch
from snapshotd.git import transport
from snapshotd.git.process import GitTarget, run_git
from snapshotd.git.repository import repository
from snapshotd.store.checkpoints import Checkpoint, Store
from snapshotd.store.identity import WorktreeInfo
from snapshotd.store.refnames import REF_ROOT
from snapshotd.store.remotes import (
    fetch_refspec,
    load_pushed,
    remote_key,
    remote_of,
    remote_prefix,
    save_pushed,
)
from snapshotd.threads import thread_limiter

_SETTINGS = r"^(snapshotd\.remote|remote\..*\.url|branch\..*\.remote)$"
BACKGROUND_NICENESS = 10  # a background push yields the CPU to captures


@dataclass(frozen=True)
class Remote:
    """A remote as git is given it (a name or a URL) and the name its fetched refs go under."""

    argument: str
    key: str

    @classmethod
    def of(cls, argument: str) -> Remote:
        transport.check_remote_argument(argument)
        return cls(argument, remote_key(argument))


def git_target(info: WorktreeInfo) -> GitTarget:
    """Where push and fetch run: the worktree's own git dir (its configuration), or a plain folder's store."""
    return GitTarget(git_dir=info.git_dir or info.store_dir, work_tree=None)


def _looks_like_url(text: str) -> bool:
    return "/" in text or ":" in text


async def resolve_remote(info: WorktreeInfo, given: str | None, branch: str | None) -> Remote:
    """The remote a push or fetch of ``info`` talks to (see the module's docstring)."""
    settings = await transport.config_values(git_target(info), _SETTINGS)
    names = [name[len("remote.") : -len(".url")] for name, _ in settings if name.startswith("remote.")]
    configured = [value for name, value in settings if name == "snapshotd.remote"]
    if given is not None:
        if not (given in names or _looks_like_url(given)):
            raise NotFound(f"There is no remote named {given!r} for {info.path}; 'git remote -v' lists them, or give a URL.")
        remote = Remote.of(given)
        if info.kind == "plain" and not configured:  # a plain folder's store is snapshotd's: it keeps the URL
            await run_git(git_target(info), ["config", "snapshotd.remote", given])
        return remote
    upstream = [value for name, value in settings if branch is not None and name == f"branch.{branch}.remote"]
    choices = configured[-1:] + [u for u in upstream[-1:] if u != "."]
    if choices:
        return Remote.of(choices[0])
    if "origin" in names or len(set(names)) == 1:
        return Remote.of("origin" if "origin" in names else names[0])
    if info.kind == "plain":
        raise NotFound(f"The folder {info.path} has no remote yet: give REMOTE (a URL) once, and it is kept.")
    raise NotFound(
        f"The worktree at {info.path} has no remote to use: give REMOTE (a name or a URL), "
        "or set one with 'git config snapshotd.remote NAME'."
    )


@dataclass(frozen=True)
class PushPlan:
    """The refs a push sends (leased) and those already where this machine last pushed them."""

    updates: list[transport.RefUpdate]
    up_to_date: list[str]


def plan_push(info: WorktreeInfo, remote: Remote, force: bool) -> PushPlan:
    """Compare each session ref of the worktree with what this machine last pushed to ``remote``."""
    pushed = load_pushed(info.store_dir, remote.key)
    updates, same = [], []
    with repository(info.store_dir) as repo:
        store = Store(repo)
        for ref in store.session_refs(info.id):
            value = store.ref_target(ref)
            if value is None:
                continue
            expected = pushed.get(ref)
            if force:
                seen = store.ref_target(remote_prefix(remote.key) + ref[len(REF_ROOT) :])
                expected = None if seen is None else str(seen)
            if expected == str(value):
                same.append(ref)
            else:
                updates.append(transport.RefUpdate(ref, str(value), expected))
    return PushPlan(updates, same)


def fetched_values(info: WorktreeInfo, key: str) -> dict[str, str]:
    """The fetched refs of the remote ``key`` and their ids now."""
    with repository(info.store_dir) as repo:
        return {name: str(repo.resolve_ref(name)) for name in repo.ref_names(remote_prefix(key))}


class Transfers:
    """The engine's pushes and fetches (one at a time per store), and its background pushes."""

    def __init__(self, registry: Registry, subscriptions: Subscriptions, nursery: trio.Nursery | None) -> None:
        self.registry = registry
        self.locks: dict[str, trio.Lock] = {}
        self.background = BackgroundPush(self._push_in_background, nursery)
        subscriptions.on_recorded.append(self._recorded)

    def _recorded(self, worktree_id: str) -> None:
        state = self.registry.worktrees.get(worktree_id)
        if state is not None:
            self.background.checkpointed(state.info)

    async def _push_in_background(self, info: WorktreeInfo) -> None:
        _, branch = await trio.to_thread.run_sync(worktree_head, info, limiter=thread_limiter)
        await self._send(info, await resolve_remote(info, None, branch), force=False, nice=BACKGROUND_NICENESS)

    def lock(self, info: WorktreeInfo) -> trio.Lock:
        return self.locks.setdefault(info.store_dir, trio.Lock())

    async def _remote(self, params: Mapping[str, Any], *, fetch: bool = False) -> tuple[WorktreeInfo, Remote]:
        """The worktree the params name and the remote to use for it; a ``fetch`` may make a folder one."""
        state = await self.registry.resolve(worktree_param(params), first_sight=fetch)
        _, branch = await trio.to_thread.run_sync(worktree_head, state.info, limiter=thread_limiter)
        return state.info, await resolve_remote(state.info, optional_str(params, "remote"), branch)

    def owner(self, store: Store, checkpoint: Checkpoint) -> WorktreeState | None:
        """The worktree a checkpoint is of, when it is one here (a fetched one's is on another machine: None)."""
        if remote_of(store, checkpoint) is not None:
            return None
        return self.registry.by_id(checkpoint.worktree)

    async def push(self, params: Mapping[str, Any], _session: Any = None) -> dict[str, Any]:
        """Push the worktree's checkpoint refs; the result names the refs sent and those already there.

        ``background`` (a bool) turns the worktree's push after each checkpoint on or off first.
        """
        info, remote = await self._remote(params)
        background = None if params.get("background") is None else optional_bool(params, "background")
        if background is not None:
            await trio.to_thread.run_sync(set_background, info, background, limiter=thread_limiter)
            self.background.configured(info, background)
        result = await self._send(info, remote, optional_bool(params, "force"))
        return result if background is None else {**result, "background": background}

    async def _send(self, info: WorktreeInfo, remote: Remote, force: bool, nice: int = 0) -> dict[str, Any]:
        async with self.lock(info):
            plan = await trio.to_thread.run_sync(plan_push, info, remote, force, limiter=thread_limiter)
            report = await transport.push(git_target(info), remote.argument, plan.updates, nice)
            sent = {update.ref: update.new for update in plan.updates}
            await trio.to_thread.run_sync(save_pushed, info.store_dir, remote.key, sent, limiter=thread_limiter)
        return {"remote": remote.argument, "pushed": report.pushed, "up_to_date": sorted(plan.up_to_date + report.up_to_date)}

    async def fetch(self, params: Mapping[str, Any], _session: Any = None) -> dict[str, Any]:
        """Fetch the remote's checkpoint refs below ``refs/snapshotd-remote/<remote>/``; the refs that changed."""
        info, remote = await self._remote(params, fetch=True)
        async with self.lock(info):
            before = await trio.to_thread.run_sync(fetched_values, info, remote.key, limiter=thread_limiter)
            await transport.fetch(git_target(info), remote.argument, fetch_refspec(remote.key))
            after = await trio.to_thread.run_sync(fetched_values, info, remote.key, limiter=thread_limiter)
        fetched = sorted(name for name, value in after.items() if before.get(name) != value)
        return {"remote": remote.argument, "fetched": fetched, "gone": sorted(set(before) - set(after))}


def remote_wire(store: Store, checkpoint: Checkpoint) -> dict[str, Any]:
    """The checkpoint on the wire, with ``remote`` set when only a fetched ref pins it."""
    remote = remote_of(store, checkpoint)
    return checkpoint.to_wire() | ({"remote": remote} if remote is not None else {})


def refuse_remote_restore(store: Store, checkpoint: Checkpoint, target_id: str | None, allow_other: bool) -> None:
    """A fetched checkpoint is another worktree's: restored only into a worktree named, with ``allow_other_worktree``."""
    if allow_other and target_id is not None:
        return
    remote = remote_of(store, checkpoint)
    if remote is None or target_id == checkpoint.worktree:
        return
    raise WorktreeMismatch(
        f"Checkpoint {checkpoint.id[:12]} was fetched from the remote {remote} and belongs to its worktree "
        f"{checkpoint.worktree}, not to one here; pass allow_other_worktree with the target worktree's path "
        "(on the command line: restore --into PATH) to restore it there.",
        remote=remote,
    )
