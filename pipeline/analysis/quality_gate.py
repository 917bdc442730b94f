"""Quality gates for schedulers: `score --fail-under X` (this run's mean score below X) and the
exit code that tells a failed gate (5) from failed rows (1, which wins: failed rows are never
hidden behind a gate).
"""

from __future__ import annotations

import sys

import polars as pl

from ctxprec.storage.core.constants import STATUS_EMPTY, STATUS_OK
from ctxprec.storage.core.figures import round_figure
from ctxprec.storage.files.objpath import OutPath, local_copies
from ctxprec.storage.outdir.ownership import part_files
from ctxprec.storage.stats.paired import TIE_EPS

__all__ = ["GATE_EXIT", "below", "gate_exit", "ids_before", "run_mean", "shortfall", "under_gate"]

GATE_EXIT = 5
_SCORED = (STATUS_OK, STATUS_EMPTY)


def _rows(outdir: OutPath) -> pl.DataFrame:
    files = part_files(outdir)
    if not files:
        return pl.DataFrame(schema={"id": pl.String, "status": pl.String, "score": pl.Float64})
    with local_copies(files, outdir) as local:  # object stores: a temp copy
        scans = [pl.scan_parquet(f, hive_partitioning=False).select("id", "status", "score")
                 for f in local]  # fmt: skip
        return pl.concat(scans, how="vertical_relaxed").collect()


def ids_before(outdir: OutPath) -> pl.Series:
    """Ids already scored (ok or empty_context) in `outdir` before an incremental run."""
    rows = _rows(outdir)
    return rows.filter(pl.col("status").is_in(_SCORED)).get_column("id")


def run_mean(outdir: OutPath, before: pl.Series | None = None) -> tuple[float | None, int]:
    """(mean score, rows) over the ok and empty_context rows this run wrote: the whole output,
    or with `before` (an incremental run) only the ids that were not scored before it."""
    rows = _rows(outdir).filter(pl.col("status").is_in(_SCORED) & pl.col("score").is_not_null())
    if before is not None and before.len():
        rows = rows.filter(~pl.col("id").is_in(before.implode()))
    if rows.height == 0:
        return None, 0
    return float(rows.get_column("score").mean()), rows.height  # type: ignore[arg-type]


def below(mean: float | None, threshold: float) -> bool:
    """The gate's rule: the mean is below `threshold` (a mean equal to it, within float noise,
    passes). The Python API's thresholds (`ctxprec.analysis.verdict`) use it too."""
    return mean is not None and mean < threshold - TIE_EPS


def shortfall(mean: float, threshold: float) -> str:
    """ "0.6917, 0.0083 below the threshold": the mean as summary.md and --quiet show it, and a
    gap that adds up to it."""
    shown = round_figure(mean)
    return f"{shown:.4f}, {round_figure(threshold - shown):.4f} below the threshold"


def under_gate(mean: float | None, rows: int, threshold: float) -> str | None:
    """The failure message when the mean is below `threshold` (a mean equal to it passes)."""
    if mean is None or not below(mean, threshold):
        return None
    return (
        f"--fail-under {threshold:g} failed: the mean score of this run's {rows:,} scored rows "
        f"is {shortfall(mean, threshold)}"
    )


def gate_exit(rows_exit: int, message: str | None) -> int:
    """Print a failed gate's message; exit 5 for it, or keep 1 when rows failed too."""
    if message is None:
        return rows_exit
    if rows_exit == 1:
        print(f"ctxprec: gate failed (and rows failed, exit 1): {message}", file=sys.stderr)
        return 1
    print(f"ctxprec: gate failed (exit {GATE_EXIT}): {message}", file=sys.stderr)
    return GATE_EXIT if rows_exit == 0 else rows_exit
