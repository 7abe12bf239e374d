"""libgit2 functions pygit2 does not wrap, taken from the libgit2 pygit2 loaded, typed with pygit2's own cffi.

pygit2's compiled module links libgit2; looking a name up there finds it in
that library, so the objects pygit2 made (repositories, trees, indexes) are
passed as they are. cffi lets go of the interpreter's lock during each call.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

__all__ = ["function"]


@functools.cache
def function(name: str, signature: str) -> Any:
    """libgit2's ``name`` as a cffi function of ``signature`` (a C function pointer type), or None when it is not there."""
    try:
        from pygit2 import _libgit2
        from pygit2.ffi import ffi

        address = ctypes.cast(getattr(ctypes.CDLL(_libgit2.__file__), name), ctypes.c_void_p).value
    except (ImportError, OSError, AttributeError):
        return None
    return ffi.cast(signature, address) if address else None
