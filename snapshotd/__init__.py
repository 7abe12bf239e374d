"""snapshotd: git snapshots and checkpoints of working trees, served to agent servers.

The public names are re-exported here; the modules behind them are internal.
"""

from .client import AsyncClient as AsyncClient, Client as Client
from .engine import Engine as Engine
from .errors import (
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
from .settings import VERSION as __version__

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

for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and _obj.__module__.startswith("snapshotd."):
        _obj.__module__ = "snapshotd"
del _name, _obj
