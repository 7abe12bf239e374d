"""A checkpoint commit's message: its label as the subject, then ``Snapshotd-*`` trailers, read back the same way.

The trailers are the worktree id, session, label, seq, previous checkpoint,
base, time, changed flag and host (what the store is rebuilt from), then the agent's
ids the checkpoint was recorded with (``Snapshotd-Agent-*``, see
:mod:`snapshotd.contract.trailers`). They form the message's last paragraph,
one ``Name: value`` line each, so ``git interpret-trailers --parse`` lists them.
"""

from __future__ import annotations

import json
from typing import Protocol

from snapshotd.contract.trailers import Agent, key_of, trailer_name
from snapshotd.store.pins import TRAILER

SUBJECT_CHARS = 200


class Recorded(Protocol):
    """What a message is made of: a :class:`~snapshotd.store.checkpoints.Checkpoint`'s fields."""

    @property
    def worktree(self) -> str: ...
    @property
    def session(self) -> str | None: ...
    @property
    def label(self) -> str | None: ...
    @property
    def seq(self) -> int: ...
    @property
    def parent(self) -> str | None: ...
    @property
    def base(self) -> str | None: ...
    @property
    def created_at(self) -> str: ...
    @property
    def changed(self) -> bool: ...
    @property
    def host(self) -> str | None: ...
    @property
    def agent(self) -> Agent: ...


def checkpoint_message(cp: Recorded) -> str:
    """The commit message of ``cp``."""
    subject = (cp.label or "snapshotd checkpoint").splitlines()[0][:SUBJECT_CHARS] or "snapshotd checkpoint"
    trailers = {
        "Worktree": cp.worktree,
        "Session": json.dumps(cp.session),
        "Label": json.dumps(cp.label),
        "Seq": str(cp.seq),
        "Previous": cp.parent or "none",
        "Base": cp.base or "none",
        "Created": cp.created_at,
        "Changed": "true" if cp.changed else "false",
        "Host": json.dumps(cp.host),
    }
    trailers.update((trailer_name(key), value) for key, value in cp.agent)
    body = "\n".join(f"{TRAILER}{key}: {value}" for key, value in trailers.items())
    return f"{subject}\n\n{body}\n"


def message_fields(message: str) -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
    """The ``Snapshotd-*`` trailers of a message (name after the prefix -> value), and its agent ids apart."""
    fields: dict[str, str] = {}
    agent: list[tuple[str, str]] = []
    for line in message.splitlines():
        if line.startswith(TRAILER):
            name, _, value = line[len(TRAILER) :].partition(": ")
            key = key_of(name)
            if key is not None:
                agent.append((key, value))
            else:
                fields[name] = value
    return fields, tuple(agent)


def parses_back(message: str, agent: Agent) -> bool:
    """Whether :func:`message_fields` reads the message of ``agent``'s ids as it was written: no subject that
    looks like a trailer, no line break but ``\\n`` (U+2028 in an id would split its line), every key one."""
    if message.startswith(TRAILER) or len(message.splitlines()) != message.count("\n"):
        return False
    return all(key_of(trailer_name(key)) == key for key, _ in agent)
