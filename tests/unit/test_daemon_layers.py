"""The daemon's packages form layers: no module imports (at run time) one that imports it back,
and no package reaches up into the layers above it. Imports under `if TYPE_CHECKING:` are for
annotations only and do not count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

DAEMON = Path(__file__).resolve().parents[2] / "daemon"
POLICIES = Path(__file__).resolve().parents[2] / "policies"

# Lower layers first; a package may import from its own layer and those below it only.
LAYERS = [
    {"protocol", "config", "sim_kernels", "backends", "telemetry"},
    {"resources", "sessions"},
    {"scheduling"},
    {"ops"},
    {"vgpu"},
    {"router"},
    {"main", "__main__"},
]


def _module_name(path: Path, root: Path, package: str) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([package, *parts])


def _runtime_imports(path: Path, prefix: str) -> set[str]:
    """Modules under `prefix` that `path` imports outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith(prefix))
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.AST):
                    visit([n for n in inner if isinstance(n, ast.stmt)] or
                          [s for h in inner for s in getattr(h, "body", [])])

    visit(tree.body)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p, DAEMON, "pilot.daemon"): p for p in DAEMON.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m in _runtime_imports(path, "pilot.daemon") if m in modules and m != name}
    return graph


def test_no_import_cycles() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt):], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            dfs(node)


def _layer(module: str) -> int:
    top = module.split(".")[2] if module.count(".") >= 2 else module
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def test_packages_only_import_downwards() -> None:
    wrong = [f"{m} imports {dep}" for m, deps in _graph().items() for dep in deps
             if m.count(".") >= 2 and _layer(dep) > _layer(m)]
    assert not wrong, "\n".join(sorted(wrong))


def test_policies_never_import_the_daemon() -> None:
    """Policies get plain views and return decisions: pilot.policies knows nothing of pilotd."""
    offenders = [str(p.relative_to(POLICIES)) for p in POLICIES.rglob("*.py")
                 if _runtime_imports(p, "pilot.daemon") or "pilot.daemon" in p.read_text()]
    assert not offenders
