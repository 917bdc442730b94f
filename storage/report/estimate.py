"""The corrected estimates of a summary (summary.json's `estimate` and `estimates`): the mean
score a reference defines over every scored row, from the judge's score of each row and the
reference's score of the rows that carry one, by prediction-powered inference
(`ctxprec.storage.stats.ppi`), overall and per `--group-by` group; and the sentence people read
beside the judge's own mean. The references: the human labels (`label_score`, `--map labels=COL`,
null where a row has none) and the audit judge (`audit_score`, `--audit-model`, null outside its
sample).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from ctxprec.storage.core.figures import counted, figure_text
from ctxprec.storage.stats.ppi import by_group, estimate_block, ppi_fit

__all__ = ["REFERENCE", "audit_reference", "corrected_estimate", "estimate_sentence"]

REFERENCE = "labels"
_AUDIT = "audit:"  # the reference of the audit judge's estimate: "audit:<model>"


def audit_reference(model: str) -> str:
    """The `reference` of the audit judge's estimate: `audit:openai/gpt-4.1`."""
    return f"{_AUDIT}{model}"


def corrected_estimate(
    lf: pl.LazyFrame,
    cols: set[str],
    scale: float,
    group_by: str | None,
    column: str = "label_score",
    reference: str = REFERENCE,
) -> dict[str, Any] | None:
    """An estimate block against the reference scores in `column`, or None when the output has
    no such column or no row with a reference score among its scored rows."""
    if column not in cols:
        return None
    rows = _scores(lf, cols, column, group_by)
    if rows.is_empty() or rows.get_column("reference").is_null().all():
        return None
    judge = rows.get_column("judge").to_numpy()
    ref_scores = rows.get_column("reference").fill_null(np.nan).to_numpy()
    bounds = (0.0, scale if scale > 0 else 1.0)
    block = estimate_block(ppi_fit(judge, ref_scores), reference, bounds)
    if block is None:
        return None
    if group_by is not None and "group" in rows.columns:
        block["by_group"] = {"column": group_by, "groups": by_group(rows, reference, bounds)}
    return block


def _scores(lf: pl.LazyFrame, cols: set[str], column: str, group_by: str | None) -> pl.DataFrame:
    """One row per scored row: the judge's score, the reference's (`column`, the same metric
    and scale; null on a row without one) and the group."""
    keep = [pl.col("score").alias("judge"), pl.col(column).alias("reference")]
    if group_by is not None and group_by in cols:
        keep.append(pl.col(group_by).cast(pl.String).alias("group"))
    return lf.filter(pl.col("score").is_not_null()).select(keep).collect()


def estimate_sentence(estimate: Mapping[str, Any] | None) -> str | None:
    """The figure in words: "judge says 0.61; corrected for the judge's bias against 240
    labelled rows: 0.54, 95 % CI 0.50–0.58" (against the audit judge: "... against 240 rows
    audited by openai/gpt-4.1: ...")."""
    if not estimate:
        return None
    reference = str(estimate.get("reference", REFERENCE))
    audit = reference.startswith(_AUDIT)
    if audit:
        n = f"{counted(estimate['n_reference'], 'row')} audited by {reference[len(_AUDIT) :]}"
    else:
        n = counted(estimate["n_reference"], "labelled row")
    head = (
        f"judge says {figure_text(estimate['judge_mean'])}; corrected for the judge's bias "
        f"against {n}: {figure_text(estimate['mean'])}"
    )
    ci = estimate.get("ci95")
    if ci is None:
        more = "raise --audit-fraction" if audit else "label at least 10"
        return f"{head} (too few {'audited' if audit else 'labelled'} rows for an interval: {more})"
    return f"{head}, 95 % CI {figure_text(ci[0])}–{figure_text(ci[1])}"
