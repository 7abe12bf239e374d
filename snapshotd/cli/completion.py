"""What shell completion offers for checkpoint references and sessions (click's completion).

``snapshotd completion SHELL`` (:mod:`.admin`) prints the script to load. A
CHECKPOINT argument completes to ``@``, ``@~N``, ``#N``, ``SESSION@`` and ids
of the worktree here, a ``--session`` to its sessions, read from a daemon that is already running: completing a word
never starts one, and without one only ``@`` and ``@~1`` are offered.
"""

from __future__ import annotations

import os
from contextlib import suppress
from typing import Any

import click
from click.shell_completion import CompletionItem

from snapshotd.errors import SnapshotdError
from snapshotd.settings import SAFETY_SESSION, resolve_socket_path

SHELLS = ("bash", "zsh", "fish")  # the shells click writes a completion script for
RECENT = 30  # checkpoints offered, newest first
_ASK_S = 1.0  # how long a completion waits for the daemon


def _recent(ctx: click.Context) -> list[dict[str, Any]]:
    """The newest checkpoints of the worktree here, from a running daemon; none when none answers."""
    from snapshotd.client.rpc import Client

    root = ctx.find_root()
    socket_path = resolve_socket_path(root.params.get("socket_path"))
    with suppress(OSError, ConnectionError, SnapshotdError, ValueError), Client(
        socket_path, timeout=_ASK_S, connect_timeout=_ASK_S
    ) as client:
        found: list[dict[str, Any]] = client.call("list", {"path": os.getcwd(), "limit": RECENT})["checkpoints"]
        return found
    return []


def _label(cp: dict[str, Any]) -> str:
    label = " ".join((cp.get("label") or "").split())[:50]
    return f"{cp['session'] or 'default'} #{cp['seq']} {label}".strip()


def complete_reference(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """``@``, ``@~N``, ``#N``, ``SESSION@`` and ids that start with what is typed."""
    found = _recent(ctx)
    mine = [cp for cp in found if cp["session"] != SAFETY_SESSION]
    newest = mine[0]["session"] if mine else None
    in_newest = [cp for cp in mine if cp["session"] == newest]
    items = [CompletionItem("@", help=_label(in_newest[0]) if in_newest else "the newest checkpoint here")]
    items += [CompletionItem(f"@~{n}", help=_label(cp)) for n, cp in enumerate(in_newest[1:], start=1)]
    if not found:
        items.append(CompletionItem("@~1", help="the one before the newest"))
    items += [CompletionItem(f"#{cp['seq']}", help=_label(cp)) for cp in in_newest]
    for session in dict.fromkeys(cp["session"] for cp in mine if cp["session"]):
        items.append(CompletionItem(f"{session}@", help="the newest checkpoint of that session"))
    if incomplete and all(c in "0123456789abcdef" for c in incomplete.lower()):
        items += [CompletionItem(cp["id"][:12], help=_label(cp)) for cp in found]
    if param.name == "source" and "worktree".startswith(incomplete):
        items.append(CompletionItem("worktree", help="the worktree as it is now"))
    return [item for item in items if str(item.value).startswith(incomplete)]


def complete_session(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The sessions of the worktree here's newest checkpoints."""
    sessions = dict.fromkeys(cp["session"] for cp in _recent(ctx) if cp["session"] and cp["session"] != SAFETY_SESSION)
    return [CompletionItem(session) for session in sessions if session.startswith(incomplete)]
