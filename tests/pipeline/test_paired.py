"""The paired statistics: the bootstrap CI covers the true difference at about the stated rate on
simulated paired data, constant differences give a zero-width interval, the permutation test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import ttest_rel
from statsmodels.stats.power import TTestPower

from ctxprec.storage.stats.paired import bootstrap_ci, paired_figures, sign_flip_p


@pytest.mark.slow
def test_bootstrap_ci_covers_true_delta_at_95_percent() -> None:
    """200 simulated nights of 80 paired scores in [0, 1] with a known true mean difference."""
    rng = np.random.default_rng(2026)
    trials, n, true_delta = 200, 80, 0.04
    covered = 0
    for t in range(trials):
        a = rng.beta(2, 3, size=n)
        b = np.clip(a + true_delta + rng.normal(0, 0.15, size=n), -1, 2)  # noise symmetric: the
        lo, hi = bootstrap_ci(b - a, resamples=1000, seed=t)  # true mean delta stays 0.04
        covered += lo <= true_delta <= hi
    # binomial: 95 % of 200 with 3 standard deviations either side (sd = 3.1 trials)
    sd = math.sqrt(trials * 0.95 * 0.05)
    assert trials * 0.95 - 3 * sd <= covered <= trials * 0.95 + 3 * sd, covered


def test_identical_sides_give_zero_interval_and_p_one() -> None:
    scores = [0.1, 0.5, 0.83, 1.0, 0.0]
    got = paired_figures(scores, scores, resamples=500, seed=1)
    assert got["mean_delta"] == 0.0
    assert got["ci95"] == [0.0, 0.0]
    assert got["p_value"] == 1.0
    assert got["ties"] == 5
    assert got["wins"] == got["losses"] == 0


def test_constant_shift_interval_contains_the_mean_exactly() -> None:
    a = [0.3] * 7
    b = [0.4] * 7
    got = paired_figures(a, b, resamples=200, seed=0)
    lo, hi = got["ci95"]
    assert lo <= got["mean_delta"] <= hi
    assert hi - lo < 1e-12
    assert got["wins"] == 7


def test_exact_sign_flip_p_value() -> None:
    # three positive differences: only the all-positive and all-negative flips are as extreme
    p, how = sign_flip_p(np.array([0.1, 0.1, 0.1]), resamples=100, seed=0)
    assert how == "exact"
    assert p == pytest.approx(2 / 8)
    p_big, how_big = sign_flip_p(np.full(40, 0.05), resamples=2000, seed=0)
    assert how_big.startswith("2,000")
    assert p_big == pytest.approx(1 / 2001 * 1, abs=2e-3)


def test_bootstrap_is_seeded() -> None:
    d = np.random.default_rng(0).normal(0, 1, 50)
    assert bootstrap_ci(d, 1000, 7) == bootstrap_ci(d, 1000, 7)
    assert bootstrap_ci(d, 1000, 7) != bootstrap_ci(d, 1000, 8)


def test_both_resampling_paths_agree_with_normal_theory() -> None:
    """Few distinct differences (multinomial counts) and many (ids drawn), same width."""
    rng = np.random.default_rng(3)
    for d in (rng.normal(0.02, 0.3, 6000), np.round(rng.normal(0.02, 0.3, 6000), 2)):
        lo, hi = bootstrap_ci(d, resamples=800, seed=1)
        half = 1.959964 * d.std(ddof=1) / math.sqrt(len(d))
        assert lo < d.mean() < hi
        assert (hi - lo) / 2 == pytest.approx(half, rel=0.15)


# -- honest intervals: clusters, effect size, power, non-inferiority ---------------
def clustered_night(rng: np.random.Generator, clusters: int, per: int, delta: float) -> tuple:
    """Pairs in clusters that share a query: each query's own shift plus per-pair noise."""
    shift = np.repeat(rng.normal(0, 0.2, size=clusters), per)
    a = rng.beta(2, 3, size=clusters * per)
    b = a + delta + shift + rng.normal(0, 0.05, size=clusters * per)
    return a, b, np.repeat(np.arange(clusters), per)


@pytest.mark.slow
def test_clustered_ci_covers_where_the_per_pair_ci_is_too_narrow() -> None:
    rng = np.random.default_rng(7)
    trials, true_delta = 200, 0.03
    covered = {"pairs": 0, "clusters": 0}
    for t in range(trials):
        a, b, codes = clustered_night(rng, clusters=40, per=5, delta=true_delta)
        for how, clusters in (("pairs", None), ("clusters", codes)):
            got = paired_figures(a, b, resamples=1000, seed=t, test=False, clusters=clusters)
            covered[how] += got["ci95"][0] <= true_delta <= got["ci95"][1]
    sd = math.sqrt(trials * 0.95 * 0.05)
    # 40 clusters: the percentile bootstrap runs a little narrow; within 4 sd of 95 %
    assert covered["clusters"] >= trials * 0.95 - 4 * sd, covered
    assert covered["pairs"] < trials * 0.80, covered  # treating pairs as independent: too narrow


def test_cluster_bootstrap_matches_drawing_whole_clusters_by_hand() -> None:
    rng = np.random.default_rng(3)
    a, b, codes = clustered_night(rng, clusters=30, per=4, delta=0.0)
    got = paired_figures(a, b, resamples=4000, seed=1, clusters=codes)
    assert got["clusters"] == 30
    d = b - a
    draws = np.random.default_rng(9).integers(0, 30, size=(4000, 30))
    means = [np.concatenate([d[codes == c] for c in row]).mean() for row in draws]
    ref_lo, ref_hi = np.percentile(means, [2.5, 97.5])
    assert got["ci95"][0] == pytest.approx(ref_lo, abs=0.01)
    assert got["ci95"][1] == pytest.approx(ref_hi, abs=0.01)
    assert got["se"] == pytest.approx(float(np.std(means, ddof=1)), rel=0.08)
    assert got["design_effect"] > 2  # a shared shift per query: far from independent


def test_effect_size_matches_scipy_and_power_matches_statsmodels() -> None:
    rng = np.random.default_rng(11)
    a = rng.beta(2, 3, size=400)
    b = a + 0.02 + rng.normal(0, 0.2, size=400)
    got = paired_figures(a, b, resamples=10_000, seed=0)
    t = ttest_rel(b, a).statistic
    assert got["cohens_dz"] == pytest.approx(t / math.sqrt(400), rel=1e-9)
    # the smallest detectable difference (80 % power, two-sided 5 %) as statsmodels solves it
    effect = TTestPower().solve_power(nobs=400, alpha=0.05, power=0.8)
    mde = effect * float(np.std(b - a, ddof=1))
    assert got["mde_80"] == pytest.approx(mde, rel=0.05)  # bootstrap SE vs t-test SE


def test_non_inferiority_is_shown_only_when_the_ci_clears_the_margin() -> None:
    rng = np.random.default_rng(5)
    a = rng.beta(2, 3, size=300)
    b = a - 0.01 + rng.normal(0, 0.05, size=300)  # slightly worse, tightly measured
    shown = paired_figures(a, b, resamples=4000, seed=0, margin=0.03)["non_inferiority"]
    assert shown["non_inferior"] is True
    assert shown["lower_bound"] > -0.03
    assert shown["p_value"] < 0.025
    not_shown = paired_figures(a, b, resamples=4000, seed=0, margin=0.005)["non_inferiority"]
    assert not_shown["non_inferior"] is False
    assert not_shown["p_value"] > 0.025
