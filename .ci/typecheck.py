"""mypy on the package as shipped: `python .ci/typecheck.py [MYPY ARGS]`.

mypy names modules by their folders and cannot follow pyproject.toml's package-dir map
(pipeline/ is `ctxprec`, connectors/ and storage/ are `ctxprec.connectors` and
`ctxprec.storage`), so this lays the package out as the wheel has it, with links into the
checkout under build/typecheck/ctxprec/, runs mypy there with pyproject.toml's settings, and
prints each error with the checkout's own path (pipeline/run/driver.py, not ctxprec/run/...).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / "build" / "typecheck"
# package folder inside the staged ctxprec/ -> the checkout's folder
LINKS = {"connectors": "connectors", "storage": "storage"}


def stage() -> Path:
    package = STAGE / "ctxprec"
    if package.exists():
        shutil.rmtree(package)
    package.mkdir(parents=True)
    for entry in sorted((ROOT / "pipeline").iterdir()):
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in LINKS.items():
        (package / name).symlink_to(ROOT / folder)
    return package


def checkout_path(line: str) -> str:
    """`ctxprec/connectors/x.py:3: error` -> `connectors/x.py:3: error`."""
    if not line.startswith("ctxprec/"):
        return line
    rest = line.removeprefix("ctxprec/")
    for name, folder in LINKS.items():
        if rest.startswith(name + "/"):
            return folder + rest.removeprefix(name)
    return "pipeline/" + rest


def main() -> int:
    stage()
    mypy = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    env = {**os.environ, "MYPY_CACHE_DIR": str(STAGE / ".mypy_cache")}
    done = subprocess.run(
        [*mypy, *sys.argv[1:]], cwd=STAGE, env=env, capture_output=True, text=True, check=False
    )
    for line in done.stdout.splitlines():
        print(checkout_path(line))
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
