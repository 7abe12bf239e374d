"""Build hook for the optional native spawn helper (``snapshotd._spawn_native``).

All metadata lives in pyproject.toml. The helper is optional: when it cannot be
compiled (no C compiler, no glibc 2.34+), the build warns and the package still
installs; ``snapshotd.git.spawn`` then starts processes with ``subprocess``.
"""

from __future__ import annotations

import sys
import warnings

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError, PlatformError

_BUILD_ERRORS = (CCompilerError, CompileError, ExecError, LinkError, PlatformError, OSError)


def _skip(what: str, exc: BaseException) -> None:
    message = (
        f"snapshotd: could not build {what} ({exc}); "
        "installing without it, processes will be started with subprocess"
    )
    print(message, file=sys.stderr)
    warnings.warn(message, stacklevel=2)


class OptionalBuildExt(build_ext):
    """build_ext that turns a compiler failure into a warning."""

    def run(self) -> None:
        for ext in self.extensions:
            # An optional extension that fails is skipped by every later step
            # (the in-place copy of an editable install included).
            ext.optional = True
        try:
            super().run()
        except _BUILD_ERRORS as exc:
            _skip("the native extensions", exc)

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except _BUILD_ERRORS as exc:
            _skip(ext.name, exc)


setup(
    cffi_modules=["native/build_spawn.py:ffibuilder"],
    cmdclass={"build_ext": OptionalBuildExt},
)
