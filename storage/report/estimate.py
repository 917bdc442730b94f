"""The corrected estimate of a summary (summary.json's `estimate`): the mean score the human
labels define over every scored row, from the judge's score of each row and the labels' score
(`label_score`) of the rows that carry labels (`--map labels=COL`, null where a row has none), by
prediction-powered inference (`storage.core.ppi`), overall and per `--group-by` group; and the
sentence people read beside the judge's own mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from storage.core.figures import counted, figure_text
from storage.core.ppi import by_group, estimate_block, ppi_fit

__all__ = ["corrected_estimate", "estimate_sentence"]

REFERENCE = "labels"


def corrected_estimate(
    lf: pl.LazyFrame, cols: set[str], scale: float, group_by: str | None
) -> dict[str, Any] | None:
    """The `estimate` block, or None when the output has no labels column or no labelled row
    among its scored rows."""
    if "label_score" not in cols:
        return None
    rows = _scores(lf, cols, scale, group_by)
    if rows.is_empty() or rows.get_column("reference").is_null().all():
        return None
    judge = rows.get_column("judge").to_numpy()
    reference = rows.get_column("reference").fill_null(np.nan).to_numpy()
    bounds = (0.0, scale if scale > 0 else 1.0)
    block = estimate_block(ppi_fit(judge, reference), REFERENCE, bounds)
    if block is None:
        return None
    if group_by is not None and "group" in rows.columns:
        block["by_group"] = {"column": group_by, "groups": by_group(rows, REFERENCE, bounds)}
    return block


def _scores(lf: pl.LazyFrame, cols: set[str], scale: float, group_by: str | None) -> pl.DataFrame:
    """One row per scored row: the judge's score, the labels' score (`label_score`, the same
    metric and scale; null on a row without labels) and the group."""
    keep = [pl.col("score").alias("judge"), pl.col("label_score").alias("reference")]
    if group_by is not None and group_by in cols:
        keep.append(pl.col(group_by).cast(pl.String).alias("group"))
    return lf.filter(pl.col("score").is_not_null()).select(keep).collect()


def estimate_sentence(estimate: Mapping[str, Any] | None) -> str | None:
    """The figure in words: "judge says 0.61; corrected for the judge's bias against 240
    labelled rows: 0.54, 95 % CI 0.50–0.58"."""
    if not estimate:
        return None
    n = counted(estimate["n_reference"], "labelled row")
    head = (
        f"judge says {figure_text(estimate['judge_mean'])}; corrected for the judge's bias "
        f"against {n}: {figure_text(estimate['mean'])}"
    )
    ci = estimate.get("ci95")
    if ci is None:
        return f"{head} (too few labelled rows for an interval: label at least 10)"
    return f"{head}, 95 % CI {figure_text(ci[0])}–{figure_text(ci[1])}"
