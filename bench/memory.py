"""Peak memory of `ctxprec score` as the input grows: offline judge, --no-memo, one fresh
process per size.

Inputs are generated Parquet files with 10 unique items of `--item-chars` characters per row, the
same item size for every size. Peak RSS is the process's ru_maxrss (os.wait4 of that pid); RSS is
also sampled from /proc every 0.2 s (VmRSS, and VmHWM, the high-water mark) to show whether it
stays flat and when the peak is reached. Goal: the largest size's peak ≤ 1.2x the smallest size's
peak. Also shown: rows/s of each run.

Usage: python bench/memory.py [--quick] [--rows 100000 1000000] [--item-chars 300]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    CpuAudit,
    check_ok,
    child_env,
    ctxprec_cmd,
    load_line,
    make_dataset,
    print_block,
    quiet_line,
    run_measured,
    verdict,
    workdir,
    write_result,
)

GOAL_RATIO = 1.2


class RssSampler:
    """Reads VmRSS of a pid from /proc at most every `every_s` seconds."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.samples: list[tuple[float, float]] = []  # (seconds since start, VmRSS MiB)
        self.hwm: list[tuple[float, float]] = []  # (seconds since start, VmHWM MiB)
        self._started = time.perf_counter()
        self._last = -float("inf")

    def __call__(self, pid: int) -> None:
        now = time.perf_counter()
        if now - self._last < self.every_s:
            return
        self._last = now
        try:
            status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
        except OSError:
            return
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                self.samples.append((now - self._started, int(line.split()[1]) / 1024))
            elif line.startswith("VmHWM:"):
                self.hwm.append((now - self._started, int(line.split()[1]) / 1024))

    def peak(self) -> tuple[float, float]:
        """(high-water mark in MiB, when it was first seen: fraction of the run)."""
        if not self.hwm:
            return 0.0, 0.0
        top = self.hwm[-1][1]
        first = next(t for t, mib in self.hwm if mib >= top)
        return top, first / max(self.hwm[-1][0], 1e-9)

    def at_fractions(self, fractions: Sequence[float]) -> list[float]:
        """RSS (MiB) at given fractions of the run, e.g. 0.25, 0.5, 0.75."""
        if not self.samples:
            return []
        return [
            self.samples[min(len(self.samples) - 1, int(f * len(self.samples)))][1]
            for f in fractions
        ]


def measure(rows: int, item_chars: int, work: Path) -> dict[str, Any]:
    """Generate the input, score it in a fresh process; peak RSS, rows/s, RSS over time."""
    data = make_dataset(work / f"rows-{rows}.parquet", rows, item_chars=item_chars)
    size_mib = data.stat().st_size / 2**20
    sampler = RssSampler(every_s=0.2)
    cmd = ctxprec_cmd(data, work / f"out-{rows}", "--model", "offline", "--no-memo")
    m = run_measured(cmd, env=child_env(), timeout_s=7200, on_poll=sampler)
    check_ok(m, f"ctxprec score ({rows:,} rows)")
    scored = quiet_line(m).get("rows", {}).get("ok")
    data.unlink()  # the big inputs are GBs: free the disk as soon as possible
    return {
        "rows": rows,
        "rows_ok": scored,
        "input_mib": size_mib,
        "maxrss_mib": m.maxrss_mib,
        "wall_s": m.wall_s,
        "rows_per_s": rows / m.wall_s,
        "items_per_s": rows * 10 / m.wall_s,
        "cpu_s": m.cpu_s,
        "rss_at_25_50_75_100_pct_mib": sampler.at_fractions((0.25, 0.5, 0.75, 1.0)),
        "hwm_mib": sampler.peak()[0],
        "hwm_reached_at": sampler.peak()[1],
    }


def report(runs: list[dict[str, Any]], item_chars: int) -> list[str]:
    base = runs[0]
    lines = [f"offline judge, --no-memo, 10 items x {item_chars} chars per row"]
    for r in runs:
        over_time = ", ".join(f"{x:.0f}" for x in r["rss_at_25_50_75_100_pct_mib"])
        lines.append(
            f"{r['rows']:>9,} rows ({r['input_mib']:,.0f} MiB Parquet): peak RSS "
            f"{r['maxrss_mib']:.0f} MiB; {r['rows_per_s']:,.0f} rows/s "
            f"({r['items_per_s']:,.0f} items/s, {r['wall_s']:.1f} s); RSS at 25/50/75/100 % of "
            f"the run: {over_time} MiB; high-water mark {r['hwm_mib']:.0f} MiB reached by "
            f"{r['hwm_reached_at']:.0%} of the run"
        )
    for r in runs[1:]:
        ratio = r["maxrss_mib"] / base["maxrss_mib"]
        lines.append(
            f"peak RSS {r['rows']:,} / {base['rows']:,} rows: {ratio:.2f}x "
            f"(goal ≤ {GOAL_RATIO}x) {verdict(ratio <= GOAL_RATIO)}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--item-chars", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="smoke run: 5,000 and 50,000 rows")
    parser.add_argument("--workdir", type=Path, help="keep outputs here (default: temp)")
    args = parser.parse_args(argv)
    audit = CpuAudit()  # other processes' CPU use: timing figures need an idle machine
    sizes = sorted([5_000, 50_000] if args.quick else args.rows)
    with workdir(args.workdir) as work:
        runs = [measure(rows, args.item_chars, work) for rows in sizes]
    print_block(
        "memory: peak RSS of ctxprec score vs input size",
        [*report(runs, args.item_chars), load_line(audit)],
    )
    ratio = runs[-1]["maxrss_mib"] / runs[0]["maxrss_mib"]
    path = write_result(
        "memory",
        {
            **audit.as_dict(),
            "quick": args.quick,
            "item_chars": args.item_chars,
            "runs": runs,
            "ratio_largest_smallest": ratio,
        },
    )
    print(f"\nresult: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
