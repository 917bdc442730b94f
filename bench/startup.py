"""Start-up: wall time of `ctxprec --version` and `ctxprec --help`, each a fresh process.

Neither may import Polars, PyArrow, aiohttp, Dask or a judge (tests/test_layers.py checks that);
this measures what is left: the interpreter and the command-line parser. Median of `--repeat`
runs each, after one warm-up run (a cold disk cache is not the figure). Goals: --version
≤ 0.15 s, --help ≤ 0.4 s. Reference: `python -c pass` in the same venv.

Usage: python bench/startup.py [--quick] [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence

from _common import (
    CTXPREC,
    PYTHON,
    CpuAudit,
    check_ok,
    child_env,
    load_line,
    print_block,
    run_measured,
    verdict,
    write_result,
)

GOALS = {"version": 0.15, "help": 0.4}


def median_wall(cmd: list[str], repeat: int) -> float:
    run_measured(cmd, env=child_env(), timeout_s=60)  # warm-up: files in the page cache
    walls = []
    for _ in range(repeat):
        m = run_measured(cmd, env=child_env(), timeout_s=60)
        check_ok(m, " ".join(cmd[1:]) or cmd[0])
        walls.append(m.wall_s)
    return statistics.median(walls)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs of each command")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 runs each")
    args = parser.parse_args(argv)
    audit = CpuAudit()
    repeat = 2 if args.quick else args.repeat
    figures = {
        "python": median_wall([PYTHON, "-c", "pass"], repeat),
        "version": median_wall([CTXPREC, "--version"], repeat),
        "help": median_wall([CTXPREC, "--help"], repeat),
    }
    lines = [f"python -c pass: {figures['python']:.3f} s (median of {repeat})"]
    for name, goal in GOALS.items():
        ok = figures[name] <= goal
        lines.append(f"ctxprec --{name}: {figures[name]:.3f} s (goal ≤ {goal} s) {verdict(ok)}")
    print_block("start-up: ctxprec --version and --help", [*lines, load_line(audit)])
    path = write_result(
        "startup", {**audit.as_dict(), "quick": args.quick, "repeat": repeat, **figures}
    )
    print(f"\nresult: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
