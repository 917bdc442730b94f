"""Import every product module from an installed (non-editable) ctxprec, outside the checkout.

Usage: WHEEL_VENV/bin/python .ci/check_wheel.py CHECKOUT
Fails when a module is missing from the install, imports from the checkout instead of
site-packages, a package folder lacks its py.typed marker or a data file it reads
(DATA_FILES: the provider registry, the sample of `ctxprec sample`, the viewer's page), an
example config of configs/ is not shipped (equal) as ctxprec/configs/ for `ctxprec config NAME`,
or the distribution installs a top-level name other than `ctxprec` (and its dist-info).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
from importlib import metadata
from pathlib import Path

# repository folder -> the package it is installed as (pyproject.toml's package-dir)
FOLDERS = {"pipeline": "ctxprec", "connectors": "ctxprec.connectors", "storage": "ctxprec.storage"}

# data files the product reads at run time, next to its modules
DATA_FILES = (
    ("ctxprec.connectors.judges", "providers.toml"),
    ("ctxprec", "data/sample.parquet"),
    ("ctxprec.view", "assets/index.html"),  # `ctxprec view`'s page, script and style
    ("ctxprec.view", "assets/view.js"),
    ("ctxprec.view", "assets/view.css"),
)


def expected_modules(checkout: Path) -> set[str]:
    found = set()
    for folder, package in FOLDERS.items():
        for p in (checkout / folder).rglob("*.py"):
            if "__pycache__" in p.parts:
                continue
            parts = p.relative_to(checkout / folder).with_suffix("").parts
            found.add(".".join([package, *parts]).removesuffix(".__init__"))
    return found


def top_level_names() -> set[str]:
    """What the distribution put at the top of site-packages (scripts and data aside)."""
    names = set()
    for file in metadata.files("ctxprec") or []:
        top = file.parts[0]
        if top != ".." and not top.endswith((".dist-info", ".data")):
            names.add(top)
    return names


def main() -> int:
    checkout = Path(sys.argv[1]).resolve()
    sys.path = [p for p in sys.path if p and Path(p).resolve() != checkout]
    imported: set[str] = set()
    problems: list[str] = []
    pkg = importlib.import_module("ctxprec")
    where = Path(pkg.__file__ or "").resolve()
    if checkout in where.parents:
        problems.append(f"ctxprec imported from the checkout ({where}), not the install")
    imported.add("ctxprec")
    for info in pkgutil.walk_packages(pkg.__path__, prefix="ctxprec."):
        if info.name == "ctxprec.__main__":
            continue  # the command's entry: importing it would hold this process's signals
        importlib.import_module(info.name)
        imported.add(info.name)
        if info.ispkg:
            folder = Path(importlib.import_module(info.name).__path__[0])
            if not (folder / "py.typed").exists():
                problems.append(f"{info.name}: no py.typed in the install")
    if importlib.util.find_spec("ctxprec.__main__") is not None:
        imported.add("ctxprec.__main__")
    for package, name in DATA_FILES:
        folder = Path(importlib.import_module(package).__path__[0])
        if not (folder / name).is_file():
            problems.append(f"{package}: no {name} in the install (package data)")
    registry = importlib.import_module("ctxprec.connectors.judges.catalog")
    if "groq" not in registry.builtin_providers():
        problems.append("ctxprec.connectors.judges.catalog: the provider registry did not load")
    shipped = Path(pkg.__path__[0]) / "configs"
    for config in sorted((checkout / "configs").glob("*.toml")):
        copy = shipped / config.name
        if not copy.is_file() or copy.read_bytes() != config.read_bytes():
            problems.append(f"configs/{config.name}: not shipped equal as ctxprec/configs/")
    missing = sorted(expected_modules(checkout) - imported)
    if missing:
        problems.append("modules not in the install: " + ", ".join(missing))
    if (tops := top_level_names()) != {"ctxprec"}:
        problems.append(f"top-level names installed: {sorted(tops)} (only ctxprec is ours)")
    for line in problems:
        print(f"check_wheel: {line}", file=sys.stderr)
    print(f"check_wheel: {len(imported)} modules imported from {os.path.dirname(where)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
