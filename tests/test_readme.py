"""The README's Python example runs as written (offline judge) and prints what it says."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO


def test_readme_python_example_runs_as_written() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "create_context_precision_scorer" in b)
    done = subprocess.run(
        [sys.executable, "-c", example], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "0.83"
    assert "context-precision" in lines[-1]
