"""CFFI (API mode) build script for ``snapshotd._spawn_native``.

setup.py loads ``ffibuilder`` from here through ``cffi_modules``. Running the
file directly compiles the module in place, next to ``snapshotd/spawn.py``,
under the same name an editable install gives it (so neither build can shadow
the other), which is handy while working on the C code.
"""

from __future__ import annotations

import os

from cffi import FFI

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)

_DECLARATION = """
int snapshotd_spawn(const char *path, char *const argv[], char *const envp[],
                    const char *cwd, int fd0, int fd1, int fd2, int *pid_out);
"""


def make_builder(absolute: bool = False) -> FFI:
    """The FFI builder; sources relative to the project root unless ``absolute``."""
    source = os.path.join(_HERE, "spawn.c")
    if not absolute and os.getcwd() == _ROOT:
        source = os.path.relpath(source, _ROOT)  # setuptools prefers relative sources
    builder = FFI()
    builder.cdef(_DECLARATION)
    builder.set_source(
        "snapshotd._spawn_native",
        _DECLARATION,
        sources=[source],
        extra_compile_args=["-O2", "-Wall", "-Wextra"],
    )
    return builder


ffibuilder = make_builder()


if __name__ == "__main__":
    import glob
    import shutil

    built = make_builder(absolute=True).compile(
        tmpdir=os.path.join(_HERE, "_spawn_build"), verbose=True
    )
    target = os.path.join(_ROOT, "snapshotd")
    for old in glob.glob(os.path.join(target, "_spawn_native.*.so")):
        os.remove(old)
    # cffi modules use the stable ABI, hence the name setuptools gives them too.
    installed = os.path.join(target, "_spawn_native.abi3.so")
    shutil.copy2(built, installed)
    print(f"copied {built} -> {installed}")
