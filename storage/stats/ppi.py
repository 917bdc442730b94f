"""Corrected estimates (prediction-powered inference, PPI): the mean score a reference (human
labels, a stronger judge) would give over every row, from the judge's scores on all N rows and
the reference on a random sample of n of them, with a 95 % CI; PPI++'s power tuning; the same
per group and for the difference of two outputs. Pure functions over NumPy / Polars columns.

    estimate = λ · mean_N(judge) + mean_n(reference − λ · judge)
    variance = var_N(λ · judge) / N + var_n(reference − λ · judge) / n
    95 % CI  = estimate ± t(0.975, n − 1) · sqrt(variance)

λ = 1 is plain PPI (Angelopoulos et al., Science 2023); PPI++ (Angelopoulos, Duchi, Zrnic 2023)
picks λ = cov_n(reference, judge) / ((1 + n/N) · var_N(judge)), clipped to [0, 1], which
minimises that variance. The interval holds when the n rows are a random sample of the N. Two
small-sample choices, measured by bench/ppi_coverage.py: the variances divide by n − 1 and the
quantile is Student's t with n − 1 degrees of freedom (the papers' normal quantile and divisor n
covered 0.84-0.90 with 10 labelled rows, these 0.94-0.97), and λ is tuned only from
MIN_TUNING reference rows on (tuned on 25-50 rows the interval covered 0.90-0.93).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

__all__ = [
    "MIN_REFERENCE",
    "MIN_TUNING",
    "Z95",
    "PpiFit",
    "by_group",
    "cluster_se",
    "estimate_block",
    "judge_interval",
    "power_tuning",
    "ppi_fit",
    "ppi_mean",
    "ppi_se",
    "row_influence",
    "t_quantile",
]

Floats = npt.NDArray[np.float64]
Z95 = 1.959963984540054  # two-sided 95 %, normal
MIN_REFERENCE = 10  # fewer reference rows: a point estimate, no interval (the normal
# approximation of the correction's mean is not to be trusted on a handful of rows)
MIN_TUNING = 100  # reference rows from which PPI++'s λ is tuned (below: λ = 1, plain PPI)


@dataclass(frozen=True, slots=True)
class PpiFit:
    """One corrected estimate: the mean, its standard error, λ, and the judge's own mean."""

    mean: float
    se: float | None  # None: too few reference rows for an interval
    quantile: float  # t(0.975, n - 1): the interval is mean ± quantile · se
    lam: float
    n_reference: int
    n_rows: int
    judge_mean: float
    judge_se: float


def power_tuning(y: Floats, f_lab: Floats, f_all: Floats) -> float:
    """PPI++'s λ for a mean: cov(y, f) on the labelled rows over (1 + n/N) var(f) on all rows,
    clipped to [0, 1] (1 = plain PPI, 0 = the reference's own mean). 1 when the judge is
    constant (λ then changes nothing but the correction's spread) or n < 2."""
    n, big_n = len(y), len(f_all)
    var_f = float(f_all.var())
    if n < 2 or var_f <= 0:
        return 1.0
    cov = float(np.mean((y - y.mean()) * (f_lab - f_lab.mean())))
    return float(np.clip(cov / ((1 + n / big_n) * var_f), 0.0, 1.0))


def ppi_mean(y: Floats, f_lab: Floats, f_all: Floats, lam: float = 1.0) -> float:
    """λ · mean(judge over all rows) + mean(reference − λ · judge over the labelled rows)."""
    return float(lam * f_all.mean() + (y - lam * f_lab).mean())


def ppi_se(y: Floats, f_lab: Floats, f_all: Floats, lam: float = 1.0, ddof: int = 1) -> float:
    """sqrt(var(λ · judge, all N rows) / N + var(reference − λ · judge, n rows) / n); with
    ddof=0 the variances divide by N and n, as in ppi-python."""
    var_f = (lam * f_all).var(ddof=ddof) if len(f_all) > ddof else 0.0
    var_g = (y - lam * f_lab).var(ddof=ddof) if len(y) > ddof else 0.0
    return float(np.sqrt(var_f / len(f_all) + var_g / len(y)))


def t_quantile(df: float) -> float:
    """Student's t 97.5 % quantile (two-sided 95 %) by its Cornish-Fisher expansion in 1/df
    (Hill 1970): within 3e-4 of the exact value at df = 5, 1e-5 at df = 9, 1e-7 at df = 24."""
    z, v = Z95, float(df)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(t / v ** (i + 1) for i, t in enumerate(terms))


def ppi_fit(judge: Floats, reference: Floats, *, tune: bool = True) -> PpiFit | None:
    """The estimate from the judge's score of every row and the reference's (NaN where a row has
    none). λ is tuned (PPI++) from MIN_TUNING reference rows on when that narrows the interval,
    else 1. None without a judged row or a reference row."""
    f_all = np.asarray(judge, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    has = ~np.isnan(ref)
    y, f_lab = ref[has], f_all[has]
    if len(f_all) == 0 or len(y) == 0:
        return None
    lam = 1.0
    if tune and len(y) >= MIN_TUNING:
        tuned = power_tuning(y, f_lab, f_all)
        if ppi_se(y, f_lab, f_all, tuned) < ppi_se(y, f_lab, f_all, 1.0):
            lam = tuned
    se = ppi_se(y, f_lab, f_all, lam) if len(y) >= MIN_REFERENCE else None
    judge_mean, judge_se = judge_interval(f_all)
    mean = ppi_mean(y, f_lab, f_all, lam)
    q = t_quantile(len(y) - 1) if len(y) > 1 else float("nan")
    return PpiFit(mean, se, q, lam, len(y), len(f_all), judge_mean, judge_se)


def judge_interval(f_all: Floats) -> tuple[float, float]:
    """The judge's own mean over every row and its standard error (as if the judge were right:
    the interval a report gives when it takes the judge's mean for the truth)."""
    var = f_all.var(ddof=1) if len(f_all) > 1 else 0.0
    return float(f_all.mean()), float(np.sqrt(var / len(f_all)))


def _ci(mean: float, se: float | None, q: float, bounds: tuple[float, float]) -> list[float] | None:
    """mean ± q · se, within the score's range (a mean of scores cannot leave it)."""
    if se is None:
        return None
    lo, hi = bounds
    return [max(lo, mean - q * se), min(hi, mean + q * se)]


def estimate_block(
    fit: PpiFit | None, reference: str, bounds: tuple[float, float]
) -> dict[str, Any] | None:
    """summary.json's `estimate`: the output contract's keys (method, reference, mean, ci95,
    n_reference, n_rows, judge_mean, judge_ci95), then lambda, se and a note when the reference
    rows are too few for an interval."""
    if fit is None:
        return None
    block: dict[str, Any] = {
        "method": "ppi",
        "reference": reference,
        "mean": fit.mean,
        "ci95": _ci(fit.mean, fit.se, fit.quantile, bounds),
        "n_reference": fit.n_reference,
        "n_rows": fit.n_rows,
        "judge_mean": fit.judge_mean,
        "judge_ci95": _ci(fit.judge_mean, fit.judge_se, Z95, bounds),
        "lambda": fit.lam,
        "se": fit.se,
    }
    if fit.se is None:
        block["note"] = (
            f"{fit.n_reference} reference rows: fewer than {MIN_REFERENCE}, so no interval "
            + ("(label more rows)" if reference == "labels" else "(audit more rows)")
        )
    return block


def by_group(
    frame: pl.DataFrame, reference: str, bounds: tuple[float, float]
) -> dict[str, dict[str, Any]]:
    """{group: estimate block} for every group of `frame` (columns group, judge, reference) that
    has a reference row."""
    out: dict[str, dict[str, Any]] = {}
    for (name, *_), part in frame.partition_by("group", as_dict=True).items():
        ref = part.get_column("reference").cast(pl.Float64).fill_null(np.nan).to_numpy()
        if np.isnan(ref).all():
            continue
        judge = part.get_column("judge").cast(pl.Float64).to_numpy()
        block = estimate_block(ppi_fit(judge, ref), reference, bounds)
        if block is not None:
            out[str(name)] = block
    return out


def row_influence(judge: Floats, reference: Floats, lam: float) -> Floats:
    """Each row's share of the estimate, φ_i = λ f_i + (R_i N / n)(g_i − ḡ) + ḡ with
    g = reference − λ f on the n reference rows (R_i = 1) and ḡ their mean: mean(φ) is the
    estimate, and var(φ) / N is var(λ f) / N + var(g) / n plus their small covariance (the
    labelled rows are among the N). Two outputs' φ differenced row by row give a paired
    interval for the difference of their estimates."""
    f = np.asarray(judge, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    has = ~np.isnan(ref)
    g = ref[has] - lam * f[has]
    g_mean = float(g.mean()) if len(g) else 0.0
    phi = lam * f + g_mean
    phi[has] += (len(f) / max(len(g), 1)) * (g - g_mean)
    return phi


def cluster_se(diffs: Floats, clusters: Sequence[int] | None = None) -> float:
    """Standard error of mean(diffs): sqrt(var / N), or with clusters the sandwich
    sqrt(Σ_c (Σ_{i in c} (d_i − d̄))²) / N (rows that share a query vary together)."""
    d = np.asarray(diffs, dtype=np.float64)
    centred = d - d.mean()
    if clusters is None:
        return float(np.sqrt(np.mean(centred**2) / len(d)))
    _, codes = np.unique(np.asarray(clusters), return_inverse=True)
    sums = np.bincount(codes, weights=centred)
    return float(np.sqrt(np.sum(sums**2)) / len(d))
