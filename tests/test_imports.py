"""The rooms' import rules, checked by walking every import in gateway/ and plugins/ (see docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for top in ("gateway", "plugins") for p in (ROOT / top).rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, top_level_only: bool, type_checking: bool = False) -> set[str]:
    """Modules of ours that `module` imports (at run time; with `type_checking`, also for type checkers)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    is_package = MODULES[module].name == "__init__.py"
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = module.split(".") if is_package else module.split(".")[:-1]
                    package = package[: len(package) - node.level + 1]
                    base = ".".join([*package, base] if base else package)
                submodules = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES}
                found.update(submodules)
                if len(submodules) < len(node.names):  # names defined in `base` itself
                    found.add(base)
            if top_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    visit([c for c in children if isinstance(c, ast.stmt)])
                    visit([s for h in children if isinstance(h, ast.ExceptHandler) for s in h.body])

    visit(tree.body)
    return {name for name in found if name in MODULES}


def test_no_import_cycles() -> None:
    """Not at run time (imports inside functions count: they run too), and not for a type checker either
    (TYPE_CHECKING imports count)."""
    graph = {m: _imports(m, top_level_only=False, type_checking=True) - {m} for m in MODULES}
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module)


def test_gateway_never_imports_plugins() -> None:
    bad = {
        m: sorted(i for i in _imports(m, False) if i.startswith("plugins")) for m in MODULES if m.startswith("gateway")
    }
    assert not {m: v for m, v in bad.items() if v}


def test_no_plugin_imports_another_or_the_proxy() -> None:
    problems = []
    for module in MODULES:
        if not module.startswith("plugins."):
            continue
        own = module.split(".")[1]
        for imported in _imports(module, False):
            if imported.startswith("plugins.") and imported.split(".")[1] != own:
                problems.append(f"{module} imports {imported} (another plugin)")
            if imported.startswith(("gateway.proxy", "gateway.cli")):
                problems.append(f"{module} imports {imported} (plugins use the plugin API and services only)")
    assert not problems, problems


def test_the_walk_sees_imports() -> None:
    """The checks above are only as good as the walk: it must see what a module really imports."""
    assert "gateway.proxy.upstream" in _imports("gateway.proxy.routing", True)
    assert "gateway.compat" in _imports("gateway.proxy.upstream", True)  # `from gateway import compat`
    assert "gateway.proxy.server" not in _imports("gateway.plugin", False)  # under TYPE_CHECKING only
    assert "gateway.cli.serve" in _imports("gateway.cli", False)  # a lazy import inside main()
