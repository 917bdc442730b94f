"""Cohen's κ of a 2×2 table of verdicts and its large-sample standard error: one definition,
used by the summary (the judge against human labels) and by `ctxprec.storage.stats.agreement`
(judge against judge, the judge against itself).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["cohen_kappa", "kappa_asymptotic_se"]


def cohen_kappa(table: npt.ArrayLike) -> float | None:
    """κ of a 2×2 table [n11, n10, n01, n00]; None when chance agreement is 1 (every item in one
    class on both sides) or the table is empty."""
    n11, n10, n01, n00 = (float(x) for x in np.asarray(table, dtype=np.float64))
    n = n11 + n10 + n01 + n00
    if n == 0:
        return None
    p_o = (n11 + n00) / n
    p_e = ((n11 + n10) * (n11 + n01) + (n01 + n00) * (n10 + n00)) / (n * n)
    return None if p_e >= 1 else (p_o - p_e) / (1 - p_e)


def kappa_asymptotic_se(table: npt.ArrayLike) -> float | None:
    """Large-sample standard error of κ (Fleiss, Cohen & Everitt 1969; statsmodels'
    `cohens_kappa` std_kappa), items taken as independent."""
    kappa = cohen_kappa(table)
    if kappa is None:
        return None
    n11, n10, n01, n00 = (float(x) for x in np.asarray(table, dtype=np.float64))
    n = n11 + n10 + n01 + n00
    p = np.array([[n11, n10], [n01, n00]]) / n
    rows, cols = p.sum(axis=1), p.sum(axis=0)
    p_e = float((rows * cols).sum())
    term_a = float((np.diag(p) * (1 - (rows + cols) * (1 - kappa)) ** 2).sum())
    off = p * (cols[:, None] + rows[None, :]) ** 2
    term_b = (1 - kappa) ** 2 * float(off[0, 1] + off[1, 0])
    term_c = (kappa - p_e * (1 - kappa)) ** 2
    var = (term_a + term_b - term_c) / (1 - p_e) ** 2 / n
    return math.sqrt(max(var, 0.0))
