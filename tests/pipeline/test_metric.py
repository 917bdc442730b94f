"""The MAP formula: conformance vectors, per-row vs Polars stage, rank metrics."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxprec.storage.core.metric import (
    average_precision,
    map_score,
    map_stage,
    rank_column_names,
    rank_metrics,
    round_half_up,
)
from tests.fakes.inputs import VECTORS

CASES = json.loads(VECTORS.read_text())


def _items(lists: list[list[bool]]) -> pl.DataFrame:
    rows = [(r, p, v) for r, lst in enumerate(lists) for p, v in enumerate(lst)]
    return pl.DataFrame(
        rows, schema={"row": pl.Int64, "position": pl.Int64, "relevant": pl.Boolean}, orient="row"
    )


def test_vectors_file_is_not_empty() -> None:
    assert len(CASES) >= 30
    assert all(case["note"] for case in CASES)  # each says what it checks, with its arithmetic


def _exact_score(verdicts: list[bool], scale: float) -> Fraction:
    """The score by exact fractions: MAP x scale, rounded half up at the second decimal."""
    hits, total = 0, Fraction(0)
    for i, relevant in enumerate(verdicts):
        if relevant:
            hits += 1
            total += Fraction(hits, i + 1)
    hundredths = (total / hits if hits else Fraction(0)) * Fraction(scale) * 100
    return Fraction(math.floor(hundredths + Fraction(1, 2)), 100)


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c['note'][:40]}" for i, c in enumerate(CASES)])
def test_vector_scores_are_the_exact_arithmetic(case: dict) -> None:
    """The file's scores are checked by hand in each note; this redoes them exactly, so a typo in
    the file cannot hold the product to a wrong number."""
    assert Fraction(case["score"]).limit_denominator(100) == _exact_score(
        case["verdicts"], case["scale"]
    )


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c['note'][:40]}" for i, c in enumerate(CASES)])
def test_per_row_function_matches_vector(case: dict) -> None:
    assert map_score(case["verdicts"], case["scale"]) == case["score"]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c['note'][:40]}" for i, c in enumerate(CASES)])
def test_polars_stage_matches_vector(case: dict) -> None:
    if not case["verdicts"]:
        # rows without items never reach the stage; the pipeline scores them 0.0 (empty_context)
        assert map_score([], case["scale"]) == case["score"] == 0.0
        return
    out = map_stage(_items([case["verdicts"]]), scale=case["scale"])
    assert out.get_column("score").to_list() == [case["score"]]


def test_half_up_not_bankers() -> None:
    assert round_half_up(0.125) == 0.13
    assert round_half_up(0.375) == 0.38
    assert round(0.125, 2) == 0.12  # what Python's round would have given


verdict_lists = st.lists(st.lists(st.booleans(), min_size=1, max_size=25), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(lists=verdict_lists, scale=st.sampled_from([0.0, 1.0, 5.0, 10.0, 100.0, 3.0]))
def test_stage_agrees_with_per_row_function(lists: list[list[bool]], scale: float) -> None:
    out = map_stage(_items(lists), scale=scale, ks=(1, 3, 5))
    assert out.get_column("row").to_list() == list(range(len(lists)))
    for lst, row in zip(lists, out.iter_rows(named=True), strict=True):
        assert row["score"] == map_score(lst, scale)
        assert row["ap"] == pytest.approx(average_precision(lst), abs=1e-12)
        assert row["relevant_count"] == sum(lst)
        assert row["context_count"] == len(lst)
        ref = rank_metrics(lst, (1, 3, 5))
        for name in rank_column_names((1, 3, 5)):
            assert float(row[name]) == pytest.approx(ref[name], abs=1e-12), name


def test_rank_metrics_by_hand() -> None:
    m = rank_metrics([False, True, False, True], (1, 3))
    assert m["reciprocal_rank"] == 0.5
    assert m["precision_at_1"] == 0.0
    assert m["hit_at_1"] == 0.0
    assert m["precision_at_3"] == pytest.approx(1 / 3)
    # DCG@3 = 1/log2(3); ideal over min(3, 2) = 2 items: 1 + 1/log2(3)
    assert m["ndcg_at_3"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    assert rank_metrics([False, False], (1,))["ndcg_at_1"] == 0.0
