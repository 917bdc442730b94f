"""Paired statistics of per-id differences (B − A): means, a seeded percentile bootstrap CI of
the mean difference (pairs resampled one by one, or whole clusters of pairs that share a query),
a sign-flip permutation test (per pair or per cluster), Cohen's d_z, the smallest difference the
comparison could detect (80 % power), a non-inferiority test against a margin, and wins / losses
/ ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "TIE_EPS",
    "bootstrap_ci",
    "bootstrap_means",
    "cluster_bootstrap_means",
    "paired_figures",
    "sign_flip_p",
]

TIE_EPS = 1e-9  # scores carry two decimals: closer than this is the same score
_EXACT_MAX_N = 16  # up to 2**16 sign vectors the permutation test enumerates them all
_CELLS_PER_CHUNK = 4_000_000  # resamples x pairs held in memory at once
_MAX_DISTINCT = 5_000  # up to this many distinct differences: multinomial resampling
TEST_NAME = "paired sign-flip permutation test on the mean difference (two-sided)"
_Z975, _Z80 = 1.959963984540054, 0.8416212335729143  # two-sided 5 %, 80 % power

Floats = npt.NDArray[np.float64]


def bootstrap_ci(diffs: Floats, resamples: int, seed: int) -> tuple[float, float]:
    """95 % percentile interval of the mean of `diffs` resampled with replacement (pairs stay
    pairs: each resample draws whole ids). Always contains the observed mean."""
    return _percentile_ci(bootstrap_means(diffs, resamples, seed), diffs)


def _percentile_ci(means: Floats, diffs: Floats) -> tuple[float, float]:
    observed = float(diffs.mean()) if len(diffs) else 0.0
    if len(means) == 0:
        return observed, observed
    lo, hi = (float(x) for x in np.percentile(means, [2.5, 97.5]))
    # float noise only: a constant difference must give [d, d] exactly, around the observed mean
    return min(lo, observed), max(hi, observed)


def bootstrap_means(diffs: Floats, resamples: int, seed: int) -> Floats:
    """Means of `diffs` over `resamples` draws of len(diffs) ids with replacement.

    Scores and rank metrics take few distinct values, so a resample is drawn as multinomial
    counts over the distinct differences (the same distribution as drawing ids, at a cost of
    resamples x distinct values instead of resamples x pairs)."""
    n = len(diffs)
    if n == 0 or resamples <= 0:
        return np.empty(0)
    rng = np.random.default_rng(seed)
    values, counts = np.unique(diffs.round(12), return_counts=True)  # float noise apart
    if len(values) <= _MAX_DISTINCT:
        draws = rng.multinomial(n, counts / n, size=resamples)
        means: Floats = draws @ values / n
        return means
    return _resample_ids(diffs, resamples, rng)


def cluster_bootstrap_means(
    diffs: Floats, clusters: npt.NDArray[np.int64], resamples: int, seed: int
) -> Floats:
    """Means of `diffs` over `resamples` draws of whole clusters with replacement (as many
    clusters as there are): pairs that share a query are resampled together, so their
    correlation widens the interval as it should. Each resample's mean is over its pairs."""
    if len(diffs) == 0 or resamples <= 0:
        return np.empty(0)
    _, codes = np.unique(clusters, return_inverse=True)
    parts = np.stack(
        [np.bincount(codes, weights=diffs), np.bincount(codes).astype(np.float64)], axis=1
    )  # per cluster: sum of differences, pairs
    c = len(parts)
    rng = np.random.default_rng(seed)
    values, counts = np.unique(parts.round(12), axis=0, return_counts=True)
    if len(values) <= _MAX_DISTINCT:
        sums = rng.multinomial(c, counts / c, size=resamples) @ values
    else:
        sums = np.empty((resamples, 2))
        chunk = max(1, _CELLS_PER_CHUNK // (2 * c))
        for start in range(0, resamples, chunk):
            size = min(chunk, resamples - start)
            sums[start : start + size] = parts[rng.integers(0, c, size=(size, c))].sum(axis=1)
    means: Floats = sums[:, 0] / sums[:, 1]
    return means


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
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int,
    seed: int,
    test: bool = True,
    clusters: Sequence[int] | None = None,
    margin: float | None = None,
) -> dict[str, Any]:
    """Means, mean difference (B − A), its 95 % CI, p-value (without `test`: None), wins /
    losses / ties, Cohen's d_z, the bootstrap standard error and the smallest difference
    detectable with 80 % power. With `clusters` (one code per pair) the bootstrap and the
    sign-flip test work on whole clusters; with `margin` a non-inferiority test is added."""
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diffs = vb - va
    n = len(diffs)
    if n == 0:
        return {"n_pairs": 0, "mean_a": None, "mean_b": None, "mean_delta": None, "ci95": None,
                "p_value": None, "test": None, "wins": 0, "losses": 0, "ties": 0,
                "cohens_dz": None, "se": None, "mde_80": None}  # fmt: skip
    mean_a, mean_b = float(va.mean()), float(vb.mean())
    codes = None if clusters is None else np.asarray(clusters, dtype=np.int64)
    if codes is None:
        means = bootstrap_means(diffs, resamples, seed)
    else:
        means = cluster_bootstrap_means(diffs, codes, resamples, seed)
    lo, hi = _percentile_ci(means, diffs)
    mean_delta = mean_b - mean_a
    if not test:
        p, how = None, "not run"
    elif codes is None:
        p, how = sign_flip_p(diffs, resamples, seed)
    else:  # flip whole clusters: their sums carry the signs (same mean up to a constant)
        _, inverse = np.unique(codes, return_inverse=True)
        sums = np.bincount(inverse, weights=diffs).astype(np.float64)
        p, how = sign_flip_p(sums, resamples, seed)
        how += ", flipping whole clusters"
    se = float(means.std(ddof=1)) if len(means) > 1 else None
    sd = float(diffs.std(ddof=1)) if n > 1 else 0.0
    out: dict[str, Any] = {
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
        # effect size as MLflow's compare_evaluations gives it: mean difference / its SD
        "cohens_dz": mean_delta / sd if sd > TIE_EPS else None,
        "se": se,
        # the smallest true difference found (two-sided 5 %) 80 % of the time at this size
        "mde_80": None if se is None else (_Z975 + _Z80) * se,
    }
    if codes is not None:
        iid = sd / np.sqrt(n) if n > 1 else 0.0
        out["clusters"] = len(np.unique(codes))
        out["design_effect"] = (se / iid) ** 2 if se is not None and iid > TIE_EPS else None
    if margin is not None:
        out["non_inferiority"] = non_inferiority(means, out["ci95"], margin)
    return out


def non_inferiority(means: Floats, ci95: Sequence[float], margin: float) -> dict[str, Any]:
    """Is B no worse than A by more than `margin`? Shown when the lower end of the 95 % CI of
    B − A is above −margin (a one-sided test at 2.5 %); `p_value` is the bootstrap share of
    resampled mean differences at or below −margin (about 0.025 at the boundary)."""
    lower = float(ci95[0])
    p = float(np.mean(means <= -margin + TIE_EPS)) if len(means) else None
    return {
        "margin": margin,
        "lower_bound": lower,
        "non_inferior": lower > -margin + TIE_EPS,
        "p_value": p,
        "test": "B − A above −margin: lower end of the 95% CI (one-sided 2.5%)",
    }
