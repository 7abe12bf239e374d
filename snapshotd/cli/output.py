"""What the commands print: human lines for results, JSON for ``--json``, and progress.

Formatting only: nothing here calls the daemon. JSON text stays valid UTF-8
whatever a file name holds, and names that are not UTF-8 print as their own
bytes.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import click

from snapshotd.paths import quote_path
from snapshotd.wording import one_line, plural, submodule_note


@contextmanager
def show_progress(message: str | None) -> Iterator[None]:
    """Show a ticking line on a terminal when the work takes longer than a second."""
    if message is None or not sys.stderr.isatty():
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        if done.wait(1.0):
            return
        while not done.wait(0.1):
            click.echo(f"\r{message}… {time.monotonic() - started:.1f}s", nl=False, err=True)
        click.echo("\r\033[K", nl=False, err=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def to_json(value: Any, *, indent: int | None = 2) -> str:
    """JSON text that is valid UTF-8 whatever the value holds.

    Non-ASCII text stays readable; a lone surrogate (a file name that is not
    UTF-8) is written as a ``\\uXXXX`` escape, as on the wire.
    """
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def let_output_carry_raw_names() -> None:
    """Print file names that are not UTF-8 as their own bytes instead of failing."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (getattr(stream, "encoding", "") or "").lower().replace("-", "") == "utf8":
            with suppress(ValueError, OSError):
                reconfigure(errors="surrogateescape")



def short_id(hex_id: str | None) -> str:
    return hex_id[:12] if hex_id else "-"


def human_size(count: int) -> str:
    """A byte count as people read it (``80.0 MiB``)."""
    units = ("bytes", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while count >= 1024 ** (power + 1) and power < len(units) - 1:
        power += 1
    return f"{count} bytes" if power == 0 else f"{count / 1024**power:.1f} {units[power]}"


def skip_reason(item: dict[str, Any]) -> str:
    """Why a capture left a path out, with its size against the cap where that is the reason."""
    if "size" in item and "cap" in item:
        return f"{human_size(item['size'])}, over the {human_size(item['cap'])} cap for untracked files (--size-cap on serve)"
    reason: str = item["reason"]
    return reason


def checkpoint_line(cp: dict[str, Any], session_width: int = 12, seq_width: int = 4) -> str:
    """One checkpoint on one line; ``session_width`` and ``seq_width`` align the columns across a listing."""
    mark = "" if cp.get("changed", True) else click.style("(unchanged)", dim=True)
    tail = " ".join(part for part in (one_line(cp.get("label") or ""), mark) if part)
    session = one_line(cp.get("session") or "-")
    seq = f"#{cp['seq']:<{seq_width}}"
    head = f"{click.style(short_id(cp['id']), fg='yellow')}  {seq} {cp['created_at'][:19].replace('T', ' ')}"
    return f"{head}  {session:<{session_width}} {tail}" if tail else f"{head}  {session}"



def print_patch(text: str) -> None:
    """Print a patch line by line, coloured as git colours it; lines end at ``\n`` alone, as in git's patches
    (a ``\r``, a form feed or a Unicode line separator is part of its line)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        colour = None
        if line.startswith(("+++", "---", "diff --git", "index ")):
            click.echo(click.style(line, bold=True))
            continue
        if line.startswith("+"):
            colour = "green"
        elif line.startswith("-"):
            colour = "red"
        elif line.startswith("@@"):
            colour = "cyan"
        click.echo(click.style(line, fg=colour) if colour else line)



def print_changes(result: dict[str, Any], dry_run: bool, err: bool = False) -> None:
    """Written, deleted, left alone (and why) and kept paths, a summary, and how to undo."""
    submodules = set(result.get("submodules") or [])
    for path in result.get("written", []):
        if path in submodules:
            click.echo(f"{click.style('S', fg='yellow')}  {submodule_note(path, dry_run)}", err=err)
            continue
        click.echo(f"{click.style('W', fg='green')}  {quote_path(path)}", err=err)
    for path in result.get("deleted", []):
        click.echo(f"{click.style('D', fg='red')}  {quote_path(path)}", err=err)
    for item in result.get("conflicts", []) + result.get("skipped", []):
        click.echo(f"{click.style('!', fg='magenta')}  {quote_path(item['path'])}: {item['reason']}", err=err)
    for item in result.get("kept", []):
        click.echo(f"{click.style('K', fg='cyan')}  {quote_path(item['path'])}: {item['reason']}", err=err)
    written, deleted = len(result.get("written", [])) - len(submodules), len(result.get("deleted", []))
    summary = (
        f"would write {plural(written, 'file')}, would delete {plural(deleted, 'file')}"
        if dry_run
        else f"wrote {plural(written, 'file')}, deleted {plural(deleted, 'file')}"
    )
    if submodules:
        summary += f", {'would make' if dry_run else 'made'} {plural(len(submodules), 'submodule folder')}"
    click.echo(click.style(summary, dim=True), err=err)
    safety = result.get("safety_checkpoint")
    if safety:
        click.echo(f"undo with: snapshotd restore {safety['id'][:12]}  (or: snapshotd undo)", err=err)
