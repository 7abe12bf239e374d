"""Background push: after a checkpoint, a worktree whose setting asks for it is pushed, batched.

The setting is per worktree, in its state folder (``push.json``, 0600), set by
``push`` with ``background``, and read once per worktree (then kept as ``push``
sets it): a checkpoint of a worktree without it starts nothing. At most one
push per worktree is in flight: a checkpoint recorded meanwhile only marks the worktree pending, and the next
push carries everything since, so the backlog is one flag, never copies; a
push starts a second after the checkpoint that asked for it, so a burst of
checkpoints is one push; one background push runs at a time in the
daemon, at niceness 10, and the next starts only after a rest three times
as long as it took, so pushing takes at most a quarter of one core's worth
of time from the captures, however many worktrees wait. A capture never waits for it: the pusher is its own task and
takes no worktree lock. A failure is kept for ``status`` and retried with the next
checkpoint, no sooner than a back-off (2 s, doubling up to 5 minutes), so a
remote that is down costs one failed push per back-off, not one per capture,
and one that hangs is given up after 2 minutes (git's process group killed),
so it never holds the other worktrees' pushes for longer.
Only a daemon (an engine with a nursery) pushes in the background.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from snapshotd.errors import SnapshotdError, Untrusted
from snapshotd.fsutil import (
    atomic_write,
    checked_private_folder,
    open_private_folder,
    read_private_file,
)
from snapshotd.store.identity import WorktreeInfo
from snapshotd.store.pins import now_iso
from snapshotd.threads import thread_limiter

log = logging.getLogger(__name__)

SETTING = "push.json"
MAX_SETTING_BYTES = 4096
BACKOFF_S = (2.0, 300.0)
GATHER_S = 1.0  # after a checkpoint, how long the pusher waits for more to go in the same push
AT_ONCE = 1  # background pushes in flight across all worktrees: the captures keep the rest of the machine
REST_RATIO = 3.0  # after each background push, the next waits this many times as long as it took
TIMEOUT_S = 120.0  # a background push still running then is stopped: a hung remote never holds the others up


def background_setting(info: WorktreeInfo) -> bool | None:
    """The worktree's setting: True or False as set (False when there is none), None when it could not be read."""
    try:
        fd = open_private_folder(info.state_dir, 1, create=False)
    except FileNotFoundError:
        return False
    except (OSError, Untrusted):
        return None
    try:
        setting = json.loads(read_private_file(fd, SETTING, MAX_SETTING_BYTES))
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return isinstance(setting, dict) and setting.get("background") is True


def set_background(info: WorktreeInfo, on: bool) -> None:
    """Turn the worktree's background push on or off."""
    folder = checked_private_folder(info.state_dir, 1)
    atomic_write(os.path.join(folder, SETTING), json.dumps({"background": on}).encode(), 0o600)


@dataclass
class PushState:
    """One worktree's background push, as ``status`` shows it."""

    pending: bool = False
    running: bool = False  # a task serves the worktree now
    in_flight: bool = False
    enabled: bool = False
    known: bool = False  # ``enabled`` was read from the setting (or just set): off, a checkpoint starts no pusher
    pushes: int = 0
    failures: int = 0  # in a row
    last_push_at: str | None = None
    last_error: str | None = None
    retry_at: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "in_flight": self.in_flight,
            "pushes": self.pushes,
            "last_push_at": self.last_push_at,
            "last_error": self.last_error,
        }


class BackgroundPush:
    """The pushers of the worktrees whose setting asks for one; ``push`` sends one worktree's checkpoints."""

    def __init__(self, push: Callable[[WorktreeInfo], Awaitable[Any]], nursery: trio.Nursery | None) -> None:
        self.push = push
        self.nursery = nursery
        self.states: dict[str, PushState] = {}
        self.limiter = trio.CapacityLimiter(AT_ONCE)

    def checkpointed(self, info: WorktreeInfo) -> None:
        """A checkpoint of ``info`` was recorded: mark it pending, and start its pusher if none runs."""
        if self.nursery is None:
            return
        state = self.states.setdefault(info.id, PushState())
        if state.known and not state.enabled:
            return
        state.pending = True
        if not state.running:
            state.running = True
            self.nursery.start_soon(self._serve, info, state)

    def configured(self, info: WorktreeInfo, on: bool) -> None:
        """The worktree's setting was just written: ``status`` shows it (or no longer) from now on."""
        state = self.states.setdefault(info.id, PushState())
        state.enabled, state.known = on, True

    def status(self) -> dict[str, Any]:
        """Per worktree id with background push on: pending, in flight, pushes, the last push and error."""
        return {worktree: state.to_wire() for worktree, state in self.states.items() if state.enabled}

    async def _serve(self, info: WorktreeInfo, state: PushState) -> None:
        try:
            while state.pending:
                setting = await trio.to_thread.run_sync(background_setting, info, limiter=thread_limiter)
                state.enabled, state.known = setting is True, setting is not None
                if not state.enabled:
                    state.pending = False
                    break
                await trio.sleep(max(GATHER_S, state.retry_at - time.monotonic()))
                state.pending = False  # what is recorded from here on waits for the next push
                async with self.limiter:
                    started = time.monotonic()
                    await self._push_once(info, state)
                    await trio.sleep(REST_RATIO * (time.monotonic() - started))
        finally:
            state.running = False

    async def _push_once(self, info: WorktreeInfo, state: PushState) -> None:
        state.in_flight = True
        try:
            with trio.fail_after(TIMEOUT_S):
                await self.push(info)
        except trio.TooSlowError:
            self._failed(state, f"The push did not finish within {TIMEOUT_S:.0f} s and was stopped (the remote is slow or hangs); it is tried again after the next checkpoint.")
        except SnapshotdError as exc:
            self._failed(state, exc.message)
        except Exception as exc:
            log.exception("the background push of %s failed", info.path)
            self._failed(state, f"{type(exc).__name__}: {exc}")
        else:
            state.pushes += 1
            state.failures = 0
            state.last_push_at, state.last_error, state.retry_at = now_iso(), None, 0.0
        finally:
            state.in_flight = False

    @staticmethod
    def _failed(state: PushState, message: str) -> None:
        state.failures += 1
        state.last_error = message
        state.retry_at = time.monotonic() + min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** (state.failures - 1))
