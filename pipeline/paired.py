"""Paired statistics of per-id differences (B − A): means, a seeded percentile bootstrap CI of
the mean difference, a sign-flip permutation test, and wins / losses / ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_RESAMPLES", "TIE_EPS", "bootstrap_ci", "paired_figures", "sign_flip_p"]

DEFAULT_RESAMPLES = 10_000
TIE_EPS = 1e-9  # scores carry two decimals: closer than this is the same score
_EXACT_MAX_N = 16  # up to 2**16 sign vectors the permutation test enumerates them all
_CELLS_PER_CHUNK = 4_000_000  # resamples x pairs held in memory at once
_MAX_DISTINCT = 5_000  # up to this many distinct differences: multinomial resampling
TEST_NAME = "paired sign-flip permutation test on the mean difference (two-sided)"

Floats = npt.NDArray[np.float64]


def bootstrap_ci(diffs: Floats, resamples: int, seed: int) -> tuple[float, float]:
    """95 % percentile interval of the mean of `diffs` resampled with replacement (pairs stay
    pairs: each resample draws whole ids). Always contains the observed mean.

    Scores and rank metrics take few distinct values, so a resample is drawn as multinomial
    counts over the distinct differences (the same distribution as drawing ids, at a cost of
    resamples x distinct values instead of resamples x pairs)."""
    n = len(diffs)
    observed = float(diffs.mean()) if n else 0.0
    if n == 0 or resamples <= 0:
        return observed, observed
    rng = np.random.default_rng(seed)
    values, counts = np.unique(diffs.round(12), return_counts=True)  # float noise apart
    if len(values) <= _MAX_DISTINCT:
        draws = rng.multinomial(n, counts / n, size=resamples)
        means = draws @ values / n
    else:
        means = _resample_ids(diffs, resamples, rng)
    lo, hi = (float(x) for x in np.percentile(means, [2.5, 97.5]))
    # float noise only: a constant difference must give [d, d] exactly, around the observed mean
    return min(lo, observed), max(hi, observed)


def _resample_ids(diffs: Floats, resamples: int, rng: np.random.Generator) -> Floats:
    """Means of `resamples` draws of len(diffs) ids with replacement, in bounded chunks."""
    n = len(diffs)
    chunk = max(1, _CELLS_PER_CHUNK // n)
    means = np.empty(resamples)
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        means[start : start + size] = diffs[rng.integers(0, n, size=(size, n))].mean(axis=1)
    return means


def sign_flip_p(diffs: Floats, resamples: int, seed: int) -> tuple[float, str]:
    """Two-sided p-value of "B and A are exchangeable per id": how often a random flip of each
    difference's sign gives a mean at least as far from zero. Exact up to 16 non-zero pairs."""
    d = diffs[np.abs(diffs) > TIE_EPS]
    if len(d) == 0:
        return 1.0, "exact"
    observed = abs(float(d.mean())) - TIE_EPS
    if len(d) <= _EXACT_MAX_N:
        grid = np.arange(2 ** len(d))[:, None] >> np.arange(len(d)) & 1
        signs = 1 - 2 * grid
        return float(np.mean(np.abs((signs * d).mean(axis=1)) >= observed)), "exact"
    rng = np.random.default_rng(seed + 1)
    values, counts = np.unique(np.abs(d).round(12), return_counts=True)
    if len(values) <= _MAX_DISTINCT:  # how many of each |difference| keep their sign
        kept = rng.binomial(counts, 0.5, size=(resamples, len(values)))
        flipped = np.abs((2 * kept - counts) @ values / len(d))
    else:
        flipped = np.empty(resamples)
        chunk = max(1, _CELLS_PER_CHUNK // len(d))
        for start in range(0, resamples, chunk):
            size = min(chunk, resamples - start)
            signs = rng.choice(np.array([-1.0, 1.0]), size=(size, len(d)))
            flipped[start : start + size] = np.abs((signs * d).mean(axis=1))
    hits = int(np.sum(flipped >= observed))
    return (hits + 1) / (resamples + 1), f"{resamples:,} random sign flips"


def paired_figures(
    a: Sequence[float], b: Sequence[float], *, resamples: int, seed: int, test: bool = True
) -> dict[str, Any]:
    """Means, mean difference (B − A), its 95 % CI, p-value (without `test`: None) and wins /
    losses / ties."""
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diffs = vb - va
    n = len(diffs)
    if n == 0:
        return {"n_pairs": 0, "mean_a": None, "mean_b": None, "mean_delta": None, "ci95": None,
                "p_value": None, "test": None, "wins": 0, "losses": 0, "ties": 0}  # fmt: skip
    mean_a, mean_b = float(va.mean()), float(vb.mean())
    lo, hi = bootstrap_ci(diffs, resamples, seed)
    mean_delta = mean_b - mean_a
    p, how = sign_flip_p(diffs, resamples, seed) if test else (None, "not run")
    return {
        "n_pairs": n,
        "mean_a": mean_a,
        "mean_b": mean_b,
        "mean_delta": mean_delta,
        "ci95": [min(lo, mean_delta), max(hi, mean_delta)],
        "p_value": p,
        "test": f"{TEST_NAME}, {how}",
        "wins": int(np.sum(diffs > TIE_EPS)),
        "losses": int(np.sum(diffs < -TIE_EPS)),
        "ties": int(np.sum(np.abs(diffs) <= TIE_EPS)),
    }
