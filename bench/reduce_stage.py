"""The MAP reduce stage: `ctxprec.storage.core.metric.map_stage` (Polars) vs a plain Python loop.

Both score the same verdicts (numpy-generated, ~30 % relevant, `--items` per row): the stage on a
pre-built DataFrame of one row per item (construction excluded), the loop as
`average_precision` per row over lists of bools. Both are timed best of `--repeats`; the scores
must be identical (unrounded AP exactly equal, and the rounded score equal to `map_score`).
Goals: ≥ 20 M verdicts/s and ≥ 30x the loop. Also shown: the stage with rank metrics (ks 1,3,5)
as the pipeline runs it, and (for reference, once) the loop including grouping the DataFrame
into lists.

Usage: python bench/reduce_stage.py [--quick] [--rows 1000000] [--items 10]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import _common  # noqa: F401  (puts the project root on sys.path)
import numpy as np
import polars as pl
from _common import CpuAudit, load_line, print_block, verdict, write_result

from ctxprec.storage.core.metric import average_precision, map_stage, round_half_up

GOAL_VERDICTS_PER_S = 20e6
GOAL_SPEEDUP = 30.0


def make_verdicts(rows: int, items: int, p_relevant: float, seed: int) -> np.ndarray:
    """A (rows, items) bool matrix: row r's verdicts in rank order."""
    return np.random.default_rng(seed).random((rows, items)) < p_relevant


def as_frame(matrix: np.ndarray) -> pl.DataFrame:
    """One row per judged item: row, position, relevant (each row's items contiguous, in order)."""
    rows, items = matrix.shape
    return pl.DataFrame(
        {
            "row": np.repeat(np.arange(rows, dtype=np.int64), items),
            "position": np.tile(np.arange(items, dtype=np.int64), rows),
            "relevant": matrix.reshape(-1),
        }
    )


def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """Smallest wall time of `repeats` calls, and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - started)
    return best, out


def python_loop(lists: list[list[bool]]) -> list[float]:
    return [average_precision(v) for v in lists]


def loop_from_frame(frame: pl.DataFrame) -> list[float]:
    """The loop with its input conversion: the same DataFrame grouped into lists first."""
    grouped = frame.group_by("row", maintain_order=True).agg("relevant")
    return python_loop(grouped["relevant"].to_list())


def check_identical(stage: pl.DataFrame, loop_ap: list[float], rows: int) -> tuple[bool, bool]:
    """(AP identical, rounded scores identical) between the stage and the per-row functions."""
    if stage.height != rows or stage["row"].to_list() != list(range(rows)):
        return False, False
    same_ap = stage["ap"].to_list() == loop_ap
    same_score = stage["score"].to_list() == [round_half_up(a) for a in loop_ap]
    return same_ap, same_score


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=10)
    parser.add_argument("--relevant", type=float, default=0.3, help="share of relevant items")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="smoke run: 100,000 rows")
    args = parser.parse_args(argv)
    audit = CpuAudit()  # other processes' CPU use: timing figures need an idle machine
    rows = 100_000 if args.quick else args.rows
    matrix = make_verdicts(rows, args.items, args.relevant, args.seed)
    n = matrix.size
    frame = as_frame(matrix)
    lists: list[list[bool]] = matrix.tolist()
    stage_s, stage = best_of(args.repeats, lambda: map_stage(frame))
    ranks_s, _ = best_of(args.repeats, lambda: map_stage(frame, ks=(1, 3, 5)))
    loop_s, loop_ap = best_of(args.repeats, lambda: python_loop(lists))
    convert_s, _ = best_of(1, lambda: loop_from_frame(frame))
    same_ap, same_score = check_identical(stage, loop_ap, rows)
    rate, loop_rate = n / stage_s, n / loop_s
    speedup = loop_s / stage_s
    lines = [
        f"{n:,} verdicts ({rows:,} rows x {args.items}, {matrix.mean():.1%} relevant), "
        f"best of {args.repeats}; Polars {pl.__version__}, {pl.thread_pool_size()} threads",
        f"map_stage: {stage_s:.3f} s = {rate / 1e6:.1f} M verdicts/s "
        f"(goal ≥ {GOAL_VERDICTS_PER_S / 1e6:.0f} M) {verdict(rate >= GOAL_VERDICTS_PER_S)}",
        f"python loop (average_precision per row): {loop_s:.3f} s = {loop_rate / 1e6:.2f} M "
        "verdicts/s",
        f"speed-up stage/loop: {speedup:.1f}x (goal ≥ {GOAL_SPEEDUP:.0f}x) "
        f"{verdict(speedup >= GOAL_SPEEDUP)}",
        f"identical: AP {same_ap}, rounded score {same_score}",
        f"map_stage with rank metrics (ks 1,3,5): {ranks_s:.3f} s = {n / ranks_s / 1e6:.1f} M "
        "verdicts/s",
        f"for reference, the loop including grouping the same DataFrame into lists: "
        f"{convert_s:.3f} s = {n / convert_s / 1e6:.2f} M verdicts/s; stage/that: "
        f"{convert_s / stage_s:.1f}x",
    ]
    print_block("reduce stage: map_stage vs a plain Python loop", [*lines, load_line(audit)])
    path = write_result(
        "reduce_stage",
        {
            **audit.as_dict(),
            "quick": args.quick,
            "rows": rows,
            "items": args.items,
            "verdicts": n,
            "relevant_share": float(matrix.mean()),
            "stage_s": stage_s,
            "verdicts_per_s": rate,
            "loop_s": loop_s,
            "loop_verdicts_per_s": loop_rate,
            "speedup": speedup,
            "stage_with_ranks_s": ranks_s,
            "loop_with_conversion_s": convert_s,
            "identical_ap": same_ap,
            "identical_score": same_score,
            "threads": pl.thread_pool_size(),
        },
    )
    print(f"\nresult: {path}")
    return 0 if same_ap and same_score else 1


if __name__ == "__main__":
    sys.exit(main())
