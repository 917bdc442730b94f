"""Run every benchmark with modest defaults (about 6-9 minutes on 2 cores) and print one Markdown
table for the README: | benchmark | figure | goal | result | command |.

Each benchmark runs as its own process (its figures stream to stdout as it goes) and writes
bench/results/<name>.json plus a private copy in bench/results/run_all-<time>-<pid>/, which the
table is built from (another session running a benchmark meanwhile cannot swap the figures).
`--quick` passes --quick to every benchmark (a smoke run of about 3 minutes, dominated by the
rate-limit run).

Usage: python bench/run_all.py [--quick] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import BENCH, PYTHON, RESULTS, ROOT, wait_for_idle

Row = tuple[str, str, str, str]  # benchmark, figure, goal, result

# name -> arguments of the modest run (the scripts' own defaults where they fit the budget)
PLAN: dict[str, list[str]] = {
    "reduce_stage": [],
    "warm_rerun": [],
    "throughput": [],
    "memory": ["--rows", "20000", "200000"],
    "rate_limit": [],
}


def _pf(ok: bool) -> str:
    return "✅" if ok else "❌"


def _throughput(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for x in r["results"]:
        c, b, n = x["ctxprec"], x["bare"], x["concurrency"]
        rows.append(
            (
                "throughput",
                f"calls/s ctxprec ÷ bare aiohttp loop, {n} in flight",
                "≥ 0.95",
                f"{_pf(x['ratio'] >= 0.95)} {x['ratio']:.3f} ({c['calls_per_s']:.0f} vs "
                f"{b['calls_per_s']:.0f} calls/s; ideal {x['ideal_calls_per_s']:.0f}; "
                f"{x['calls']:,} calls)",
            )
        )
    for x in r["results"]:
        c, b, n = x["ctxprec"], x["bare"], x["concurrency"]
        ms = c["client_cpu_ms_per_call"]
        rows.append(
            (
                "throughput",
                f"client CPU per judge call, {n} in flight",
                "≤ 1.5 ms",
                f"{_pf(ms <= 1.5)} {ms:.2f} ms (bare loop {b['client_cpu_ms_per_call']:.2f} ms)",
            )
        )
    return rows


def _warm(r: dict[str, Any]) -> list[Row]:
    w, c = r["warm"], r["cold"]
    return [
        (
            "warm_rerun",
            f"items/s of a re-run, all memo hits ({w['items']:,} items)",
            "≥ 50,000",
            f"{_pf(w['items_per_s'] >= 50_000)} {w['items_per_s']:,.0f} (run.json "
            f"{w['run_items_per_s']:,.0f}; cold run {c['items_per_s']:,.0f})",
        )
    ]


def _reduce(r: dict[str, Any]) -> list[Row]:
    same = r["identical_ap"] and r["identical_score"]
    return [
        (
            "reduce_stage",
            f"map_stage verdicts/s ({r['verdicts'] / 1e6:.0f} M verdicts)",
            "≥ 20 M",
            f"{_pf(r['verdicts_per_s'] >= 20e6)} {r['verdicts_per_s'] / 1e6:.1f} M",
        ),
        (
            "reduce_stage",
            "map_stage ÷ Python loop (average_precision per row)",
            "≥ 30x",
            f"{_pf(r['speedup'] >= 30)} {r['speedup']:.1f}x (loop "
            f"{r['loop_verdicts_per_s'] / 1e6:.1f} M/s; identical scores: {same})",
        ),
    ]


def _memory(r: dict[str, Any]) -> list[Row]:
    lo, hi = r["runs"][0], r["runs"][-1]
    ratio = r["ratio_largest_smallest"]
    return [
        (
            "memory",
            f"peak RSS {hi['rows']:,} ÷ {lo['rows']:,} rows (offline, --no-memo)",
            "≤ 1.2x",
            f"{_pf(ratio <= 1.2)} {ratio:.2f}x ({hi['maxrss_mib']:.0f} vs {lo['maxrss_mib']:.0f} "
            f"MiB; {hi['rows_per_s']:,.0f} rows/s)",
        )
    ]


def _rate(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    runs, rpm = r["runs"], r["rpm"]
    if "configured" in runs and "error" not in runs["configured"]:
        a = runs["configured"]
        rows.append(
            (
                "rate_limit",
                f"429s with --rpm {rpm} (server limit {rpm}/min)",
                "0",
                f"{_pf(a['rejected_429'] == 0)} {a['rejected_429']} (accepted "
                f"{a['accepted_per_min']:.0f}/min over {a['span_s']:.0f} s)",
            )
        )
    if "adaptive" in runs and "error" not in runs["adaptive"]:
        b = runs["adaptive"]
        ratio = b["ratio_after_first"] or 0.0
        rows.append(
            (
                "rate_limit",
                "adaptive (no --rpm): accepted/min after the first minute ÷ R",
                "≥ 0.9",
                f"{_pf(ratio >= 0.9)} {ratio:.3f} ({b['rejected_429']} 429s; "
                f"{b['span_s']:.0f} s run)",
            )
        )
    return rows


ROWS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "throughput": _throughput,
    "warm_rerun": _warm,
    "reduce_stage": _reduce,
    "memory": _memory,
    "rate_limit": _rate,
}


def run_one(
    name: str, args: list[str], wait_idle_s: float, private: Path
) -> tuple[int, float, str]:
    """Run bench/<name>.py ARGS with inherited stdout; (exit code, seconds, command shown).
    Waits first (up to `wait_idle_s`) until other processes leave the CPUs alone."""
    cmd = [PYTHON, str(BENCH / f"{name}.py"), *args]
    shown = shlex.join(["python", f"bench/{name}.py", *args])
    busy = wait_for_idle(timeout_s=wait_idle_s)
    note = f" (warning: other processes keep {busy:.1f} cores busy)" if busy > 0.3 else ""
    print(f"\n### {shown}{note}", flush=True)
    started = time.perf_counter()
    env = os.environ | {"BENCH_RESULTS_DIR": str(private)}
    code = subprocess.run(cmd, cwd=ROOT, check=False, env=env).returncode
    return code, time.perf_counter() - started, shown


def table(done: dict[str, tuple[int, float, str]], private: Path) -> list[str]:
    """The Markdown table, from this run's own copies of the result files."""
    lines = ["| benchmark | figure | goal | result | command |", "|---|---|---|---|---|"]
    for name, (code, _, shown) in done.items():
        path = private / f"{name}.json"
        if code != 0 or not path.is_file():
            lines.append(f"| {name} | (failed: exit {code}) | | | `{shown}` |")
            continue
        result = json.loads(path.read_text(encoding="utf-8"))
        others = float(result.get("other_cores_during", 0.0))
        noisy = f" ⚠ other processes used {others:.1f} cores meanwhile" if others > 0.3 else ""
        for bench, figure, goal, value in ROWS[name](result):
            lines.append(f"| {bench} | {figure} | {goal} | {value}{noisy} | `{shown}` |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument("--only", nargs="+", choices=list(PLAN), help="run only these")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=300.0,
        help="before each benchmark, wait up to this many seconds for other processes to go idle",
    )
    args = parser.parse_args(argv)
    started = time.time()
    private = RESULTS / time.strftime(f"run_all-%Y%m%d-%H%M%S-{os.getpid()}")
    done: dict[str, tuple[int, float, str]] = {}
    for name, bench_args in PLAN.items():
        if args.only and name not in args.only:
            continue
        bench_args = ["--quick"] if args.quick else bench_args
        done[name] = run_one(name, bench_args, args.wait_idle, private)
    total = time.time() - started
    print("\n## Benchmark results\n")
    print("\n".join(table(done, private)))
    took = ", ".join(f"{n} {s:.0f} s" for n, (_, s, _) in done.items())
    print(f"\n(total {total / 60:.1f} min: {took}; machine: {_machine()})")
    return 0 if all(code == 0 for code, _, _ in done.values()) else 1


def _machine() -> str:
    cpus = os.cpu_count()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return f"{cpus} CPUs, Python {platform.python_version()}"
    return f"{cpus} CPUs, {mem:.0f} GiB, Python {platform.python_version()}"


if __name__ == "__main__":
    sys.exit(main())
