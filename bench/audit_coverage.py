"""Coverage and width of the audit judge's corrected 95 % CI (`--audit-model`),
end to end through the product's own sampling, scoring and estimate code, against the fraction
of rows audited.

The strong (audit) judge's verdicts are the truth: the human labels of the HotpotQA sample, its
rows tiled `--tile` times with new ids. In each seeded world the first judge flips them item by
item (misses `--miss` of the relevant items, calls `--false` of the others relevant) and its
verdicts go through the MAP stage every run uses (storage/core/metric.py); the audit sample is
the product's own (`ctxprec.flow.audit.audited`: sha256 of `audit:{seed}:{row_id}` below F,
with the world's seed as `--audit-seed`); the audited rows' `audit_score` is `map_score` of
the strong verdicts, as the reduce stage computes it; and the estimate is the one summary.json holds
(`ctxprec.storage.report.estimate.corrected_estimate` on the `score` and `audit_score` columns). The
truth is the strong judge's mean `audit_score` over every row. Prints, per fraction audited:
how often the corrected CI and the first judge's own CI cover the truth, and their mean widths.

Usage: python bench/audit_coverage.py [--quick] [--data PATH] [--tile 4] [--worlds 200]
                                      [--miss 0.10] [--false 0.25]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import labelled_data, write_result  # noqa: E402
from ctxprec.flow.audit import audited  # noqa: E402
from ctxprec.storage.core.metric import map_score, map_stage  # noqa: E402
from ctxprec.storage.report.estimate import audit_reference, corrected_estimate  # noqa: E402

FRACTIONS = (0.02, 0.05, 0.10, 0.20)
REFERENCE = audit_reference("strong")
_COLS = {"score", "audit_score"}


@dataclass(frozen=True)
class Log:
    """The rows of a simulated log: ids, and the strong judge's verdicts item by item."""

    ids: list[str]
    verdicts: list[list[bool]]  # per row, the strong judge's verdict of each item
    strong: np.ndarray  # per row, the strong judge's audit_score (map_score, as in reduce)
    items: pl.DataFrame  # one line per (row, position): `row`, `position`, `truth`

    @classmethod
    def of(cls, ids: Sequence[str], verdicts: Sequence[Sequence[bool]]) -> Log:
        lists = [[bool(v) for v in row] for row in verdicts]
        strong = np.array([map_score(v) for v in lists], dtype=np.float64)
        rows = np.repeat(np.arange(len(lists)), [len(v) for v in lists])
        position = np.concatenate([np.arange(len(v)) for v in lists])
        truth = np.concatenate([np.array(v, dtype=bool) for v in lists])
        items = pl.DataFrame({"row": rows, "position": position, "truth": truth})
        return cls(list(ids), lists, strong, items)

    @property
    def truth(self) -> float:
        """The strong judge's mean over every row: what the corrected estimate aims at."""
        return float(self.strong.mean())


def hotpotqa(data: Path, tile: int = 1) -> Log:
    """The HotpotQA sample's rows with items, `tile` times (tile k > 0: ids `<id>~k`)."""
    frame = pl.read_parquet(data, columns=["id", "labels"]).filter(pl.col("labels").list.len() > 0)
    ids, verdicts = frame["id"].to_list(), frame["labels"].to_list()
    return Log.of([i if k == 0 else f"{i}~{k}" for k in range(tile) for i in ids], verdicts * tile)


def synthetic(rows: int, items: int = 6, relevant: float = 0.3, seed: int = 12345) -> Log:
    """`rows` rows of `items` items, each relevant with chance `relevant` (fixed by `seed`)."""
    rng = np.random.default_rng(seed)
    verdicts = (rng.uniform(size=(rows, items)) < relevant).tolist()
    return Log.of([f"row-{i:06d}" for i in range(rows)], verdicts)


def world(
    log: Log, seed: int, fractions: Sequence[float], miss: float, false: float
) -> tuple[float, dict[float, dict[str, Any] | None]]:
    """One seeded world: (the first judge's mean, the summary's audit estimate block at each
    fraction, None where no row was sampled). Audit seed = `seed`."""
    truth = log.items.get_column("truth").to_numpy()
    u = np.random.default_rng(seed).uniform(size=len(truth))
    judged = np.where(truth, u >= miss, u < false)
    got = map_stage(log.items.select("row", "position", pl.Series("relevant", judged)))
    score = np.zeros(len(log.ids))
    score[got.get_column("row").to_numpy()] = got.get_column("score").to_numpy()
    blocks: dict[float, dict[str, Any] | None] = {}
    for f in fractions:
        sampled = np.fromiter((audited(i, f, seed) for i in log.ids), bool, len(log.ids))
        lf = pl.LazyFrame(
            {"score": score, "audit_score": pl.Series(np.where(sampled, log.strong, np.nan))}
        ).with_columns(pl.col("audit_score").fill_nan(None))
        blocks[f] = corrected_estimate(lf, _COLS, 1.0, None, "audit_score", REFERENCE)
    return float(score.mean()), blocks


def coverage(
    log: Log, worlds: int, fractions: Sequence[float], miss: float, false: float
) -> dict[str, Any]:
    """Per fraction over `worlds` seeded worlds (seeds 0..worlds-1): how often each CI covers
    the truth, mean widths and audited rows; worlds without an interval (< 10 rows audited)
    count as not covered."""
    truth = log.truth
    tally = {f: {"ppi": 0, "judge": 0, "ppi_w": 0.0, "judge_w": 0.0, "n": 0, "no_ci": 0}
             for f in fractions}  # fmt: skip
    bias = 0.0
    for seed in range(worlds):
        judge_mean, blocks = world(log, seed, fractions, miss, false)
        bias += judge_mean - truth
        for f, block in blocks.items():
            t = tally[f]
            t["n"] += block["n_reference"] if block else 0
            if block is None or block["ci95"] is None:
                t["no_ci"] += 1
                continue
            for name, ci in (("ppi", block["ci95"]), ("judge", block["judge_ci95"])):
                t[name] += ci[0] <= truth <= ci[1]
                t[f"{name}_w"] += ci[1] - ci[0]
    table = []
    for f, t in tally.items():
        with_ci = worlds - t["no_ci"]
        table.append({
            "fraction": f,
            "audited_rows_mean": t["n"] / worlds,
            "worlds_without_ci": t["no_ci"],
            "ppi_coverage": t["ppi"] / worlds,
            "ppi_width": t["ppi_w"] / with_ci if with_ci else None,
            "judge_coverage": t["judge"] / worlds,
            "judge_width": t["judge_w"] / with_ci if with_ci else None,
        })  # fmt: skip
    return {"rows": len(log.ids), "truth": truth, "judge_bias": bias / worlds, "table": table}


def _cell(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 20 worlds, no tiling")
    p.add_argument("--data", type=Path, default=None, help="default: CTXPREC_TEST_HOTPOT")
    p.add_argument("--tile", type=int, default=4, help="copies of the 500 rows (default 4)")
    p.add_argument("--worlds", type=int, default=200)
    p.add_argument("--miss", type=float, default=0.10)
    p.add_argument("--false", type=float, default=0.25)
    args = p.parse_args()
    worlds, tile = (20, 1) if args.quick else (args.worlds, args.tile)
    log = hotpotqa(args.data or labelled_data(), tile)
    res = coverage(log, worlds, FRACTIONS, args.miss, args.false)
    print(
        f"{res['rows']} rows, strong judge's mean MAP {res['truth']:.4f}, first judge's mean "
        f"bias {res['judge_bias']:+.4f}; {worlds} seeded worlds; the first judge misses "
        f"{args.miss:.0%} of relevant items, calls {args.false:.0%} of the others relevant"
    )
    head = ["audit fraction", "rows audited (mean)", "worlds without CI", "corrected CI covers",
            "corrected CI width", "judge CI covers", "judge CI width"]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r in res["table"]:
        cells = [f"{r['fraction']:.0%}", f"{r['audited_rows_mean']:.1f}",
                 str(r["worlds_without_ci"]), _cell(r["ppi_coverage"]), _cell(r["ppi_width"]),
                 _cell(r["judge_coverage"]), _cell(r["judge_width"])]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    path = write_result(
        "audit_coverage",
        {"quick": args.quick, "worlds": worlds, "tile": tile, "miss": args.miss,
         "false": args.false, **res},
    )  # fmt: skip
    print(f"result: {path}")


if __name__ == "__main__":
    main()
