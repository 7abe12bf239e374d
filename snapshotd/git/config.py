"""Reading git configuration: a repository's values, and the user's own (protected) ones."""

from __future__ import annotations

import os
import re
import stat
from typing import Protocol

import pygit2

from snapshotd.git.process import run_git_without_repository

PROTECTED_SCOPES = ("system", "global", "command")
INCLUDE_DEPTH = 10  # git's own limit of nested includes
INCLUDE_MAX_BYTES = 1 << 20  # a config file larger than this is not looked into for includes
_HEADER = re.compile(r'\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"(?:[^"\\]|\\.)*")?\s*\]')


class ConfigLookup(Protocol):
    """A repository's configuration by name: ``repo.config`` of either back-end."""

    def __getitem__(self, name: str) -> object: ...


def config_value(config: ConfigLookup, name: str) -> str | None:
    """The value of ``name`` as a repository's configuration resolves it (every level), or None.

    None also when the configuration cannot be read: a setting that cannot be
    read is treated as unset, as git itself does for a missing file.
    """
    try:
        return str(config[name])
    except (KeyError, ValueError, pygit2.GitError):
        return None


def protected_config_values(name: str) -> list[str]:
    """Every value of the multi-valued setting ``name`` in the user's own configuration, in git's order.

    Only what git calls protected configuration counts (system, global,
    command line), never a repository's file, so a repository cannot vouch for
    itself. Paths come expanded (``~/x``), as git reads them; git runs from
    ``/`` with no repository.
    """
    args = ["config", "--show-scope", "-z", "--type=path", "--includes", "--get-all", name]
    fields = run_git_without_repository(args, ok_codes=(0, 1)).split(b"\0")
    return [
        os.fsdecode(value)
        for scope, value in zip(fields[0::2], fields[1::2], strict=False)
        if scope.decode("ascii", "replace") in PROTECTED_SCOPES
    ]


def included_files(path: str) -> list[str]:
    """Every file the config file ``path`` includes, nested ones too, whatever their ``includeIf`` condition.

    For the stat data that says a setting may have changed: a condition not
    met only costs a look at a file that counts for nothing. Paths are
    resolved as git does: ``~/`` from the home folder, a relative one from
    the including file's folder. A file that cannot be read includes nothing.
    """
    found: list[str] = []
    pending = [(path, 0)]
    while pending:
        current, depth = pending.pop()
        if depth >= INCLUDE_DEPTH:
            continue
        for target in _include_paths(current):
            target = os.path.expanduser(target)
            if not os.path.isabs(target):
                target = os.path.join(os.path.dirname(current), target)
            if target not in found:
                found.append(target)
                pending.append((target, depth + 1))
    return found


def _include_paths(path: str) -> list[str]:
    """The ``path`` values of the ``[include]`` and ``[includeIf ...]`` sections of one config file."""
    try:  # a FIFO or a device named there must not hang or fill the daemon: a regular file, of a sane size
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > INCLUDE_MAX_BYTES:
            return []
        text = os.read(fd, INCLUDE_MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return []
    finally:
        os.close(fd)
    paths, section = [], ""
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header is not None:
            section = header.group(1).lower()
            line = line[header.end():]  # a key may follow its section's header on the same line
        if section not in ("include", "includeif"):
            continue
        key, equals, value = line.partition("=")
        if equals and key.strip().lower() == "path":
            value = _config_string(value)
            if value:
                paths.append(value)
    return paths


def _config_string(raw: str) -> str:
    """A config value as git reads it: quotes removed, ``\\`` and ``\\"`` unescaped, a comment cut off."""
    out, quoted, escaped = [], False, False
    for char in raw.strip():
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char in "#;" and not quoted:
            break
        else:
            out.append(char)
    return "".join(out).strip()
