"""Item-level agreement of two judges (or of a judge with itself): the 2×2 table of their
verdicts, raw agreement, Cohen's κ with an asymptotic and a row-clustered bootstrap 95 % CI, and
McNemar's test of whether one judge says "relevant" more often than the other (exact binomial
below 25 discordant items, else χ² with continuity correction).

Items are paired by row and position: the same item, judged twice. Both `compare` (judge against
judge) and `score --recheck` (judge against itself) report these figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ctxprec.storage.stats.kappa import cohen_kappa, kappa_asymptotic_se

__all__ = [
    "EXACT_BELOW",
    "agreement_figures",
    "cohen_kappa",
    "kappa_asymptotic_se",
    "mcnemar",
    "row_counts",
]

EXACT_BELOW = 25  # discordant items: below this McNemar's test is the exact binomial one
_Z975 = 1.959963984540054
_MAX_DISTINCT = 5_000  # distinct per-row tables resampled by multinomial counts
_CELLS_PER_CHUNK = 4_000_000

Counts = npt.NDArray[np.int64]


def row_counts(rows: Sequence[tuple[Sequence[bool | None], Sequence[bool | None]]]) -> Counts:
    """Per row, the 2×2 counts (both relevant, only A, only B, neither) of its positions judged
    on both sides. Rows whose verdict lists differ in length are not the same items: skipped."""
    out = np.zeros((len(rows), 4), dtype=np.int64)
    for r, (va, vb) in enumerate(rows):
        if len(va) != len(vb):
            continue
        for a, b in zip(va, vb, strict=True):
            if a is None or b is None:
                continue
            out[r, (0 if b else 1) if a else (2 if b else 3)] += 1
    return out


def mcnemar(only_a: int, only_b: int) -> dict[str, Any]:
    """McNemar's test on the discordant items (A relevant and B not; B relevant and A not):
    two-sided exact binomial p below 25 discordant items, else χ² (1 df) with continuity
    correction."""
    d = only_a + only_b
    if d == 0:
        return {"discordant": 0, "statistic": None, "p_value": 1.0, "method": "exact binomial"}
    if d < EXACT_BELOW:
        k = min(only_a, only_b)
        tail = sum(math.comb(d, i) for i in range(k + 1)) / 2**d
        return {"discordant": d, "statistic": float(k), "p_value": min(1.0, 2 * tail),
                "method": "exact binomial"}  # fmt: skip
    stat = (abs(only_a - only_b) - 1) ** 2 / d
    return {"discordant": d, "statistic": stat, "p_value": math.erfc(math.sqrt(stat / 2)),
            "method": "chi-square, continuity corrected"}  # fmt: skip


def _bootstrap_kappa(counts: Counts, resamples: int, seed: int) -> tuple[float, float] | None:
    """95 % percentile interval of κ over `resamples` draws of whole rows (items of one row
    share a query and a judge call, so they are not independent)."""
    used = counts[counts.sum(axis=1) > 0]
    c = len(used)
    if c == 0 or resamples <= 0:
        return None
    rng = np.random.default_rng(seed)
    values, freq = np.unique(used, axis=0, return_counts=True)
    if len(values) <= _MAX_DISTINCT:
        tables = rng.multinomial(c, freq / c, size=resamples) @ values
    else:
        tables = np.empty((resamples, 4), dtype=np.int64)
        chunk = max(1, _CELLS_PER_CHUNK // c)
        for start in range(0, resamples, chunk):
            size = min(chunk, resamples - start)
            tables[start : start + size] = used[rng.integers(0, c, size=(size, c))].sum(axis=1)
    t = tables.astype(np.float64)
    n = t.sum(axis=1)
    p_o = (t[:, 0] + t[:, 3]) / n
    p_e = (t[:, 0] + t[:, 1]) * (t[:, 0] + t[:, 2]) + (t[:, 2] + t[:, 3]) * (t[:, 1] + t[:, 3])
    p_e = p_e / (n * n)
    ok = p_e < 1
    if not ok.any():
        return None
    kappas = (p_o[ok] - p_e[ok]) / (1 - p_e[ok])
    lo, hi = (float(x) for x in np.percentile(kappas, [2.5, 97.5]))
    return lo, hi


def agreement_figures(counts: Counts, *, resamples: int, seed: int) -> dict[str, Any]:
    """Every agreement figure from per-row 2×2 counts (see `row_counts`)."""
    n11, n10, n01, n00 = (int(x) for x in counts.sum(axis=0))
    n = n11 + n10 + n01 + n00
    table = [n11, n10, n01, n00]
    cells = ("both_relevant", "only_a_relevant", "only_b_relevant", "neither_relevant")
    kappa = cohen_kappa(table)
    se = kappa_asymptotic_se(table)
    boot = _bootstrap_kappa(counts, resamples, seed)
    if boot is not None and kappa is not None:
        boot = (min(boot[0], kappa), max(boot[1], kappa))
    return {
        "items": n,
        "rows": int((counts.sum(axis=1) > 0).sum()),
        "agreement": (n11 + n00) / n if n else None,
        "cohen_kappa": kappa,
        "kappa_ci95": list(boot) if boot is not None else None,
        "kappa_ci": f"percentile bootstrap over rows, {resamples:,} resamples, seed {seed}",
        "kappa_se_asymptotic": se,
        "kappa_ci95_asymptotic": (
            None if se is None or kappa is None else [kappa - _Z975 * se, kappa + _Z975 * se]
        ),
        "table": dict(zip(cells, table, strict=True)),
        "relevant_rate_a": (n11 + n10) / n if n else None,
        "relevant_rate_b": (n11 + n01) / n if n else None,
        "flip_rate": (n10 + n01) / n if n else None,
        "mcnemar": mcnemar(n10, n01),
    }
