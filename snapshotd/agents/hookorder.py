"""The order in which the agent started its hooks, and the wait for its earlier ones still starting.

An agent may run a hook in the background (``async`` in Claude Code's and
Codex's settings): it starts the hook's process and goes on, so the next
event's hook may start before the earlier one took its place in the session's
order (:class:`~snapshotd.agents.hookstate.Turn`). So the order is the one the
agent started them in, from /proc: the start time and pid of the process the
agent started (the shell of ``sh -c``, or the hook itself), then the hook's
own; and a hook waits until the agent's earlier hook processes are gone (each
leaves once its place is taken and its checkpoint handed to its child) before
it looks at the session's places, so no checkpoint overtakes an earlier one.
A hook that has taken its place (:class:`~snapshotd.agents.hookstate.Turn`)
need not be waited for any longer: its session's order has it, and a hook of
another session (an agent server runs many in one process) has nothing to
wait for, so a "before" never waits for another session's checkpoint.
That wait also keeps a turn's last hook, which the agent waits for, from
returning while an earlier background hook is still starting: an agent that
exits then (``claude -p``) would end it before its checkpoint was handed off.
"""

from __future__ import annotations

import os
import time

from snapshotd.settings import disabled_facilities

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from collections.abc import Callable

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "fish", "ksh", "mksh", "busybox"})
"""Programs an agent may run its hooks or MCP servers through; the agent is the first ancestor that is none."""

POLL_S = 0.005
POLL_MAX_S = 0.04
"""A waiting hook looks again after POLL_S, then twice as long each time up to POLL_MAX_S: hundreds of hooks
of one agent waiting on one another must not take the machine's cores to look."""
HOOK_MARKS = (b"hookentry.py", b"snapshotd\0hook\0", b"snapshotd hook ")
"""What the command line of one of snapshotd's hook processes holds (the hook program, or ``snapshotd hook``)."""


def proc_stat(pid: int) -> tuple[str, str, int, int] | None:
    """(command name, state, parent pid, start time in clock ticks) of process ``pid``; None when it is gone or
    there is no /proc (``SNAPSHOTD_DISABLE=proc`` as well)."""
    if "proc" in disabled_facilities():
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    name, _, rest = text[text.index("(") + 1 :].rpartition(")")
    fields = rest.split()
    return name, fields[0], int(fields[1]), int(fields[19])


class Spawn:
    """Where this hook process stands among the agent's: the process the agent started (``top``), and the agent."""

    __slots__ = ("agent", "own_start", "pid", "start", "top")

    def __init__(self, pid: int | None = None) -> None:
        """Where hook process ``pid`` stands (this one by default; a native hook entry's, in the daemon)."""
        self.pid = pid = os.getpid() if pid is None else pid
        found = proc_stat(pid)
        self.own_start = found[3] if found is not None else 0
        self.top, self.start, self.agent = pid, self.own_start, 0
        for _ in range(8):  # up through the shells the agent ran the hook with
            if found is None or found[2] <= 1:
                return
            parent = proc_stat(found[2])
            if parent is None:
                return
            if parent[0] not in SHELLS:
                self.agent = found[2]
                return
            self.top, self.start, found = found[2], parent[3], parent

    def name(self) -> str:
        """This run's place in its session's order, as a file name: sorted as the agent started the hooks."""
        return f"{self.start:016d}-{self.top:010d}-{self.own_start:016d}-{self.pid:010d}"

    def earlier_hooks(self) -> list[tuple[int, int]]:
        """(pid, start) of the agent's hook processes started before this one's and still running."""
        if self.agent <= 1:
            return []
        children: set[int] = set()
        try:
            for task in os.listdir(f"/proc/{self.agent}/task"):
                with open(f"/proc/{self.agent}/task/{task}/children", encoding="ascii") as handle:
                    children.update(int(word) for word in handle.read().split())
        except OSError:
            return []
        earlier = []
        for pid in children - {self.top}:
            found = proc_stat(pid)
            if found is not None and found[1] != "Z" and (found[3], pid) < (self.start, self.top) and _is_hook(pid):
                earlier.append((pid, found[3]))
        return earlier

    def place(self) -> str:
        """The name under which this hook shows the agent's later hooks that it has taken its place."""
        return f"{self.start}-{self.top}"

    def wait_for_earlier(self, deadline: float, placed: Callable[[str], bool] | None = None) -> bool:
        """Wait until the agent's earlier hook processes are gone, or with ``placed`` have taken their place
        (``placed(name)``, the name :meth:`place` gives them); False when ``deadline`` (monotonic) passed first.

        One process at a time, oldest first, looking again less and less often (:data:`POLL_MAX_S`)."""
        pause = POLL_S
        for pid, start in sorted(self.earlier_hooks(), key=lambda hook: (hook[1], hook[0])):
            while _running(pid, start) and not (placed is not None and placed(f"{start}-{pid}")):
                if time.monotonic() >= deadline:
                    return False
                time.sleep(pause)
                pause = min(2 * pause, POLL_MAX_S)
        return True


def _running(pid: int, start: int) -> bool:
    found = proc_stat(pid)
    return found is not None and found[1] != "Z" and found[3] == start


def _is_hook(pid: int) -> bool:
    """Whether process ``pid`` runs one of snapshotd's hooks (itself, or the shell running one)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            line = handle.read(65536)
    except OSError:
        return False
    return any(mark in line for mark in HOOK_MARKS)
