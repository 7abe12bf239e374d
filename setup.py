"""Build hook for the optional native helpers: the spawn helper (``snapshotd._spawn_native``) and the
native hook entry (``snapshotd/snapshotd-hook``, from ``native/hook.c``).

All metadata lives in pyproject.toml. Both are optional: when one cannot be
compiled (no C compiler, no glibc 2.34+), the build warns and the package still
installs; ``snapshotd.git.spawn`` then starts processes with ``subprocess``, and
``integrate`` writes the Python hook entry.
"""

from __future__ import annotations

import os
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
        try:
            self._build_hook_entry()
        except _BUILD_ERRORS as exc:
            print(f"snapshotd: could not build the native hook entry ({exc}); integrate writes the Python one", file=sys.stderr)

    def _build_hook_entry(self) -> None:
        """``native/hook.c`` into ``snapshotd/snapshotd-hook``, with the compiler of the extensions."""
        if self.compiler is None or isinstance(self.compiler, str):
            from setuptools._distutils.ccompiler import new_compiler
            from setuptools._distutils.sysconfig import customize_compiler

            compiler = new_compiler(compiler=self.compiler if isinstance(self.compiler, str) else None)
            customize_compiler(compiler)
        else:
            compiler = self.compiler
        if self.inplace:
            folder = os.path.abspath(self.get_finalized_command("build_py").get_package_dir("snapshotd"))
        else:
            folder = os.path.join(self.build_lib, "snapshotd")
        objects = compiler.compile([os.path.join("native", "hook.c")], output_dir=self.build_temp, extra_postargs=["-O2", "-Wall", "-Wextra"])
        compiler.link_executable(objects, "snapshotd-hook", output_dir=folder)

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except _BUILD_ERRORS as exc:
            _skip(ext.name, exc)


setup(
    cffi_modules=["native/build_spawn.py:ffibuilder"],
    cmdclass={"build_ext": OptionalBuildExt},
)
