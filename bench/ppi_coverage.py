"""Coverage and width of the corrected estimate's 95 % CI (storage/stats/ppi.py) on the HotpotQA
sample's human labels, against the share of rows labelled.

Each seeded world: a noisy judge flips the human verdicts item by item (misses `--miss` of the
relevant items, calls `--false` of the others relevant), both verdict lists go through the real
MAP stage (storage/core/metric.py, the stage every run uses), and a seeded random share of rows
keeps its labels. The truth is the labels' mean MAP over all rows. Prints, per share labelled:
how often the corrected CI and the judge's own CI cover the truth, and their mean widths.

Usage: python bench/ppi_coverage.py [--data PATH] [--worlds 200] [--miss 0.10] [--false 0.25]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import labelled_data  # noqa: E402
from ctxprec.storage.core.metric import map_stage  # noqa: E402
from ctxprec.storage.stats.ppi import estimate_block, ppi_fit  # noqa: E402

SHARES = (0.01, 0.02, 0.05, 0.10, 0.20)


def _items(data: Path) -> pl.DataFrame:
    """One line per (row, position) with the human label."""
    rows = pl.read_parquet(data, columns=["labels"]).with_row_index("row")
    return (
        rows.with_columns(pl.int_ranges(pl.col("labels").list.len()).alias("position"))
        .explode(["labels", "position"])
        .rename({"labels": "label"})
        .drop_nulls("position")
    )


def _scores(items: pl.DataFrame, column: str, rows: int) -> np.ndarray:
    """The MAP score of every row from `column`'s verdicts (rows without items score 0)."""
    got = map_stage(items.select("row", "position", pl.col(column).alias("relevant")))
    scores = np.zeros(rows)
    scores[got.get_column("row").to_numpy()] = got.get_column("score").to_numpy()
    return scores


def run(data: Path, worlds: int, miss: float, false: float) -> list[dict[str, float | str]]:
    items = _items(data)
    rows = int(items.get_column("row").max() or 0) + 1
    truth_scores = _scores(items, "label", rows)
    truth = float(truth_scores.mean())
    label = items.get_column("label").to_numpy()
    tally = {s: {"ppi": 0, "judge": 0, "ppi_w": 0.0, "judge_w": 0.0, "n": 0} for s in SHARES}
    bias = 0.0
    for seed in range(worlds):
        rng = np.random.default_rng(seed)
        u = rng.uniform(size=len(label))
        judged = np.where(label, u >= miss, u < false)
        judge = _scores(items.with_columns(pl.Series("judged", judged)), "judged", rows)
        bias += float(judge.mean()) - truth
        for share in SHARES:
            ref = np.full(rows, np.nan)
            keep = rng.permutation(rows)[: round(share * rows)]
            ref[keep] = truth_scores[keep]
            block = estimate_block(ppi_fit(judge, ref), "labels", (0.0, 1.0))
            t = tally[share]
            t["n"] = len(keep)
            if block is None or block["ci95"] is None:
                continue
            for name, ci in (("ppi", block["ci95"]), ("judge", block["judge_ci95"])):
                t[name] += ci[0] <= truth <= ci[1]
                t[f"{name}_w"] += ci[1] - ci[0]
    print(f"rows {rows}, labels' mean MAP {truth:.4f}, judge's mean bias {bias / worlds:+.4f}")
    out = []
    for share, t in tally.items():
        has_ci = t["n"] >= 10
        out.append(
            {
                "share": f"{share:.0%}",
                "labelled": t["n"],
                "ppi_coverage": t["ppi"] / worlds if has_ci else "no CI (< 10 rows)",
                "ppi_width": t["ppi_w"] / worlds if has_ci else "—",
                "judge_coverage": t["judge"] / worlds if has_ci else "—",
                "judge_width": t["judge_w"] / worlds if has_ci else "—",
            }
        )
    return out


def _cell(v: float | str) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=None, help="default: CTXPREC_TEST_HOTPOT")
    p.add_argument("--worlds", type=int, default=200)
    p.add_argument("--miss", type=float, default=0.10)
    p.add_argument("--false", type=float, default=0.25)
    args = p.parse_args()
    table = run(args.data or labelled_data(), args.worlds, args.miss, args.false)
    head = ["share labelled", "rows labelled", "corrected CI covers", "corrected CI width",
            "judge CI covers", "judge CI width"]  # fmt: skip
    print(f"{args.worlds} seeded worlds; judge misses {args.miss:.0%} of relevant items, calls "
          f"{args.false:.0%} of the others relevant")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r in table:
        print("| " + " | ".join(_cell(v) for v in r.values()) + " |")


if __name__ == "__main__":
    main()
