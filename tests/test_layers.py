"""The house drawn from its imports: every arrow points down.

    ctxprec  ->  ctxprec.connectors  ->  ctxprec.storage  ->  ctxprec.storage.core (the leaf)

and inside storage/, room by room, each importing only the rooms after it:

    report  ->  outdir  ->  memo  ->  files  ->  stats  ->  core

(the output folder's reports, its state, the verdict memo, file access and the layout,
statistics, the leaf). Statistics import the leaf and nothing else.

(`ctxprec` is the repository's pipeline/ folder, `ctxprec.connectors` its connectors/ and
`ctxprec.storage` its storage/: pyproject.toml's package-dir.)

A module may import its own layer and the layers below it, never one above; the leaf imports no
other ctxprec package; no module imports a ctxprec module inside a function (the old way to
dodge a cycle) — `if TYPE_CHECKING:` blocks are the one exception, and they obey the layers
too. Module-level imports between ctxprec modules form no cycle.

Start-up needs one more kind of import: a module-level *table* naming modules to load on first
use (`ctxprec._EXPORTS`, PEP 562; the entry's `ctxprec.__main__._LOADS`; the CLI's subcommand
table `ctxprec.cli.main.COMMANDS`), so that `ctxprec --version` loads no Polars. A table is an
import in all but syntax, so its targets obey the layers like imports; a ctxprec module named as a
literal in an importlib call is refused."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# repository folder -> the package it is installed as
FOLDERS = {"pipeline": "ctxprec", "connectors": "ctxprec.connectors", "storage": "ctxprec.storage"}
PACKAGES = ("ctxprec",)  # the one top-level name: imports of anything else are not ctxprec's


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


# from the leaf up; ctxprec.storage's own __init__ sits with its lowest room
LAYERS = (
    "ctxprec.storage.core",
    "ctxprec.storage.stats",
    "ctxprec.storage.files",
    "ctxprec.storage.memo",
    "ctxprec.storage.outdir",
    "ctxprec.storage.report",
    "ctxprec.connectors",
)


def layer(module: str) -> int:
    """The index of the module's room in LAYERS (0 = the leaf); the rest of ctxprec
    (pipeline/) is the top."""
    if module == "ctxprec.storage":
        return 0
    for number, package in enumerate(LAYERS):
        if within(module, package):
            return number
    assert within(module, "ctxprec"), module
    return len(LAYERS)


def module_name(path: Path) -> str:
    folder, *parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join([FOLDERS[folder], *(parts[:-1] if parts[-1] == "__init__" else parts)])


def modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for folder in FOLDERS
        for p in sorted((ROOT / folder).rglob("*.py"))
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
                # `from ctxprec.storage.files import fs` imports ctxprec.storage.files.fs
                for alias in child.names:
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
    assert "ctxprec.storage.core.errors" in leaf
    outside = [
        f"{m} line {line}: {target}"
        for m in leaf
        for target, line, _ in imports(ALL[m], m)
        if layer(target) != 0
    ]
    assert outside == []


def test_statistics_import_only_the_leaf() -> None:
    stats = [m for m in ALL if within(m, "ctxprec.storage.stats")]
    assert "ctxprec.storage.stats.ppi" in stats
    outside = [
        f"{m} line {line}: {target}"
        for m in stats
        for target, line, _ in imports(ALL[m], m)
        if not (within(target, "ctxprec.storage.core") or within(target, "ctxprec.storage.stats"))
    ]
    assert outside == []


def test_storage_holds_only_its_rooms() -> None:
    """storage/ itself holds its package marker; every module lives in a room of one job."""
    direct = sorted(p.name for p in (ROOT / "storage").glob("*.py"))
    assert direct == ["__init__.py"]
    rooms = {p.name for p in (ROOT / "storage").iterdir() if (p / "__init__.py").is_file()}
    assert {r.removeprefix("ctxprec.storage.") for r in LAYERS if "storage" in r} == rooms


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
    is read as the module ctxprec.storage._layers_probe from tmp_path: nothing is written in
    the tree)."""
    bad = tmp_path / "_layers_probe.py"
    source = (
        "from ctxprec.engines.local import score\n"
        "def f():\n    from ctxprec.storage.core import errors\n"
        "from .core.errors import UserError\n"
    )
    bad.write_text(source, encoding="utf-8")
    found = list(imports(bad, "ctxprec.storage._layers_probe"))
    assert ("ctxprec.engines.local", 1, "module") in found
    assert ("ctxprec.storage.core.errors", 3, "function") in found
    assert ("ctxprec.storage.core.errors", 4, "module") in found


# module -> its table of lazily loaded names ({name: "module" or "module:attribute"})
LAZY_TABLES = {"ctxprec": "_EXPORTS", "ctxprec.__main__": "_LOADS", "ctxprec.cli.main": "COMMANDS"}


def table_of(module: str, table: str) -> dict[str, str]:
    """The literal assigned to `table` at `module`'s top level, read without importing it
    (importing ctxprec.__main__ would hold this process's stop signals)."""
    for node in ast.parse(ALL[module].read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == table and node.value is not None:
            value: dict[str, str] = ast.literal_eval(node.value)
            return value
    raise AssertionError(f"{module} has no literal {table}")


@pytest.mark.parametrize(("module", "table"), sorted(LAZY_TABLES.items()))
def test_lazy_tables_point_down_and_resolve(module: str, table: str) -> None:
    entries = table_of(module, table)
    assert entries
    for name, target in entries.items():
        target_module, _, attr = target.partition(":")
        assert target_module in ALL, (name, target)
        assert layer(target_module) <= layer(module), (name, target)
        assert hasattr(importlib.import_module(target_module), attr or name), (name, target)


def test_no_ctxprec_module_is_imported_by_a_literal_name() -> None:
    """`importlib.import_module("ctxprec.x")` outside a table would dodge every check above."""

    def by_name(path: Path) -> list[str]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        return [
            arg.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute | ast.Name)
            and getattr(n.func, "attr", getattr(n.func, "id", None))
            in ("import_module", "__import__")
            for arg in n.args[:1]
            if isinstance(arg, ast.Constant)
            and isinstance(arg.value, str)
            and arg.value.split(".")[0] in PACKAGES
        ]

    assert {m: found for m, p in ALL.items() if (found := by_name(p))} == {}


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["score", "--help"]])
def test_start_up_loads_no_heavy_library(argv: list[str]) -> None:
    """`ctxprec --version` and `--help` stay fast: no Polars, PyArrow, aiohttp, Dask, judge."""
    heavy = ["polars", "pyarrow", "aiohttp", "dask", "distributed", "numpy", "matplotlib"]
    heavy += [
        "ctxprec.connectors.judges.openai",
        "ctxprec.connectors.judges.offline",
        "ctxprec.engines.local",
    ]
    probe = (
        "import sys\n"
        "from ctxprec.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_version_through_the_console_script_loads_only_the_version() -> None:
    """`ctxprec --version` (the console script, ctxprec.__main__) answers without the parser."""
    probe = (
        "import sys\n"
        "from ctxprec.__main__ import main\n"
        "sys.argv = ['ctxprec', '--version']\n"
        "code = main()\n"
        "print(code, 'ctxprec.cli.main' in sys.modules, 'polars' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    from ctxprec.version import __version__

    assert out.stdout.splitlines() == [f"ctxprec {__version__}", "0 False False"]


def test_every_package_folder_is_shipped() -> None:
    """pyproject.toml lists the packages (setuptools cannot find them under a package-dir map):
    a package folder on disk that the list leaves out would be missing from the wheel; and each
    carries its py.typed marker (.ci/check_wheel.py refuses a wheel without)."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(setuptools["tool"]["setuptools"]["packages"])
    on_disk = {m for m, p in ALL.items() if p.name == "__init__.py"}
    assert listed == on_disk
    untyped = sorted(m for m, p in ALL.items() if p.name == "__init__.py"
                     and not (p.parent / "py.typed").is_file())  # fmt: skip
    assert untyped == [], "a package without its py.typed marker (PEP 561)"
    assert setuptools["tool"]["setuptools"]["package-dir"] == {
        package: folder for folder, package in FOLDERS.items()
    }
