"""Agent hooks: turn one Claude Code or Codex hook payload into a checkpoint.

:func:`~snapshotd.agents.payload.describe` reads what happened into a
:class:`~snapshotd.agents.payload.HookEvent` (the worktree, the agent's
session, a label), and :func:`run_hook` checkpoints it within a time budget.

A hook must never break the agent, so :func:`run_hook` never raises: it
returns an :class:`Outcome`, a one-line note for stderr and, when something
failed, one line for the user (the agent shows a hook's ``systemMessage`` to
the user, never to the model). The checkpoint runs in a child process. A hook
before the agent acts (:data:`BEFORE_EVENTS`) waits for it, so that "before"
holds nothing of what the agent then does; any other hook returns after a
short budget and the child, detached from the agent's pipes, lets the daemon
finish. Either way the child first waits for the session's earlier
checkpoints (:class:`~snapshotd.agents.hookstate.Turn`): a session's
checkpoints are recorded in the order of its events.
"""

from __future__ import annotations

import os
import select
import sys
import time

from snapshotd.agents.hookorder import Spawn
from snapshotd.agents.hookstate import (
    Turn,
    agent_key,
    last_result,
    may_tell,
    note_agent_session,
    record_result,
)
from snapshotd.agents.payload import (  # re-exported: the rest of the package reads them here
    AFTER_TURN as AFTER_TURN,
    BEFORE_EVENTS as BEFORE_EVENTS,
    BEFORE_PROMPT as BEFORE_PROMPT,
    EVENT_SETS as EVENT_SETS,
    INTERRUPTED,
    LABEL_DETAIL_CHARS as LABEL_DETAIL_CHARS,
    OPENS_TURN,
    STDIN_WAIT_S,
    TOOLS as TOOLS,
    HookEvent as HookEvent,
    describe,
    ends_turn as ends_turn,
    read_stdin,
    turn_open,
)
from snapshotd.errors import NotFound, SnapshotdError

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TextIO

CHILD_LIMIT_S = 600
"""A checkpoint left to finish in the background gives up after this long."""

WORK_S = 60
"""Of :data:`CHILD_LIMIT_S`, what is kept for the checkpoint itself after the wait for the session's earlier ones."""

EARLIER_WAIT_S = 10
"""A turn's last hook waits at most this long for the agent's earlier hooks to hand theirs off (their
start-up); its checkpoint then still waits for theirs (:mod:`.hookorder`)."""

STILL_RUNNING = "the checkpoint is still running after"

def _to_devnull() -> None:
    """Put this process's stdin, stdout and stderr on /dev/null (what was written is flushed first)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _detach() -> None:
    """In the child: leave the agent's process group and pipes, so the agent waits for nothing."""
    os.setsid()
    _to_devnull()


def _note_for(exc: BaseException) -> str:
    if isinstance(exc, SnapshotdError):
        return " ".join(exc.message.split())
    return f"{type(exc).__name__}: {exc}"


class Outcome:
    """How one hook run ended: a note for stderr (None: recorded in time), whether that is a failure,
    and the note of the previous run's failure, if it failed (perhaps in the background)."""

    __slots__ = ("failed", "label", "note", "previous")

    def __init__(self, note: str | None = None, failed: bool = False, label: str = "", previous: str | None = None) -> None:
        self.note, self.failed, self.label, self.previous = note, failed, label, previous

    def user_line(self) -> str | None:
        """The one line to show the user through the agent's own channel, if anything failed."""
        if self.failed and self.note:
            what = f"the checkpoint {self.label!r}" if self.label else "a checkpoint"
            return f"snapshotd: {what} was not recorded: {self.note} (run `snapshotd doctor`)"
        if self.previous:
            return f"snapshotd: an earlier checkpoint was not recorded: {self.previous} (run `snapshotd doctor`)"
        return None


_DETACHED = b"+"
"""The child's first byte on the pipe: it has left the agent's pipes and process group."""

DETACH_WAIT_S = 5
"""The child must have detached within this long (it does so first: a few milliseconds)."""


if TYPE_CHECKING:
    Work = Callable[[], Callable[[], None] | None]
    """A hook's checkpoint: it returns what is left to keep once it is recorded, if anything (no hook waits for that)."""


def in_order(work: Work, turn: Turn | None, done: Callable[[str | None], None], report: Callable[[str], None]) -> None:
    """Wait for the session's earlier checkpoints, do the work, ``report`` how it went (``ok`` or ``error
    NOTE``), then keep what the work left to keep (before the session's next checkpoint may start)."""
    note, keep = "", None
    try:
        if turn is not None and not turn.wait(time.monotonic() + CHILD_LIMIT_S - WORK_S):
            raise TimeoutError("an earlier checkpoint of this session never finished")
        keep = work()
    except BaseException as exc:
        note = _note_for(exc) or type(exc).__name__
    report("error " + note if note else "ok")
    for then in (lambda: done(note or None), keep):
        try:
            if then is not None:
                then()
        except BaseException:
            pass
    if turn is not None:
        turn.release()


def report_note(text: str) -> str | None:
    """The note of a report of :func:`in_order` (None: recorded)."""
    if text == "ok":
        return None
    return text.removeprefix("error ") or "the checkpoint process ended without a report."


def still_running(budget_s: float) -> str:
    """The note of a checkpoint not recorded within the hook's budget."""
    return f"{STILL_RUNNING} {round(budget_s, 1):g} s; it finishes in the background."


def _child(work: Work, turn: Turn | None, done: Callable[[str | None], None], write_fd: int) -> None:
    """In the child: :func:`in_order`, its report on the pipe (closed at once: a waiting hook returns then); never return."""
    status = 0
    try:
        _detach()
        try:  # a hook that handed the work off has not waited
            os.write(write_fd, _DETACHED)
        except OSError:
            pass
        import _signal  # type: ignore[import-not-found]  # signal's C module: signal imports enum, in every hook's child

        def give_up(signum: int, frame: object) -> None:
            raise TimeoutError(f"the checkpoint did not finish within {CHILD_LIMIT_S} s")

        _signal.signal(_signal.SIGALRM, give_up)  # a note and the session's record, not a silent end
        _signal.alarm(CHILD_LIMIT_S)

        def report(text: str) -> None:
            try:  # the hook may have left already
                os.write(write_fd, text.encode("utf-8", "replace"))
            except OSError:
                pass
            os.close(write_fd)  # the end of the report: a waiting hook returns now, not after what follows

        in_order(work, turn, done, report)
    except BaseException:
        status = 1
    finally:
        os._exit(status)


def within_budget(
    work: Work,
    budget_s: float,
    turn: Turn | None = None,
    done: Callable[[str | None], None] = lambda note: None,
    hand_off: Callable[[], None] | None = None,
) -> str | None:
    """Run ``work`` in a child process, after ``turn``'s earlier checkpoints, and wait at most ``budget_s`` for it.

    Returns None when it succeeded in time, else a one-line note: its error,
    or that it goes on in the background (detached, for at most
    :data:`CHILD_LIMIT_S`). The child calls ``done`` with its own note. With
    ``budget_s`` 0 nothing is waited for: ``hand_off`` says what there is to
    say, this process's stdio goes to /dev/null, and the child is started
    and left to itself, so the agent's pipes close as soon as this process
    exits. Otherwise the child has left the agent's pipes before this returns.
    """
    if budget_s <= 0:
        if hand_off is not None:
            hand_off()
        _to_devnull()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(work, turn, done, write_fd)
    os.close(write_fd)
    if turn is not None:
        turn.close()  # the child holds the turn now
    try:
        if budget_s <= 0:
            return None
        report = _report_within(read_fd, budget_s)
        if report is None:
            return still_running(budget_s)
        os.waitpid(pid, os.WNOHANG)  # reaped if done; else it keeps the session's records, then ends detached
    finally:
        os.close(read_fd)
    return report_note(report.decode("utf-8", "replace"))


def _report_within(read_fd: int, budget_s: float) -> bytes | None:
    """The child's report, read to its end: at most :data:`DETACH_WAIT_S` for it to detach, then at most
    ``budget_s`` for the rest; None when the budget ran out first. A child that detached late (a starved
    machine) has its marker taken off the report all the same."""
    report = b""
    detached = False
    deadline = time.monotonic() + DETACH_WAIT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([read_fd], [], [], left)[0]:
            if detached:
                return None
            detached, deadline = True, time.monotonic() + budget_s  # its report may still come in the budget
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:
            return report.removeprefix(_DETACHED)
        report += chunk
        if not detached and report.startswith(_DETACHED):
            detached, deadline = True, time.monotonic() + budget_s


def record(
    event: HookEvent, call: Callable[[str, dict[str, Any]], dict[str, Any]], agent: int | None = None
) -> Callable[[], None] | None:
    """The daemon calls for one event: its checkpoint in the folder the session started in
    (:mod:`.sessionstate`), after closing the session's turn that no ``Stop`` ended when the event
    opens a new one (:data:`~snapshotd.agents.payload.INTERRUPTED`). Returns what to keep once it is
    recorded: the session's record, and that the agent process at or above ``agent`` (the hook's
    parent) runs the session, so that its MCP server acts in it (:func:`~snapshotd.agents.hookstate.agent_session`)."""
    from snapshotd.agents import sessionstate  # in the hook's child

    session = event.session
    if session is None:
        call("checkpoint", event.params())
        return None
    key = None if agent is None else agent_key(agent)  # now: the shell between may be gone once the hook returned
    entry = sessionstate.read(session)
    if entry is not None and not event.starts and os.path.isdir(entry["cwd"]):
        event.cwd = entry["cwd"]
    if event.event in OPENS_TURN:
        if entry is not None:
            left_open = entry["open"]
        else:  # no record of the session (its start, or an older hook's session): its newest checkpoint says
            try:
                newest = call("list", {"path": event.cwd, "session": session, "limit": 1})["checkpoints"]
            except NotFound:  # a folder in no worktree yet: the checkpoint below makes it one
                newest = []
            left_open = bool(newest) and turn_open(newest[0].get("label") or "")
        if left_open:
            call("checkpoint", event.params(INTERRUPTED))
    call("checkpoint", event.params())

    def keep() -> None:
        sessionstate.write(session, event.cwd, turn_open(event.label))
        if key is not None:
            note_agent_session(key, session, event.cwd)

    return keep


class Origin:
    """Where a hook runs: its payload, its folder, its process and the process that started it (the agent,
    or its shell). By default this process's; the daemon's ``hook`` method gives a native hook entry's."""

    __slots__ = ("getcwd", "pid", "ppid", "read")

    def __init__(
        self,
        read: Callable[[], bytes] | None = None,
        getcwd: Callable[[], str] = os.getcwd,
        pid: int | None = None,
        ppid: int | None = None,
    ) -> None:
        self.read = read or (lambda: read_stdin(time.monotonic() + STDIN_WAIT_S))
        self.getcwd, self.pid = getcwd, pid
        self.ppid = os.getppid() if ppid is None else ppid  # the child, detached, will have another parent


if TYPE_CHECKING:
    Background = Callable[[Work, float, Turn | None, Callable[[str | None], None], Callable[[], None] | None], str | None]
    """How the checkpoint runs beside the hook: :func:`within_budget` (a child process), or the daemon's threads."""


def run_hook(
    tool: str,
    call: Callable[[str, dict[str, Any]], dict[str, Any]],
    budget_for: Callable[[bool], float],
    say: Callable[[Outcome], None],
    origin: Origin | None = None,
    background: Background = within_budget,
) -> None:
    """Read a payload of ``tool`` on stdin, record it through ``call(method, params)`` (:func:`record`),
    and ``say`` how it went.

    ``budget_for(before)`` is the wait for an event before the agent acts
    (:data:`BEFORE_EVENTS`) or for any other. ``say`` is called once, before
    the checkpoint when it is handed off (a budget of 0). Never raises.
    ``origin`` and ``background`` say where the hook runs (:class:`Origin`; the daemon's ``hook`` method).
    """
    here = origin or Origin()
    try:
        event = describe(tool, here.read(), here.getcwd)
    except BaseException as exc:  # a hook must never fail the agent, whatever happened
        unread = _note_for(exc)
        try:
            record_result(tool, "", here.getcwd(), unread)
        except BaseException:
            pass
        say(Outcome(unread, failed=True))
        return
    told = False

    def tell(outcome: Outcome) -> None:
        nonlocal told
        told = True
        say(outcome)

    agent = here.ppid
    try:
        earlier = last_result(tool)
        previous = earlier.get("note") if earlier and earlier.get("ok") is False else None
        previous = previous if isinstance(previous, str) else None
        before = event.event in BEFORE_EVENTS
        spawn = Spawn(here.pid)  # an earlier background hook still starting takes its place first: the child waits for it
        if ends_turn(event.label):  # the agent may exit after this hook (claude -p) and end the earlier ones
            spawn.wait_for_earlier(time.monotonic() + EARLIER_WAIT_S)
        turn = Turn(event.session or event.cwd, spawn)
        note = background(
            lambda: record(event, call, agent),
            budget_for(before),
            turn,
            lambda child_note: record_result(tool, event.event, event.cwd, child_note),
            lambda: tell(Outcome(None, False, event.label, previous)),
        )
    except BaseException as exc:
        if not told:
            say(Outcome(_note_for(exc), failed=True, label=event.label))
        return
    if not told:
        failed = note is not None and (before or not note.startswith(STILL_RUNNING))
        say(Outcome(note, failed, event.label, previous if not failed else None))


def report(tool: str, outcome: Outcome, stdout: TextIO, stderr: TextIO) -> None:
    """Say how the run ended as the agents read it: the note on stderr and, at most once in
    :data:`~snapshotd.agents.hookstate.TELL_EVERY_S`, one ``systemMessage`` line for the user on stdout."""
    if outcome.note:
        print(f"snapshotd hook: {outcome.note}", file=stderr)
    line = outcome.user_line()
    if line and may_tell(tool):
        import json  # writing is rare on the hook's path (see snapshotd.jsonlite)

        print(json.dumps({"systemMessage": line}), file=stdout)
