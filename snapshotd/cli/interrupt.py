"""Ctrl-C during a restore, undo or revert: the work cannot stop half-way, so the command says so.

A restore writes its files one after another under a journal; stopping it
part-way would leave a worktree that is neither the old one nor the new. On
the first Ctrl-C the command says that the work goes on to the end and that
its summary and how to undo it follow; it prints them when the work is done
and exits 130, as an interrupted command does. Through the daemon a second
Ctrl-C stops the waiting (the daemon carries on) and says where the safety
checkpoint will be; embedded, the work runs in this process, which waits.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

from snapshotd.settings import SAFETY_SESSION

INTERRUPTED_STATUS = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


def _say(text: str) -> None:
    """One line on stderr, written straight to the descriptor: safe inside a signal handler."""
    os.write(2, ("\r\033[K" if os.isatty(2) else "").encode() + text.encode("utf-8", "replace") + b"\n")


@dataclass
class Interrupts:
    """How many times Ctrl-C was pressed while ``what`` ran, and what each press says."""

    what: str
    embedded: bool
    count: int = 0

    def handle(self, _signum: int, _frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            again = "" if self.embedded else " (Ctrl-C again to stop waiting; the daemon carries on)"
            _say(
                f"Interrupted: a {self.what} cannot stop half-way, so it goes on to the end; "
                f"its summary and how to undo it follow{again}."
            )
        elif self.embedded:
            _say(f"The {self.what} runs in this process and is finishing; it cannot stop half-way.")
        else:
            raise KeyboardInterrupt


@contextmanager
def finish_on_interrupt(what: str, embedded: bool, folder: str | None) -> Iterator[Interrupts]:
    """Run a restore-like call with Ctrl-C taken as above; ``folder`` is the worktree where known, for the undo hint."""
    state = Interrupts(what, embedded)
    previous = signal.signal(signal.SIGINT, state.handle)
    try:
        yield state
    except KeyboardInterrupt:
        where = f" {folder}" if folder else ""
        _say(
            f"Stopped waiting: the {what} goes on in the daemon if it had begun. Once it is done, its safety "
            f"checkpoint is the newest one of 'snapshotd list --session {SAFETY_SESSION}{where}'"
            f"{'' if folder else ' in the worktree'}: restore that one to undo it."
        )
        sys.exit(INTERRUPTED_STATUS)
    finally:
        signal.signal(signal.SIGINT, previous)
