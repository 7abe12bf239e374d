"""The daemon's ``hook`` method: one agent hook run for the native hook entry, by the Python hook's own rules.

The native entry (``native/hook.c``, installed as :data:`NATIVE_PROGRAM`)
starts in a millisecond where an interpreter takes 10 to 30; it reads the
payload, sends it here with the hook's folder, process, parent and
environment (:data:`~snapshotd.settings.HOOK_ENVIRONMENT`), writes the
answer's ``stdout`` and ``stderr`` and exits. Here
:func:`~snapshotd.agents.hooks.run_hook` runs as in the hook's own process,
with the hook's :class:`~snapshotd.agents.hooks.Origin` and environment
(:data:`~snapshotd.settings.HOOK_ENVIRONMENT` read through
:func:`~snapshotd.settings.getenv`): the same description of the payload,
the same place in the session's order (taken from /proc for the hook's
process, the daemon being the same user), the same wait for the session's
earlier checkpoints, the same records. Only where the checkpoint runs
differs: a thread of the daemon (:func:`in_thread`) instead of a child
process, calling the engine directly. An answer ``fallback`` (too many hooks
at once, a request of another version) tells the entry to run the Python
entry instead, which nothing of this has touched.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import io
import os
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from snapshotd.agents.hooks import (
    BEFORE_EVENTS,
    Origin,
    Outcome,
    in_order,
    report,
    report_note,
    run_hook,
    still_running,
)
from snapshotd.errors import InvalidParams
from snapshotd.settings import HOOK_ENVIRON, HOOK_ENVIRONMENT, hook_budget

if TYPE_CHECKING:
    from snapshotd.agents.hooks import Work
    from snapshotd.agents.hookstate import Turn

VERSION = 1
"""The version of the request the native entry sends; another one is answered ``fallback``."""

NATIVE_PROGRAM = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "snapshotd-hook"
)
"""The native hook entry, built from ``native/hook.c`` beside the package by ``setup.py`` (absent without a C compiler)."""

NATIVE_EVENTS = BEFORE_EVENTS
"""The events whose hook ``integrate`` writes as the native entry (when it was built): the agent waits for
their checkpoint, and the entry saves it an interpreter's start; the others keep the Python entry (after a
tool it runs in the background: the agent waits for none of it)."""


def native_entry() -> str | None:
    """:data:`NATIVE_PROGRAM` when it was built, else None."""
    return NATIVE_PROGRAM if os.access(NATIVE_PROGRAM, os.X_OK) else None


HOOKS_AT_ONCE = 64
"""Hook runs the daemon waits on at once; past it the entry runs the Python hook (a process of its own)."""

CHECKPOINTS_AT_ONCE = 256
"""Checkpoints of hooks in the daemon's threads at once (waiting for their turn, most of them); past it, the same."""

_waiting = trio.CapacityLimiter(HOOKS_AT_ONCE)
_running = threading.BoundedSemaphore(CHECKPOINTS_AT_ONCE)


def in_thread(
    work: Work,
    budget_s: float,
    turn: Turn | None,
    done: Callable[[str | None], None],
    hand_off: Callable[[], None] | None = None,
) -> str | None:
    """:func:`~snapshotd.agents.hooks.within_budget` in a thread of the daemon: the checkpoint runs after the
    session's earlier ones (:func:`~snapshotd.agents.hooks.in_order`), this waits at most ``budget_s`` for it."""
    if budget_s <= 0 and hand_off is not None:
        hand_off()
    reported: list[str] = []
    ready = threading.Event()

    def tell(text: str) -> None:
        reported.append(text)
        ready.set()

    def run() -> None:
        try:
            in_order(work, turn, done, tell)
        finally:
            _running.release()

    context = contextvars.copy_context()  # the hook's environment goes with its checkpoint
    threading.Thread(target=context.run, args=(run,), name="snapshotd-hook", daemon=True).start()
    if budget_s <= 0:
        return None
    if not ready.wait(budget_s):
        return still_running(budget_s)
    return report_note(reported[0])


def _text(params: dict[str, Any], name: str) -> bytes | None:
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidParams(f"'{name}' must be a base64 string.")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise InvalidParams(f"'{name}' is not base64 ({exc}).") from None


def _number(params: dict[str, Any], name: str) -> int:
    value = params.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidParams(f"'{name}' must be a process id.")
    return value


def _origin(params: dict[str, Any]) -> Origin:
    """The hook's :class:`~snapshotd.agents.hooks.Origin` from the request."""
    payload = _text(params, "payload")
    cwd = _text(params, "cwd")

    def read() -> bytes:
        if payload is None:  # the entry waited as long as the Python entry does
            from snapshotd.agents.payload import LATE

            raise InvalidParams(LATE)
        return payload

    def getcwd() -> str:
        if cwd is None:  # the entry's getcwd failed: its folder is gone
            raise FileNotFoundError("the hook's current folder is gone")
        return os.fsdecode(cwd)

    return Origin(read, getcwd, _number(params, "pid"), _number(params, "ppid"))


def _environ(params: dict[str, Any]) -> dict[str, str]:
    given = params.get("environ")
    if not isinstance(given, dict):
        raise InvalidParams("'environ' must be an object of base64 strings.")
    environ = {}
    for name in HOOK_ENVIRONMENT:
        value = _text(given, name)
        if value is not None:
            environ[name] = os.fsdecode(value)
    return environ


async def serve_hook(
    call: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]], params: dict[str, Any]
) -> dict[str, Any]:
    """The ``hook`` method: ``stdout`` and ``stderr`` (base64) of the hook run the request describes, or
    ``fallback`` (a reason) when the entry is to run the Python entry; ``call`` runs the engine's methods."""
    if params.get("version") != VERSION:
        return {"fallback": f"the daemon answers version {VERSION} of 'hook'"}
    tool_bytes = _text(params, "tool")
    tool = os.fsdecode(tool_bytes or b"")
    origin, environ = _origin(params), _environ(params)
    if _waiting.available_tokens < 1 or not _running.acquire(blocking=False):
        return {"fallback": "the daemon runs as many hooks as it takes at once"}
    token = trio.lowlevel.current_trio_token()
    stdout, stderr = io.StringIO(), io.StringIO()
    started = False

    def engine(method: str, method_params: dict[str, Any]) -> dict[str, Any]:
        return trio.from_thread.run(call, method, method_params, trio_token=token)

    def background(
        work: Work,
        budget_s: float,
        turn: Turn | None,
        done: Callable[[str | None], None],
        hand_off: Callable[[], None] | None,
    ) -> str | None:
        nonlocal started
        started = True  # the thread releases the checkpoints' count
        return in_thread(work, budget_s, turn, done, hand_off)

    def say(outcome: Outcome) -> None:
        report(tool, outcome, stdout, stderr)

    def run() -> None:
        HOOK_ENVIRON.set(environ)  # this thread's context only (trio copies one for each)
        try:
            run_hook(
                tool, engine, lambda before: hook_budget(before=before), say, origin, background
            )
        finally:
            if not started:
                _running.release()

    await trio.to_thread.run_sync(run, limiter=_waiting)
    return {
        "stdout": base64.b64encode(stdout.getvalue().encode("utf-8", "surrogateescape")).decode(
            "ascii"
        ),
        "stderr": base64.b64encode(stderr.getvalue().encode("utf-8", "backslashreplace")).decode(
            "ascii"
        ),
    }
