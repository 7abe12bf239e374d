"""The package's shape: no import circle, each room importing only what lies below or beside it, small modules, types that check.

Imports are read from the source (module level and inside functions, since a
lazy import closes a circle just as well), so the test needs no import of the
package itself.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "snapshotd"
MAX_LINES = 400
LARGER: dict[str, int] = {}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(path, package): path for path in sorted(package.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {target for target in targets if target in known and target != name}
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    found = modules(package)
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 30 and "snapshotd.engine.core" in graph
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_imports_in_functions_and_relative_imports_are_edges(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import leaf\n")
    (package / "sub" / "leaf.py").write_text("def later():\n    from pkg import top\n")
    (package / "top.py").write_text("from .sub.leaf import later\nimport pkg.sub\n")
    graph = import_graph(package)
    assert graph["pkg.sub.leaf"] == {"pkg", "pkg.top"}
    assert graph["pkg.top"] == {"pkg.sub", "pkg.sub.leaf"}
    assert graph["pkg.sub"] == {"pkg.sub.leaf"}
    assert circles(graph) == [["pkg.sub", "pkg.sub.leaf", "pkg.top"]]


def test_no_module_is_larger_than_its_limit() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    too_large = {name: size for name, size in sizes.items() if size > LARGER.get(name, MAX_LINES)}
    assert too_large == {}


BELOW_THE_SOCKET = ("capture", "engine", "git", "restore", "store")
"""Rooms the socket dispatches to or that they use."""

FRONTS = ("cli", "agents", "ui")
"""What people and agent tools run: each reaches the daemon through ``snapshotd.client``."""

MAY_NOT_IMPORT: dict[str, tuple[str, ...]] = {
    **{room: ("server", "client", *FRONTS) for room in BELOW_THE_SOCKET},
    "server": ("client", *FRONTS),
    "client": ("server", *FRONTS),
    "agents": ("server", "cli", "ui"),
    "ui": ("server", "cli", "agents"),
}
"""Which rooms each room may not import: the socket's two ends meet only in ``snapshotd.contract``."""


def room_of(name: str) -> str:
    return name.split(".")[1] if name.count(".") else ""


def layering_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Each import across a line of :data:`MAY_NOT_IMPORT`, and of anything but errors from contract."""
    found = []
    for name, targets in sorted(graph.items()):
        room = room_of(name)
        for target in sorted(targets):
            if target.count(".") and room_of(target) in MAY_NOT_IMPORT.get(room, ()):
                found.append(f"{name} imports {target}")
            if room == "contract" and not target.startswith(("snapshotd.contract", "snapshotd.errors")):
                found.append(f"{name} imports {target}")
    return found


def test_rooms_import_only_below_or_beside_them() -> None:
    graph = import_graph()
    assert {"snapshotd.contract.framing", "snapshotd.client.rpc", "snapshotd.client.launcher"} <= set(graph)
    assert layering_breaches(graph) == []


def test_the_layering_check_finds_a_breach() -> None:
    graph = {
        "snapshotd.engine.core": {"snapshotd.server.dispatch", "snapshotd.contract.refs"},
        "snapshotd.store.diff": {"snapshotd.server", "snapshotd.client.rpc"},
        "snapshotd.contract.refs": {"snapshotd.contract.params", "snapshotd.errors", "snapshotd.engine.reads"},
        "snapshotd.client.rpc": {"snapshotd.contract.framing", "snapshotd.server.listener"},
        "snapshotd.agents.mcp": {"snapshotd.client.launcher", "snapshotd.cli.output"},
        "snapshotd.server.connection": {"snapshotd.contract.peers", "snapshotd.agents.jsonlite"},
        "snapshotd.cli.main": {"snapshotd.client.rpc", "snapshotd.agents.mcp", "snapshotd.ui.app"},
        "snapshotd.ui.timeline": {"snapshotd.cli.turns", "snapshotd.turns", "snapshotd.wording"},
    }
    assert layering_breaches(graph) == [
        "snapshotd.agents.mcp imports snapshotd.cli.output",
        "snapshotd.client.rpc imports snapshotd.server.listener",
        "snapshotd.contract.refs imports snapshotd.engine.reads",
        "snapshotd.engine.core imports snapshotd.server.dispatch",
        "snapshotd.server.connection imports snapshotd.agents.jsonlite",
        "snapshotd.store.diff imports snapshotd.client.rpc",
        "snapshotd.store.diff imports snapshotd.server",
        "snapshotd.ui.timeline imports snapshotd.cli.turns",
    ]


def test_the_package_type_checks() -> None:
    """mypy, as ``[tool.mypy]`` in pyproject.toml configures it, finds nothing (its cache makes a rerun quick)."""
    if importlib.util.find_spec("mypy") is None:
        if os.environ.get("CI"):
            raise AssertionError("mypy is not installed: ./scripts/setup installs it with the test tools")
        pytest.skip("mypy is not installed here (./scripts/setup installs it)")
    root = PACKAGE.parent
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(root / ".mypy_cache")],
        cwd=root, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
