"""The page's changes to a worktree: restore, revert and undo, each previewed before it is done.

Every action is first sent with ``dry_run`` (the same preview the command
line prints before it asks), and only a second request with ``confirm``
true changes files; that one goes through the daemon's own ``restore`` or
``revert``, so the safety checkpoint is taken first, as always.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from snapshotd.errors import InvalidParams, NotFound
from snapshotd.paths import quote_path
from snapshotd.settings import SAFETY_SESSION
from snapshotd.ui.bridge import Bridge
from snapshotd.wording import submodule_note

ACTIONS = ("restore", "revert", "undo")


@dataclass(frozen=True)
class Action:
    """One request of the page: what to do in which worktree, and whether it is confirmed."""

    action: str
    worktree: str
    checkpoint: str | None
    source: str | None
    target: str | None
    paths: list[str] | None
    force: bool
    confirm: bool

    @classmethod
    def from_json(cls, body: Any) -> Action:
        """Read the page's JSON body; a missing or wrong field is :class:`InvalidParams` naming it."""
        if not isinstance(body, dict):
            raise InvalidParams("The request must be a JSON object.")
        action = body.get("action")
        if action not in ACTIONS:
            raise InvalidParams(f"'action' must be one of {', '.join(ACTIONS)}.")
        worktree = body.get("worktree")
        if not isinstance(worktree, str) or not worktree:
            raise InvalidParams("'worktree' (the worktree's id) is required.")
        paths = body.get("paths")
        if paths is not None and (not isinstance(paths, list) or not all(isinstance(p, str) for p in paths)):
            raise InvalidParams("'paths' must be a list of file names.")

        def ref(name: str) -> str | None:
            value = body.get(name)
            if value is not None and not isinstance(value, str):
                raise InvalidParams(f"'{name}' must be a checkpoint id.")
            return value

        made = cls(action, worktree, ref("checkpoint"), ref("from"), ref("to"), paths or None,
                   body.get("force") is True, body.get("confirm") is True)
        if action == "restore" and made.checkpoint is None:
            raise InvalidParams("A restore needs 'checkpoint'.")
        if action == "revert" and (made.source is None or made.target is None):
            raise InvalidParams("A revert needs 'from' and 'to'.")
        return made


async def perform(bridge: Bridge, action: Action) -> dict[str, Any]:
    """The preview (unless confirmed) or the outcome of ``action``, with what it acted on."""
    dry_run = None if action.confirm else True
    if action.action == "revert":
        params = {"from": action.source, "to": action.target, "worktree": action.worktree,
                  "paths": action.paths, "force": action.force or None, "dry_run": dry_run}
        result = await bridge.call("revert", params)
        return {"action": "revert", "dry_run": not action.confirm, **result, "shown": _shown(result, not action.confirm)}
    checkpoint = action.checkpoint
    if action.action == "undo":
        found = (await bridge.call("list", {"worktree": action.worktree, "session": SAFETY_SESSION, "limit": 1}))
        if not found["checkpoints"]:
            raise NotFound("There is no restore or revert to undo in this worktree.")
        checkpoint = found["checkpoints"][0]["id"]
    params = {"checkpoint": checkpoint, "worktree": action.worktree, "paths": action.paths, "dry_run": dry_run}
    result = await bridge.call("restore", params)
    return {"action": action.action, "dry_run": not action.confirm, "checkpoint": checkpoint, **result,
            "shown": _shown(result, not action.confirm)}


def _shown(result: dict[str, Any], dry_run: bool) -> dict[str, list[str]]:
    """The result's file names as git quotes them, each conflict or kept file with its reason, and the submodules.

    A submodule in ``written`` had only its folder made (a checkpoint holds no
    submodule's files): it is said apart, as the command line says it, and
    counts as no file written.
    """
    submodules = set(result.get("submodules") or [])
    written = result.get("written") or []
    shown = {
        "written": [quote_path(path) for path in written if path not in submodules],
        "deleted": [quote_path(path) for path in result.get("deleted") or []],
        "submodules": [submodule_note(path, dry_run) for path in written if path in submodules],
    }
    for name in ("conflicts", "kept"):
        shown[name] = [f"{quote_path(item['path'])} ({item['reason']})" for item in result.get(name) or []]
    return shown
