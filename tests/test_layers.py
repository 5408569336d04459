"""The package graph has layers: no import reaches up, components never import each other.

Bottom to top: ``kvcast`` (the contracts every part shares); the components ``refswitch``,
``poolnode``, ``hostagent`` and ``controlplane`` (each imports only ``kvcast``, never another
component, and never ``kvcast.tools``, which serves builds, tests and the emulation);
``emulation`` and ``fuzz``; ``experiments``; ``benchmarks``. Every import counts, also one inside
a function. The files of one package import each other without a cycle (imports made only for
type checking are left out: they do not run). The controller, the pool node and the reference
switch import without torch (only the host agent's tensors need it).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYER = {
    "kvcast": 0,
    "refswitch": 1, "poolnode": 1, "hostagent": 1, "controlplane": 1,
    "emulation": 2, "fuzz": 2,
    "experiments": 3,
    "benchmarks": 4,
}  # fmt: skip
COMPONENTS = {name for name, layer in LAYER.items() if layer == 1}


def _modules() -> dict[str, Path]:
    out = {}
    for package in LAYER:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path, *, runtime_top_level_only: bool = False) -> set[str]:
    """Absolute module names a file imports (every import, or only those run at import time)."""
    tree = ast.parse(path.read_text())
    nodes: list[ast.AST] = []
    if runtime_top_level_only:
        for node in tree.body:
            is_type_checking = (
                isinstance(node, ast.If)
                and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"
            )
            if not is_type_checking:
                nodes.extend(ast.walk(node))
    else:
        nodes = list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


MODULES = _modules()


def test_the_layering_check_sees_the_packages() -> None:
    assert {"kvcast.wire", "controlplane.daemon", "hostagent.fetch"} <= set(MODULES)


@pytest.mark.parametrize("package", sorted(LAYER))
def test_no_import_reaches_a_higher_layer_or_a_peer_component(package: str) -> None:
    wrong = []
    for name, path in MODULES.items():
        if name.split(".")[0] != package:
            continue
        for imported in _imports(path):
            top = imported.split(".")[0]
            if top not in LAYER or top == package:
                continue
            if LAYER[top] > LAYER[package] or (package in COMPONENTS and top in COMPONENTS):
                wrong.append(f"{path.relative_to(REPO)} imports {imported}")
            elif package in COMPONENTS and imported.startswith("kvcast.tools"):
                wrong.append(f"{path.relative_to(REPO)} imports the tool {imported}")
    assert not wrong, "\n".join(sorted(wrong))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of a directed graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_no_file_cycle_at_import_time() -> None:
    graph = {
        name: {
            target
            for imported in _imports(path, runtime_top_level_only=True)
            for target in (imported, imported.rsplit(".", 1)[0])
            if target in MODULES and target != name and not name.startswith(target + ".")
        }
        for name, path in MODULES.items()
    }
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_controller_pool_node_and_switch_run_without_torch() -> None:
    # Only the host agent needs torch (its tensors); pyproject lists it for the host agent only.
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any import of torch now fails
        "import controlplane.__main__, controlplane.daemon, controlplane.chunksource\n"
        "import controlplane.fabric, controlplane.pusher, poolnode.__main__, refswitch.__main__\n"
        "import kvcast.fetch\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert got.returncode == 0, got.stderr
    blocked = "import sys; sys.modules['torch'] = None\nimport hostagent.fetch\n"
    got = subprocess.run(
        [sys.executable, "-c", blocked], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert got.returncode != 0 and "torch" in got.stderr  # the check sees a torch import
