"""The corrected estimate (storage/stats/ppi.py) against the papers' formulas written out here,
against ppi-python (an independent implementation), and by simulation: a judge that flips a
known share of verdicts, 5 % of rows labelled, 200 seeded runs."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from ppi_py import ppi_mean_ci, ppi_mean_pointestimate
from scipy import stats

from ctxprec.storage.stats.ppi import (
    MIN_REFERENCE,
    MIN_TUNING,
    Z95,
    by_group,
    cluster_se,
    estimate_block,
    power_tuning,
    ppi_fit,
    ppi_se,
    row_influence,
    t_quantile,
)

# fixed data: 12 judged rows, the reference on 7 of them (NaN elsewhere)
JUDGE = np.array([0.5, 1.0, 0.0, 0.33, 0.83, 1.0, 0.58, 0.0, 1.0, 0.5, 0.25, 0.7])
REF = np.array([0.33, 1.0, 0.5, np.nan, 0.5, np.nan, 1.0, 0.0, np.nan, np.nan, 0.0, np.nan])


def _labelled(judge: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    has = ~np.isnan(ref)
    return ref[has], judge[has]


def test_plain_ppi_is_the_papers_formula() -> None:
    """θ = mean_N(f) + mean_n(Y − f); CI θ ± t(n−1) sqrt(s²_f / N + s²_{Y−f} / n), written
    out (s² with divisor N − 1 and n − 1)."""
    fit = ppi_fit(JUDGE, REF, tune=False)
    assert fit is not None
    assert fit.lam == 1.0
    assert fit.n_reference == 7
    assert fit.n_rows == 12
    y, f = _labelled(JUDGE, REF)
    assert fit.mean == pytest.approx(sum(JUDGE) / 12 + sum(y - f) / 7, abs=1e-12)
    assert fit.se is None  # 7 < MIN_REFERENCE: no interval
    judge, ref = np.tile(JUDGE, 2), np.tile(REF, 2)  # 14 reference rows of 24
    y, f = _labelled(judge, ref)
    n, big_n = len(y), len(judge)
    theta = sum(judge) / big_n + sum(y - f) / n
    rect = y - f
    var_f = sum((judge - sum(judge) / big_n) ** 2) / (big_n - 1)
    var_r = sum((rect - sum(rect) / n) ** 2) / (n - 1)
    half = stats.t.ppf(0.975, n - 1) * (var_f / big_n + var_r / n) ** 0.5
    fit = ppi_fit(judge, ref, tune=False)
    assert fit is not None
    assert fit.se is not None
    assert fit.mean == pytest.approx(theta, abs=1e-12)
    block = estimate_block(fit, "labels", (0.0, 1.0))
    assert block is not None
    assert block["ci95"] == pytest.approx([theta - half, theta + half], abs=1e-6)


@pytest.mark.parametrize("df", [9, 13, 24, 99, 199, 10_000])
def test_t_quantile_is_students(df: int) -> None:
    assert t_quantile(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-5)


def test_power_tuning_is_ppi_plus_plus_lambda() -> None:
    """λ = cov_n(Y, f) / ((1 + n/N) var_N(f)), clipped to [0, 1] (PPI++ eq. for the mean)."""
    y, f = _labelled(JUDGE, REF)
    n, big_n = len(y), len(JUDGE)
    cov = sum((y - y.mean()) * (f - f.mean())) / n
    lam = cov / ((1 + n / big_n) * JUDGE.var())
    assert 0 < lam < 1
    assert power_tuning(y, f, JUDGE) == pytest.approx(lam, abs=1e-12)
    assert power_tuning(y, f + 0.1, JUDGE + 0.1) == pytest.approx(lam, abs=1e-12)  # shift
    assert power_tuning(y, 1 - f, 1 - JUDGE) == 0.0  # anti-correlated judge: clipped to 0
    assert power_tuning(y, f * 0 + 0.5, JUDGE * 0 + 0.5) == 1.0  # constant judge


@pytest.mark.parametrize("lam", [1.0, 0.37, 0.0])
def test_matches_ppi_python_at_a_given_lambda(lam: float) -> None:
    judge, ref = np.tile(JUDGE, 3), np.tile(REF, 3)
    y, f = _labelled(judge, ref)
    theirs = float(ppi_mean_pointestimate(y, f, judge, lam=lam)[0])
    lo, hi = (float(v[0]) for v in ppi_mean_ci(y, f, judge, alpha=0.05, lam=lam))
    fit = ppi_fit(judge, ref, tune=False)
    assert fit is not None
    assert fit.se is not None
    phi = row_influence(judge, ref, lam)  # the same estimate through each row's share
    assert float(phi.mean()) == pytest.approx(theirs, abs=1e-12)
    half = Z95 * ppi_se(y, f, judge, lam, ddof=0)  # ppi-python: normal quantile, divisor n
    assert (theirs - half, theirs + half) == pytest.approx((lo, hi), abs=1e-12)
    if lam == 1.0:
        assert fit.mean == pytest.approx(theirs, abs=1e-12)


def test_tuned_estimate_matches_ppi_python() -> None:
    """ppi-python tunes λ with the judge's variance pooled over its labelled and unlabelled
    arrays; given all N rows as the unlabelled array it counts the n labelled rows twice in that
    variance, so its λ differs from ours by O(n/N): equal to 1e-3 at n/N = 1/20. Its interval
    uses the normal quantile and divisor n; ours t(n − 1) and n − 1 (0.6 % wider at n = 200)."""
    rng = np.random.default_rng(7)
    big_n = 4000
    truth = rng.uniform(0, 1, big_n).round(2)
    judge = np.clip(truth * 0.5 + 0.3 + rng.normal(0, 0.25, big_n), 0, 1).round(2)
    ref = np.where(rng.uniform(size=big_n) < 0.05, truth, np.nan)
    y, f = _labelled(judge, ref)
    fit = ppi_fit(judge, ref)
    assert fit is not None
    assert fit.se is not None
    assert 0 < fit.lam < 1
    assert len(y) >= MIN_TUNING
    theirs = float(ppi_mean_pointestimate(y, f, judge)[0])
    lo, hi = (float(v[0]) for v in ppi_mean_ci(y, f, judge, alpha=0.05))
    block = estimate_block(fit, "labels", (0.0, 1.0))
    assert block is not None
    assert fit.mean == pytest.approx(theirs, abs=1e-3)
    assert block["ci95"] == pytest.approx([lo, hi], abs=1e-3)
    # at our λ ppi-python gives our estimate and (normal, divisor n) interval exactly
    exact = float(ppi_mean_pointestimate(y, f, judge, lam=fit.lam)[0])
    lo, hi = (float(v[0]) for v in ppi_mean_ci(y, f, judge, alpha=0.05, lam=fit.lam))
    half = Z95 * ppi_se(y, f, judge, fit.lam, ddof=0)
    assert fit.mean == pytest.approx(exact, abs=1e-12)
    assert (fit.mean - half, fit.mean + half) == pytest.approx((lo, hi), abs=1e-12)


def test_lambda_is_tuned_only_from_min_tuning_rows() -> None:
    rng = np.random.default_rng(3)
    truth = rng.uniform(0, 1, 2000).round(2)
    judge = np.clip(truth * 0.5 + 0.3 + rng.normal(0, 0.25, 2000), 0, 1).round(2)
    few = np.where(np.arange(2000) < MIN_TUNING - 1, truth, np.nan)
    enough = np.where(np.arange(2000) < MIN_TUNING, truth, np.nan)
    small, big = ppi_fit(judge, few), ppi_fit(judge, enough)
    assert small is not None
    assert small.lam == 1.0
    assert big is not None
    assert 0 < big.lam < 1


def test_estimate_block_keys_and_the_too_few_note() -> None:
    block = estimate_block(ppi_fit(JUDGE, REF), "labels", (0.0, 1.0))
    assert block is not None
    assert list(block)[:8] == ["method", "reference", "mean", "ci95", "n_reference", "n_rows",
                               "judge_mean", "judge_ci95"]  # fmt: skip
    assert block["method"] == "ppi"
    assert block["reference"] == "labels"
    assert block["ci95"] is None
    assert "fewer than 10" in block["note"]
    lo, hi = block["judge_ci95"]
    assert 0 <= lo < block["judge_mean"] < hi <= 1
    assert estimate_block(ppi_fit(JUDGE, np.full(12, np.nan)), "labels", (0.0, 1.0)) is None


def test_by_group_skips_groups_without_reference_rows() -> None:
    frame = pl.DataFrame(
        {
            "group": ["a"] * 30 + ["b"] * 5 + ["c"] * 4,
            "judge": np.tile(JUDGE, 4)[:39],
            "reference": [*np.tile(REF, 3)[:30], 0.5, None, 1.0, None, 0.0, *[None] * 4],
        }
    )
    got = by_group(frame, "labels", (0.0, 1.0))
    assert set(got) == {"a", "b"}
    assert got["a"]["ci95"] is not None
    assert got["a"]["n_reference"] == 18
    assert got["b"]["ci95"] is None
    assert got["b"]["n_reference"] == 3


def test_cluster_se_without_clusters_and_with_singletons_agree() -> None:
    d = np.tile(JUDGE, 2)
    assert cluster_se(d) == pytest.approx(cluster_se(d, list(range(len(d)))), abs=1e-15)
    assert cluster_se(d, [i % 12 for i in range(24)]) > cluster_se(d)  # copies vary together


# -- simulation: a judge that flips a known share of verdicts -------------------------------


def _map(v: np.ndarray) -> np.ndarray:
    """MAP per row of a (rows, items) bool matrix, rounded half up to 2 decimals."""
    ranks = np.arange(1, v.shape[1] + 1)
    precision = np.cumsum(v, axis=1) / ranks
    hits = v.sum(axis=1)
    ap = np.where(hits > 0, (precision * v).sum(axis=1) / np.maximum(hits, 1), 0.0)
    return np.floor((ap + 2.220446049250313e-16) * 100 + 0.5) / 100


def _one_world(seed: int, rows: int, share: float) -> tuple[float, dict[str, list[float]]]:
    """One seeded log: true labels, a judge that misses 35 % of relevant items and calls 10 % of
    the others relevant, labels kept on `share` of the rows. (true mean, both intervals)."""
    rng = np.random.default_rng(seed)
    truth = rng.uniform(size=(rows, 6)) < 0.3
    flip = rng.uniform(size=truth.shape)
    judged = np.where(truth, flip >= 0.35, flip < 0.10)
    label_map, judge_map = _map(truth), _map(judged)
    keep = rng.permutation(rows)[: round(share * rows)]
    ref = np.full(rows, np.nan)
    ref[keep] = label_map[keep]
    block = estimate_block(ppi_fit(judge_map, ref), "labels", (0.0, 1.0))
    assert block is not None
    return float(label_map.mean()), {"ppi": block["ci95"], "judge": block["judge_ci95"]}


def test_coverage_by_simulation() -> None:
    """200 seeded worlds of 4,000 rows, 5 % labelled (200 rows): the corrected 95 % CI covers
    the labels' mean over every row in >= 93 % of them, the judge's own CI in far fewer."""
    hits = {"ppi": 0, "judge": 0}
    for seed in range(200):
        truth, cis = _one_world(seed, 4000, 0.05)
        for name, (lo, hi) in cis.items():
            hits[name] += lo <= truth <= hi
    assert hits["ppi"] >= 186, hits  # 93 % of 200
    assert hits["judge"] <= 20, hits


def test_min_reference_is_ten() -> None:
    assert MIN_REFERENCE == 10
