"""Colour and the pager, decided as git decides them.

Colour: ``--color=always`` or ``never``; ``auto`` (the default) colours a
terminal only, and not at all when ``NO_COLOR`` is set to anything. The
pager: the commands whose output can be long (:data:`PAGED`) send it through
``$SNAPSHOTD_PAGER``, else ``$PAGER``, else ``less`` (with ``LESS=FRX`` unless
``LESS`` is set, so a screenful or less prints and returns) when standard
output is a terminal; ``--no-pager``, a pager of ``cat`` or an empty one, or
one that is not installed, prints directly. Output sent elsewhere is never
paged.
"""

from __future__ import annotations

import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
from contextlib import suppress

import click

COLOR_CHOICES = ("auto", "always", "never")
PAGED = frozenset({"diff", "list", "log", "show"})


def color_setting(when: str) -> bool | None:
    """click's colour switch for ``--color=WHEN``: True, False, or None (colour a terminal only)."""
    if when == "always":
        return True
    if when == "never" or os.environ.get("NO_COLOR"):
        return False
    return None


def pager_command() -> str | None:
    """The pager's command line, or None when output should print directly."""
    command = os.environ.get("SNAPSHOTD_PAGER")
    if command is None:
        command = os.environ.get("PAGER", "less")
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words or words[0] == "cat" or shutil.which(words[0]) is None:
        return None
    return command


class Pager:
    """A running pager that this process's standard output (descriptor 1) writes to."""

    def __init__(self, command: str) -> None:
        env = dict(os.environ)
        env.setdefault("LESS", "FRX")
        env.setdefault("LV", "-c")
        sys.stdout.flush()
        self.proc = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env)
        assert self.proc.stdin is not None
        self.saved = os.dup(1)
        os.dup2(self.proc.stdin.fileno(), 1)
        self.proc.stdin.close()
        # Quitting the pager early ends this command as it ends git: quietly, by SIGPIPE.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    def close(self) -> None:
        """Hand the pager the rest of the output and wait until the person quits it."""
        with suppress(BrokenPipeError, OSError):
            sys.stdout.flush()
        os.dup2(self.saved, 1)
        os.close(self.saved)
        while True:
            try:
                self.proc.wait()
                return
            except KeyboardInterrupt:  # Ctrl-C belongs to the pager while it runs
                continue


def set_up(ctx: click.Context, color: str, no_pager: bool) -> None:
    """Apply ``--color`` and start the pager for a paged command whose output is a terminal."""
    ctx.color = color_setting(color)
    if no_pager or ctx.invoked_subcommand not in PAGED or not sys.stdout.isatty():
        return
    command = pager_command()
    if command is None:
        return
    pager = Pager(command)
    if ctx.color is None:
        ctx.color = True  # the pager's pipe is no terminal, but the person sees the colours
    ctx.call_on_close(pager.close)


def output_gone() -> bool:
    """Whether standard output is a pipe whose reader went away (``| head`` that had enough)."""
    poller = select.poll()
    poller.register(1, 0)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def end_as_git_does() -> None:
    """End this command as git ends when its reader goes: by SIGPIPE (status 141 in a shell)."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    os._exit(128 + signal.SIGPIPE)  # not reached: SIGPIPE ends the process
