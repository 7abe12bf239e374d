"""Every public name is exported once, from ``snapshotd``, as the one object the package means by it.

Each name in ``snapshotd.__all__`` resolves (the lazy ones too), is listed
once, and every module of the package that has an attribute of that name
holds that same object: no module defines a twin under a public name.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import snapshotd


def package_modules() -> list[ModuleType]:
    """Every module of the package, imported (``__main__`` would run the command line)."""
    names = [info.name for info in pkgutil.walk_packages(snapshotd.__path__, "snapshotd.")]
    return [importlib.import_module(name) for name in names if not name.endswith(".__main__")]


def test_each_exported_name_is_listed_once_and_resolves() -> None:
    assert len(snapshotd.__all__) == len(set(snapshotd.__all__))
    for name in snapshotd.__all__:
        assert getattr(snapshotd, name) is not None, name
    assert snapshotd.__version__ == snapshotd.settings.VERSION


def test_no_module_exports_another_object_under_a_public_name() -> None:
    modules = package_modules()
    assert len(modules) > 20  # the walk reached the subpackages
    for name in snapshotd.__all__:
        if name == "__version__":  # every module has its own dunder names; this one is VERSION
            continue
        exported = getattr(snapshotd, name)
        holders = [module for module in modules if name in vars(module)]
        twins = [module.__name__ for module in holders if vars(module)[name] is not exported]
        assert holders, f"{name} is defined in no module of the package"
        assert twins == [], f"{name} names another object in {twins}"


def test_exported_classes_present_themselves_as_the_package_s() -> None:
    for name in snapshotd.__all__:
        value = getattr(snapshotd, name)
        if isinstance(value, type):
            assert value.__module__ == "snapshotd", name
