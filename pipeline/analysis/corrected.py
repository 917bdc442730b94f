"""`compare` on corrected estimates: when both sides carry a reference (human labels,
or the same audit judge), the difference of the two sides' prediction-powered estimates over the
paired rows, with a 95 % CI that pairs the rows.

Each side's estimate is the mean of its rows' influences φ_i = λ f_i + (R_i N / n)(g_i − ḡ) + ḡ
(`ctxprec.storage.stats.ppi.row_influence`: f the judge's score, g = reference − λ f on the n rows
with a reference). The difference of the estimates is mean(φ_B − φ_A); its standard error is that of
the paired differences, clustered by query like the judge's own paired figures, so the judges' score
differences and the reference-minus-judge corrections of the same rows vary together. The
quantile is Student's t with n − 1 degrees of freedom (n the fewer reference rows of the two
sides), as for one estimate. Checked by simulation: tests/pipeline/test_compare_corrected.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from ctxprec.storage.stats.ppi import MIN_REFERENCE, cluster_se, ppi_fit, row_influence, t_quantile

__all__ = ["REFERENCE_COLUMNS", "corrected_delta", "difference_of_estimates"]

# the output columns a corrected estimate takes as its reference, in the order they are preferred
REFERENCE_COLUMNS = {"label_score": "labels", "audit_score": "audit"}


Values = Sequence[float] | npt.NDArray[np.float64]


def difference_of_estimates(
    judge_a: Values, ref_a: Values, judge_b: Values, ref_b: Values,
    clusters: Sequence[Any] | None = None,
) -> dict[str, Any] | None:  # fmt: skip
    """B's estimate minus A's over the same N paired rows (reference NaN where a row has none),
    with its 95 % CI; None without a reference row on a side."""
    fa, fb = (np.asarray(x, dtype=np.float64) for x in (judge_a, judge_b))
    ya, yb = (np.asarray(x, dtype=np.float64) for x in (ref_a, ref_b))
    fit_a, fit_b = ppi_fit(fa, ya), ppi_fit(fb, yb)
    if fit_a is None or fit_b is None:
        return None
    diffs = row_influence(fb, yb, fit_b.lam) - row_influence(fa, ya, fit_a.lam)
    n = min(fit_a.n_reference, fit_b.n_reference)
    delta = fit_b.mean - fit_a.mean
    se = cluster_se(diffs, clusters) if n >= MIN_REFERENCE else None
    q = t_quantile(n - 1) if n > 1 else float("nan")
    return {
        "mean_a": fit_a.mean,
        "mean_b": fit_b.mean,
        "mean_delta": delta,
        "ci95": None if se is None else [delta - q * se, delta + q * se],
        "se": se,
        "n_pairs": len(fa),
        "n_reference_a": fit_a.n_reference,
        "n_reference_b": fit_b.n_reference,
        "lambda_a": fit_a.lam,
        "lambda_b": fit_b.lam,
    }


def corrected_delta(
    pairs: pl.DataFrame, references: dict[str, str | None], cluster: str | None
) -> dict[str, Any] | None:
    """The `corrected` block of compare.json: the first reference column both sides carry
    (labels, then the audit judge's score) with a reference row among the pairs; None when
    there is none. `references` names each side's audit judge ({"a": model, "b": model})."""
    for column, kind in REFERENCE_COLUMNS.items():
        ca, cb = f"{column}_a", f"{column}_b"
        if ca not in pairs.columns or cb not in pairs.columns:
            continue
        ya, yb = (
            pairs.get_column(c).cast(pl.Float64).fill_null(np.nan).to_numpy() for c in (ca, cb)
        )
        if np.isnan(ya).all() or np.isnan(yb).all():
            continue
        clusters = pairs.get_column(cluster).to_list() if cluster in pairs.columns else None
        figures = difference_of_estimates(
            pairs.get_column("score_a").to_numpy(), ya, pairs.get_column("score_b").to_numpy(),
            yb, clusters,
        )  # fmt: skip
        if figures is None:
            continue
        return {"reference": _reference(kind, references), "method": _METHOD, **figures,
                **_note(kind, references, figures)}  # fmt: skip
    return None


_METHOD = ("difference of the sides' prediction-powered estimates over the paired rows; CI from "
           "the paired row influences (clustered like the score's), Student's t")  # fmt: skip


def _reference(kind: str, references: dict[str, str | None]) -> str:
    if kind == "labels":
        return "labels"
    return f"audit:{references.get('a') or references.get('b') or 'judge'}"


def _note(kind: str, references: dict[str, str | None], f: dict[str, Any]) -> dict[str, str]:
    notes = []
    if kind == "audit" and references.get("a") != references.get("b"):
        notes.append(f"the sides' audit judges differ (A {references.get('a')}, B "
                     f"{references.get('b')}): each side is corrected toward its own")  # fmt: skip
    if f["ci95"] is None:
        notes.append(f"fewer than {MIN_REFERENCE} reference rows on a side: no interval")
    return {"note": "; ".join(notes)} if notes else {}
