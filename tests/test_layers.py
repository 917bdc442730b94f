"""The house drawn from its imports: every arrow points down.

    pipeline  ->  connectors  ->  storage  ->  storage.core (the leaf)

A module may import its own layer and the layers below it, never one above; the leaf imports no
other ctxprec package; no module imports a ctxprec module inside a function (the old way to
dodge a cycle) — `if TYPE_CHECKING:` blocks are the one exception, and they obey the layers
too. Module-level imports between ctxprec modules form no cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "connectors", "storage")


def layer(module: str) -> int:
    """0 = storage.core (the leaf), 1 = storage, 2 = connectors, 3 = pipeline."""
    if module == "storage.core" or module.startswith("storage.core."):
        return 0
    return {"storage": 1, "connectors": 2, "pipeline": 3}[module.split(".")[0]]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, module: str) -> Iterator[tuple[str, int, str]]:
    """(imported ctxprec module, line, where) with where in module / type_checking / function."""
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def walk(node: ast.AST, where: str) -> Iterator[tuple[str, int, str]]:
        for child in ast.iter_child_nodes(node):
            here = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                here = "function"
            elif isinstance(child, ast.If) and _type_checking(child) and where == "module":
                here = "type_checking"
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child.lineno, here
            elif isinstance(child, ast.ImportFrom):
                target = _resolve(child, module, path.name == "__init__.py")
                yield target, child.lineno, here
                for alias in child.names:  # `from storage import fs` imports storage.fs
                    yield f"{target}.{alias.name}", child.lineno, here
            yield from walk(child, here)

    mods = modules()
    for target, line, where in walk(tree, "module"):
        if target.split(".")[0] in PACKAGES and (target in mods or target in PACKAGES):
            yield target, line, where


ALL = modules()


@pytest.mark.parametrize("module", sorted(ALL))
def test_imports_point_down(module: str) -> None:
    wrong = [
        f"line {line}: {module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for target, line, _ in imports(ALL[module], module)
        if layer(target) > layer(module)
    ]
    assert wrong == []


@pytest.mark.parametrize("module", sorted(ALL))
def test_no_function_level_project_imports(module: str) -> None:
    inside = [
        f"line {line}: {target}"
        for target, line, where in imports(ALL[module], module)
        if where == "function"
    ]
    assert inside == []


def test_leaf_imports_no_other_ctxprec_package() -> None:
    leaf = [m for m in ALL if layer(m) == 0]
    assert "storage.core.errors" in leaf
    outside = [
        f"{m} line {line}: {target}"
        for m in leaf
        for target, line, _ in imports(ALL[m], m)
        if layer(target) != 0
    ]
    assert outside == []


def test_module_imports_form_no_cycle() -> None:
    graph = {
        m: {t for t, _, where in imports(p, m) if where == "module" and t in ALL and t != m}
        for m, p in ALL.items()
    }
    # a package's __init__ importing its own submodules is how packages re-export; a submodule
    # importing its package's name only runs that __init__, so drop child -> parent edges
    for m, targets in graph.items():
        graph[m] = {t for t in targets if not m.startswith(t + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return [*stack[stack.index(t) :], t]
            if t not in state and (found := visit(t)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_checker_sees_a_wrong_arrow(tmp_path: Path) -> None:
    """The AST walk finds an upward import, a function-level one and a relative one (the probe
    is read as the module storage._layers_probe from tmp_path: nothing is written in the tree)."""
    bad = tmp_path / "_layers_probe.py"
    source = (
        "from pipeline.flow import score\n"
        "def f():\n    from storage.core import errors\n"
        "from .core.errors import UserError\n"
    )
    bad.write_text(source, encoding="utf-8")
    found = list(imports(bad, "storage._layers_probe"))
    assert ("pipeline.flow", 1, "module") in found
    assert ("storage.core.errors", 3, "function") in found
    assert ("storage.core.errors", 4, "module") in found
