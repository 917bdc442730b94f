"""The paired statistics: the bootstrap CI covers the true difference at about the stated rate on
simulated paired data, constant differences give a zero-width interval, the permutation test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.paired import bootstrap_ci, paired_figures, sign_flip_p


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
