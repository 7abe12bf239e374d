"""snapshotd: git snapshots and checkpoints of working trees, served to agent servers.

The public names are re-exported here; the modules behind them are internal.
The clients and the engine are imported on first use, so a command-line call
that only talks to the daemon does not pay for pygit2 and trio.
"""

from __future__ import annotations

from snapshotd.errors import (
    Ambiguous as Ambiguous,
    Busy as Busy,
    GitError as GitError,
    InvalidParams as InvalidParams,
    NotADirectory as NotADirectory,
    NotFound as NotFound,
    PathOutsideWorktree as PathOutsideWorktree,
    ShuttingDown as ShuttingDown,
    SnapshotdError as SnapshotdError,
    TooLarge as TooLarge,
    Unsupported as Unsupported,
    WorktreeMismatch as WorktreeMismatch,
)
from snapshotd.settings import VERSION as __version__

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from typing import Any

_LAZY = {"AsyncClient": ".client.rpc", "Client": ".client.rpc", "Engine": ".engine.core"}

__all__ = [
    "Ambiguous",
    "AsyncClient",
    "Busy",
    "Client",
    "Engine",
    "GitError",
    "InvalidParams",
    "NotADirectory",
    "NotFound",
    "PathOutsideWorktree",
    "ShuttingDown",
    "SnapshotdError",
    "TooLarge",
    "Unsupported",
    "WorktreeMismatch",
    "__version__",
]


def _public(obj: Any) -> Any:
    if getattr(obj, "__module__", "").startswith("snapshotd."):
        obj.__module__ = "snapshotd"
    return obj


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'snapshotd' has no attribute {name!r}")
    import importlib  # here: an agent hook imports this package and needs none of these

    value = _public(getattr(importlib.import_module(_LAZY[name], __name__), name))
    globals()[name] = value
    return value


for _name in __all__:
    if _name not in _LAZY and _name != "__version__":
        _public(globals()[_name])
del _name
