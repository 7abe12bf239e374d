"""Git's ownership rule (``safe.directory``): whose repositories snapshotd works in.

snapshotd runs git with ``GIT_DIR`` set, which skips git's own check, and
reads repositories through libgit2, which skips it for SHA-256 ones. So the
rule is applied here, once, to every repository a path leads to, before
anything there is read or run: the worktree folder, the ``.git`` file and the
git dirs must belong to the current user (when running as root: to root, or
to the user ``sudo`` names in ``SUDO_UID``), unless the user's own
configuration lists the worktree in ``safe.directory`` (or ``*``). Another
user's repository could otherwise make snapshotd run that user's programs
(``core.fsmonitor``) or put this user's files in a store the other user reads.
"""

from __future__ import annotations

import errno
import os
import pwd
from collections.abc import Sequence

import pygit2

from snapshotd.errors import Untrusted
from snapshotd.fsutil import MISSING_ERRNOS, changed_while_opened
from snapshotd.git.config import protected_config_values

__all__ = ["check_repository_owner", "check_store_owner", "trusted_uids"]

ROOT_UID = 0

# The rule is applied here, before libgit2 opens anything; libgit2's own copy
# of it reads the configuration it found when the process started (a changed
# HOME or a new safe.directory entry go unseen) and would refuse what git allows.
pygit2.option(pygit2.enums.Option.SET_OWNER_VALIDATION, False)


def trusted_uids() -> frozenset[int]:
    """The owners git accepts for this process: its effective user; for root also ``SUDO_UID``'s."""
    euid = os.geteuid()
    if euid != ROOT_UID:
        return frozenset({euid})
    sudo_uid = os.environ.get("SUDO_UID", "")
    return frozenset({ROOT_UID, int(sudo_uid)}) if sudo_uid.isdigit() else frozenset({ROOT_UID})


def _foreign_owner(root: str, paths: Sequence[str], trusted: frozenset[int]) -> tuple[str, int | None] | None:
    """The first path not owned by a trusted uid, with its owner (None when it cannot be read).

    A path gone since the caller saw it (``rm -rf`` of the worktree under way)
    has no owner to judge: the worktree ``root`` is ``not_found``.
    """
    for path in paths:
        try:
            owner = os.lstat(path).st_uid
        except OSError as exc:
            if exc.errno in MISSING_ERRNOS:
                raise changed_while_opened(root, exc) from exc
            return path, None
        if owner not in trusted:
            return path, owner
    return None


def _listed_as_safe(root: str) -> bool:
    """Whether the user's ``safe.directory`` entries name ``root`` (exactly, by ``dir/*`` or ``*``).

    An empty entry clears the entries before it, as in git.
    """
    safe = False
    for entry in protected_config_values("safe.directory"):
        if entry == "":
            safe = False
        elif entry == "*":
            safe = True
        elif entry.endswith("/*"):
            safe = safe or root.startswith(os.path.realpath(entry[:-2]).rstrip("/") + "/")
        elif os.path.isabs(entry):
            safe = safe or root in (entry, os.path.realpath(entry))
    return safe


def _owner_name(uid: int | None) -> str:
    if uid is None:
        return "an owner it cannot read"
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_repository_owner(root: str, paths: Sequence[str]) -> None:
    """Refuse the repository of worktree ``root`` unless ``paths`` (its folders and files) are the user's.

    ``root`` (a real path) is what ``safe.directory`` must name to allow it
    anyway. Raises :class:`~snapshotd.errors.Untrusted` with the remedy, and
    :class:`~snapshotd.errors.NotFound` naming ``root`` when one of ``paths``
    is gone by the time it is looked at.
    """
    foreign = _foreign_owner(root, paths, trusted_uids())
    if foreign is None or _listed_as_safe(root):
        return
    path, owner = foreign
    raise Untrusted(
        f"The repository at {root} is not yours ({path} belongs to {_owner_name(owner)}), so snapshotd, "
        f"like git, will not work in it; if you trust it, run: git config --global --add safe.directory {root}",
        path=root,
        owner=owner,
    )


def check_store_owner(git_dir: str) -> None:
    """The rule for a store opened by its path alone (from the records, or searched for an id).

    A recorded repository may have been deleted and made again by another
    user at the same path, so the git dir and its config must still be the
    user's. ``safe.directory`` names a worktree, so for a ``.git`` folder it
    is asked about the folder holding it. A git dir that is not there, or
    has lost its ``HEAD``, ``refs`` or ``objects`` (its worktree deleted
    meanwhile, ``rm -rf`` under way), is ``not_found`` naming that folder,
    not libgit2's "repository not found"; a missing config is left for the
    opening to report.
    """
    real = os.path.realpath(git_dir)
    root = os.path.dirname(real) if os.path.basename(real) == ".git" else real
    for place in (real, *(os.path.join(real, part) for part in ("HEAD", "refs", "objects"))):
        if not os.path.lexists(place):
            missing = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), place)
            raise changed_while_opened(root, missing) from missing
    check_repository_owner(root, [path for path in (real, os.path.join(real, "config")) if os.path.lexists(path)])
