"""Import every product module from an installed (non-editable) ctxprec, outside the checkout.

Usage: WHEEL_VENV/bin/python .ci/check_wheel.py CHECKOUT
Fails when a module is missing from the install, imports from the checkout instead of
site-packages, a package folder lacks its py.typed marker or a data file it reads
(DATA_FILES: the provider registry, the sample of `ctxprec sample`, the viewer's page), or an
example config of configs/ is not shipped (equal) as pipeline/configs/ for `ctxprec config NAME`.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from pathlib import Path

# data files the product reads at run time, next to its modules
DATA_FILES = (
    ("connectors.judges", "providers.toml"),
    ("pipeline", "data/sample.parquet"),
    ("pipeline.view", "assets/index.html"),  # `ctxprec view`'s page, script and style
    ("pipeline.view", "assets/view.js"),
    ("pipeline.view", "assets/view.css"),
)


def main() -> int:
    checkout = Path(sys.argv[1]).resolve()
    sys.path = [p for p in sys.path if p and Path(p).resolve() != checkout]
    expected = {
        ".".join(p.relative_to(checkout).with_suffix("").parts).removesuffix(".__init__")
        for top in ("pipeline", "connectors", "storage")
        for p in (checkout / top).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    imported: set[str] = set()
    problems: list[str] = []
    for top in ("pipeline", "connectors", "storage"):
        pkg = importlib.import_module(top)
        where = Path(pkg.__file__ or "").resolve()
        if checkout in where.parents:
            problems.append(f"{top} imported from the checkout ({where}), not the install")
        imported.add(top)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{top}."):
            importlib.import_module(info.name)
            imported.add(info.name)
            if info.ispkg:
                folder = Path(importlib.import_module(info.name).__path__[0])
                if not (folder / "py.typed").exists():
                    problems.append(f"{info.name}: no py.typed in the install")
    for package, name in DATA_FILES:
        folder = Path(importlib.import_module(package).__path__[0])
        if not (folder / name).is_file():
            problems.append(f"{package}: no {name} in the install (package data)")
    registry = importlib.import_module("connectors.judges.catalog")
    if "groq" not in registry.builtin_providers():
        problems.append("connectors.judges.catalog: the provider registry did not load")
    shipped = Path(importlib.import_module("pipeline").__path__[0]) / "configs"
    for config in sorted((checkout / "configs").glob("*.toml")):
        copy = shipped / config.name
        if not copy.is_file() or copy.read_bytes() != config.read_bytes():
            problems.append(f"configs/{config.name}: not shipped equal as pipeline/configs/")
    missing = sorted(expected - imported)
    if missing:
        problems.append("modules not in the install: " + ", ".join(missing))
    for line in problems:
        print(f"check_wheel: {line}", file=sys.stderr)
    print(f"check_wheel: {len(imported)} modules imported from {os.path.dirname(where)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
