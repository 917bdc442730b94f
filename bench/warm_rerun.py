"""Warm re-run speed: the same input scored twice with the offline judge and one memo folder.

Run 1 (cold) fills a fresh --cache-dir; run 2 (warm) writes a new OUTDIR with the same cache, so
every verdict is a memo hit. Figures: items/s of each run, from the subprocess's wall time (start-up
included) and from the run's own OUTDIR/_ctxprec/run.json (wall_s), plus its memo_hits; the
warm/cold speed-up. Goal: warm ≥ 50,000 items/s.

Usage: python bench/warm_rerun.py [--quick] [--rows 20000] [--item-chars N]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    CpuAudit,
    check_ok,
    child_env,
    ctxprec_cmd,
    dataset_items,
    load_line,
    make_dataset,
    print_block,
    quiet_line,
    run_measured,
    verdict,
    workdir,
    write_result,
)

GOAL_ITEMS_PER_S = 50_000


def scored_run(data: Path, outdir: Path, cache: Path, items: int) -> dict[str, Any]:
    """One `ctxprec score --model offline --cache-dir CACHE`; process and run.json figures."""
    cmd = ctxprec_cmd(data, outdir, "--model", "offline", "--cache-dir", str(cache))
    m = run_measured(cmd, env=child_env(), timeout_s=3600)
    check_ok(m, "ctxprec score")
    run = json.loads((outdir / "_ctxprec" / "run.json").read_text(encoding="utf-8"))
    return {
        "items": items,
        "process_wall_s": m.wall_s,
        "items_per_s": items / m.wall_s,
        "run_wall_s": run["wall_s"],
        "run_items_per_s": items / run["wall_s"],
        "memo_hits": run["memo_hits"],
        "judge_calls": run["judge_calls"],
        "cpu_s": m.cpu_s,
        "maxrss_mib": m.maxrss_mib,
        "score_mean": quiet_line(m).get("score_mean"),
    }


def report(cold: dict[str, Any], warm: dict[str, Any], rows: int) -> list[str]:
    ok = warm["items_per_s"] >= GOAL_ITEMS_PER_S
    return [
        f"input: {rows:,} rows, {warm['items']:,} unique items; offline judge",
        f"cold run: {cold['items_per_s']:,.0f} items/s ({cold['process_wall_s']:.2f} s wall); "
        f"run.json: {cold['run_items_per_s']:,.0f} items/s ({cold['run_wall_s']:.2f} s), "
        f"judge_calls {cold['judge_calls']:,}, memo_hits {cold['memo_hits']:,}",
        f"warm run: {warm['items_per_s']:,.0f} items/s ({warm['process_wall_s']:.2f} s wall) "
        f"(goal ≥ {GOAL_ITEMS_PER_S:,}) {verdict(ok)}",
        f"  run.json: {warm['run_items_per_s']:,.0f} items/s ({warm['run_wall_s']:.2f} s), "
        f"memo_hits {warm['memo_hits']:,}, judge_calls {warm['judge_calls']:,}",
        f"warm/cold speed-up: {warm['items_per_s'] / cold['items_per_s']:.1f}x (process wall), "
        f"{warm['run_items_per_s'] / cold['run_items_per_s']:.1f}x (run.json)",
        f"CPU: cold {cold['cpu_s']:.1f} s, warm {warm['cpu_s']:.1f} s; peak RSS: cold "
        f"{cold['maxrss_mib']:.0f} MiB, warm {warm['maxrss_mib']:.0f} MiB",
        f"same mean score both runs: {cold['score_mean'] == warm['score_mean']}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="rows of 10 items each")
    parser.add_argument("--item-chars", type=int, help="fixed item length (default: HotpotQA's)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,000 rows")
    parser.add_argument("--workdir", type=Path, help="keep inputs/outputs here (default: temp)")
    args = parser.parse_args(argv)
    audit = CpuAudit()  # other processes' CPU use: timing figures need an idle machine
    rows = 2_000 if args.quick else args.rows
    with workdir(args.workdir) as work:
        data = make_dataset(work / f"rows-{rows}.parquet", rows, item_chars=args.item_chars)
        items = dataset_items(data)
        cache = work / "memo"
        cold = scored_run(data, work / "out-cold", cache, items)
        warm = scored_run(data, work / "out-warm", cache, items)
    if warm["memo_hits"] != items or warm["judge_calls"] != 0:
        raise SystemExit(f"warm run was not all memo hits: {warm}")
    print_block(
        "warm re-run: offline judge, same memo", [*report(cold, warm, rows), load_line(audit)]
    )
    path = write_result(
        "warm_rerun",
        {
            **audit.as_dict(),
            "quick": args.quick,
            "rows": rows,
            "cold": cold,
            "warm": warm,
        },
    )
    print(f"\nresult: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
