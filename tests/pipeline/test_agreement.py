"""The agreement statistics against the reference implementations (statsmodels, scipy) on
fixed data: Cohen's κ and its asymptotic standard error, McNemar's exact and χ² tests, and the
row-clustered bootstrap of κ."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.inter_rater import cohens_kappa as sm_kappa

from ctxprec.storage.stats.agreement import (
    agreement_figures,
    cohen_kappa,
    kappa_asymptotic_se,
    mcnemar,
    row_counts,
)

TABLES = [[208, 32, 130, 830], [40, 9, 3, 48], [5, 1, 0, 4], [1, 0, 0, 0], [0, 3, 4, 10]]


@pytest.mark.parametrize("table", TABLES)
def test_kappa_and_its_standard_error_match_statsmodels(table: list[int]) -> None:
    with np.errstate(invalid="ignore", divide="ignore"):  # the undefined case warns
        ref = sm_kappa([[table[0], table[1]], [table[2], table[3]]])
    got = cohen_kappa(table)
    if not np.isfinite(ref.kappa):  # one class on both sides: undefined
        assert got is None
        return
    assert got == pytest.approx(ref.kappa, abs=1e-12)
    assert kappa_asymptotic_se(table) == pytest.approx(ref.std_kappa, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(("only_a", "only_b"), [(9, 3), (0, 5), (12, 12), (1, 23), (32, 130),
                                                (20, 5), (0, 0)])  # fmt: skip
def test_mcnemar_matches_statsmodels_exact_below_25(only_a: int, only_b: int) -> None:
    got = mcnemar(only_a, only_b)
    exact = only_a + only_b < 25
    ref = sm_mcnemar([[10, only_a], [only_b, 10]], exact=exact, correction=True)
    assert got["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert got["method"] == ("exact binomial" if exact else "chi-square, continuity corrected")
    if exact and only_a + only_b:
        ref_binom = binomtest(only_a, only_a + only_b, 0.5).pvalue
        assert got["p_value"] == pytest.approx(ref_binom, rel=1e-9)


def test_items_are_paired_by_position_and_unjudged_items_left_out() -> None:
    rows = [
        ([True, False, None], [True, True, False]),  # third: not judged on A
        ([False], [False]),
        ([True, True], [True]),  # different lengths: not the same items
    ]
    counts = row_counts(rows)
    assert counts.tolist() == [[1, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]
    figures = agreement_figures(counts, resamples=200, seed=0)
    assert figures["items"] == 3
    assert figures["rows"] == 2
    assert figures["table"] == {"both_relevant": 1, "only_a_relevant": 0, "only_b_relevant": 1,
                                "neither_relevant": 1}  # fmt: skip


def test_the_bootstrap_ci_resamples_rows_and_is_seeded() -> None:
    rng = np.random.default_rng(5)
    counts = rng.multinomial(6, [0.25, 0.05, 0.1, 0.6], size=150)
    one = agreement_figures(counts, resamples=2000, seed=3)
    assert one == agreement_figures(counts, resamples=2000, seed=3)
    lo, hi = one["kappa_ci95"]
    assert lo < one["cohen_kappa"] < hi
    # by hand: resample whole rows and take percentiles of κ
    draws = np.random.default_rng(11).integers(0, 150, size=(2000, 150))
    kappas = [cohen_kappa(counts[d].sum(axis=0)) for d in draws]
    ref_lo, ref_hi = np.percentile(kappas, [2.5, 97.5])
    assert lo == pytest.approx(ref_lo, abs=0.02)
    assert hi == pytest.approx(ref_hi, abs=0.02)
