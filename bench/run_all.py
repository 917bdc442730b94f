"""Run every benchmark at modest sizes (about 10 minutes on 2 cores) and rewrite the table
of figures in docs/performance.md (| benchmark | figure | goal | result | command |) from this
run's results.

Each benchmark runs as its own process (its figures stream to stdout as it goes) and writes
bench/results/<name>.json plus a private copy in bench/results/run_all-<time>-<pid>/, which the
table is built from (another session running a benchmark meanwhile cannot swap the figures);
run_all.json there records the commands, exit codes and durations. The table replaces the lines
between docs/performance.md's `<!-- bench-table:start ... -->` and `<!-- bench-table:end -->`
markers and nothing else. Only a full run that succeeded writes that page: `--quick` and
`--only` runs (and runs where a benchmark failed) print the table, unless `--readme FILE`
names the file to write.

Usage: python bench/run_all.py [--print] [--quick] [--only NAME ...] [--readme FILE]
       python bench/run_all.py --from-results bench/results/run_all-... [--print]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from _common import BENCH, PYTHON, RESULTS, ROOT, wait_for_idle
from readme_table import Ran, block, write_block

README = ROOT / "docs" / "performance.md"  # the page that holds the table

# name -> arguments of the modest run (the scripts' own defaults where they fit the budget)
PLAN: dict[str, list[str]] = {
    "reduce_stage": [],
    "warm_rerun": [],
    "throughput": [],
    "memory": ["--rows", "20000", "200000"],
    "rate_limit": [],
    "dask_scaling": ["--rows", "500"],
    "startup": [],
    "dask_backfill": [],
}


def shown(name: str, args: Sequence[str]) -> str:
    return shlex.join(["python", f"bench/{name}.py", *args])


def run_one(name: str, args: list[str], wait_idle_s: float, private: Path) -> Ran:
    """Run bench/<name>.py ARGS with inherited stdout. Waits first (up to `wait_idle_s`) until
    other processes leave the CPUs alone."""
    cmd = [PYTHON, str(BENCH / f"{name}.py"), *args]
    busy = wait_for_idle(timeout_s=wait_idle_s)
    note = f" (warning: other processes keep {busy:.1f} cores busy)" if busy > 0.3 else ""
    print(f"\n### {shown(name, args)}{note}", flush=True)
    started = time.perf_counter()
    env = os.environ | {"BENCH_RESULTS_DIR": str(private)}
    code = subprocess.run(cmd, cwd=ROOT, check=False, env=env).returncode
    return Ran(name, shown(name, args), code, time.perf_counter() - started)


def record(private: Path, ran: list[Ran], finished: str, quick: bool) -> None:
    """run_all.json beside the run's results: what --from-results reads back."""
    private.mkdir(parents=True, exist_ok=True)
    payload = {
        "finished": finished,
        "machine": machine(),
        "quick": quick,
        "ran": [
            {"name": r.name, "command": r.command, "exit_code": r.exit_code, "seconds": r.seconds}
            for r in ran
        ],
    }
    (private / "run_all.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def recorded(folder: Path) -> tuple[list[Ran], str, str]:
    """(benchmarks, finished, machine) of a results folder. A folder without run_all.json (an
    older run, or results gathered by hand) gives each benchmark of PLAN that has a result."""
    meta = folder / "run_all.json"
    if meta.is_file():
        data = json.loads(meta.read_text(encoding="utf-8"))
        return [Ran(**r) for r in data["ran"]], data["finished"], data["machine"]
    ran, stamps = [], []
    for name, args in PLAN.items():
        path = folder / f"{name}.json"
        if path.is_file():
            result = json.loads(path.read_text(encoding="utf-8"))
            ran.append(Ran(name, shown(name, ["--quick"] if result.get("quick") else args)))
            stamps.append(str(result.get("finished_at", "")))
    return ran, _stamp(max(stamps, default="")), machine()


def _stamp(iso: str) -> str:
    """A result's finished_at ('2026-11-30T21:40:12+0000') as '2026-11-30 21:40 UTC'."""
    try:
        when = dt.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        return "at an unknown time"
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def partial(ran: Sequence[Ran]) -> bool:
    """A smoke run, or not every benchmark of the plan: figures that do not belong on the
    performance page."""
    names = [r.name for r in ran]
    return sorted(names) != sorted(PLAN) or any("--quick" in r.command.split() for r in ran)


def machine() -> str:
    cpus = os.cpu_count()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return f"{cpus} CPUs, Python {platform.python_version()}"
    return f"{cpus} CPUs, {mem:.0f} GiB, Python {platform.python_version()}"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument("--only", nargs="+", choices=list(PLAN), help="run only these")
    parser.add_argument(
        "--print",
        "--no-write",
        dest="print_only",
        action="store_true",
        help="print the table only; write no page",
    )
    parser.add_argument(
        "--readme",
        type=Path,
        help="the file whose marked table to replace (default docs/performance.md, full runs only)",
    )
    parser.add_argument(
        "--from-results",
        type=Path,
        metavar="DIR",
        help="run nothing: build the table from a run's saved results (bench/results/run_all-*)",
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=300.0,
        help="before each benchmark, wait up to this many seconds for other processes to go idle",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.from_results:
        folder = args.from_results
        if not folder.is_dir():
            print(f"run_all: no results folder {folder}", file=sys.stderr)
            return 2
        ran, finished, host = recorded(folder)
    else:
        folder = RESULTS / time.strftime(f"run_all-%Y%m%d-%H%M%S-{os.getpid()}")
        ran = [
            run_one(name, ["--quick"] if args.quick else bench_args, args.wait_idle, folder)
            for name, bench_args in PLAN.items()
            if not args.only or name in args.only
        ]
        finished, host = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine()
        record(folder, ran, finished, args.quick)
    failed = [r.name for r in ran if r.exit_code != 0]
    text = block(ran, folder, host, finished)
    print(f"\n## Benchmark results ({folder})\n\n{text}\n")
    if args.print_only:
        return 1 if failed else 0
    target = args.readme or README
    smoke = partial(ran)
    if args.readme is None and (smoke or failed):
        why = "a --quick run or not every benchmark" if smoke else "a benchmark failed"
        print(f"docs/performance.md left as it is ({why}); --readme FILE writes another file")
    else:
        changed = write_block(target, text)
        print(f"{target}: table {'rewritten' if changed else 'unchanged'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
