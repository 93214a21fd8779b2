"""The layers of pplan, checked: no module imports one above it, and no import cycles.

docs/architecture.md draws these layers. Imports inside functions count (a lazy import is
still a dependency); imports under `if TYPE_CHECKING:` do not (annotations only).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A module belongs to the most specific prefix that names it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("planner.errors", "planner.units", "planner.limits", "planner.textsafe", "planner.filekind", "planner.atomic", "planner.jsonio", "planner.hostinfo",
     "planner.warm_start", "planner.allocator", "planner.parallel", "planner.jsontypes", "planner.torch_compat"),
    ("planner.hardware", "planner.calibration", "planner.machine", "planner.schedules", "planner.graph.edges",
     "planner.graph.crossing", "planner.graph.layers", "planner.graph.layer_module"),
    ("planner.profiling.profile", "planner.profiling.metadata", "planner.profiling.csvio", "planner.profiling.split_times", "planner.plan",
     "planner.models.spec", "planner.models.trust"),
    ("planner.cost", "planner.cluster"),
    ("planner.simulation", "planner.simulate"),
    ("planner.partition", "planner.profiling.analytic", "planner.whatif"),
    ("planner.models", "planner.graph", "planner.profiling", "planner.master_weights"),
    ("planner.execute",),
    ("planner.report", "planner.bench"),
    ("planner.demo", "planner.demo_limit", "planner"),
    ("cli",),
)


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.glob("planner/**/*.py")) + sorted(ROOT.glob("cli/*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _layer(module: str) -> int:
    best, level = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    assert level is not None, f"{module} is in no layer of tests/test_architecture.py: add it where it belongs"
    return level


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(filter(None, (resolve(a.name) for a in node.names)))

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.module:
                found.update(filter(None, (resolve(f"{node.module}.{a.name}") for a in node.names)))

    Visitor().visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        if path.name == "__init__.py":  # a package's re-exports point down into itself
            continue
        for target in _imports(path, modules) - {name}:
            graph.add_edge(name, target)
    return graph


def test_every_module_has_a_layer() -> None:
    for module in _modules():
        _layer(module)


def test_no_module_imports_one_above_it() -> None:
    upward = [f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
              for a, b in _graph().edges if _layer(b) > _layer(a)]
    assert not upward, "\n".join(upward)


def test_no_import_cycles() -> None:
    graph = _graph()
    graph.remove_nodes_from([m for m, p in _modules().items() if p.name == "__init__.py"])
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_tests_use_only_public_names_and_no_other_test_module() -> None:
    """Tests hold the library to its public interface (a private name may change without notice),
    and share code through tests/helpers and conftest.py, never by importing another test file."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("planner", "cli"):
                found += [f"{path.name}: from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}: imports {m}" for m in modules if m.split(".")[-1].startswith("test_")]
    assert not found, "\n".join(found)


MAX_MODULE_LINES = 400  # DESIGN: modules of 40-400 lines, each owning one thing


def test_no_module_is_over_400_lines() -> None:
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in _modules().values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not long, "split these where a name would explain a part:\n" + "\n".join(long)
