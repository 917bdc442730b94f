"""The one definition of context precision (MAP over a ranked list) and the rank metrics.

`map_score` is the per-row function; `map_stage` is the vectorized Polars stage over one row per
judged item. Both round half up exactly like JavaScript's `Math.round((x + EPSILON) * 100) / 100`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import polars as pl

from ctxprec.storage.core.settings import DEFAULT_KS

__all__ = [
    "average_precision",
    "map_score",
    "map_stage",
    "map_stage_lazy",
    "rank_column_names",
    "rank_metrics",
    "round_half_up",
]

_EPSILON = 2.220446049250313e-16  # JavaScript's Number.EPSILON


def round_half_up(value: float) -> float:
    """Round to two decimals, half up, as Mastra does (0.125 -> 0.13, 0.375 -> 0.38)."""
    return math.floor((value + _EPSILON) * 100.0 + 0.5) / 100.0


def average_precision(verdicts: Sequence[bool]) -> float:
    """Unrounded MAP of one ranked list: mean of precision@i at each relevant position i."""
    hits = 0
    total = 0.0
    for i, relevant in enumerate(verdicts):
        if relevant:
            hits += 1
            total += hits / (i + 1)
    return total / hits if hits else 0.0


def map_score(verdicts: Sequence[bool], scale: float = 1.0) -> float:
    """The row's score: round_half_up(MAP x scale). Empty or all-irrelevant lists give 0.0."""
    return round_half_up(average_precision(verdicts) * scale)


def rank_metrics(verdicts: Sequence[bool], ks: Sequence[int] = DEFAULT_KS) -> dict[str, float]:
    """Plain-Python rank metrics of one list (reference for the Polars stage).

    precision@k divides by k (a short list is not padded with relevant items); NDCG@k uses
    binary gains with ideal DCG over min(k, relevant count) items; reciprocal rank is 0.0 when
    nothing is relevant.
    """
    first = next((i for i, r in enumerate(verdicts) if r), None)
    out: dict[str, float] = {"reciprocal_rank": 0.0 if first is None else 1.0 / (first + 1)}
    total = sum(1 for r in verdicts if r)
    for k in ks:
        top = sum(1 for r in verdicts[:k] if r)
        dcg = sum(1.0 / math.log2(i + 2) for i, r in enumerate(verdicts[:k]) if r)
        ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, total)))
        out[f"precision_at_{k}"] = top / k
        out[f"hit_at_{k}"] = float(top > 0)
        out[f"ndcg_at_{k}"] = dcg / ideal if ideal else 0.0
    return out


def _true_div(expr: pl.Expr, divisor: float) -> pl.Expr:
    """IEEE division by a constant. Polars rewrites `x / c` (lazy or eager) as `x * (1/c)`,
    which is off by one ulp for some x (41 / 100 != 41 * 0.01) and would break equality with
    the per-row function; a Series divided by a Series of c divides element by element. (Not
    through NumPy: Polars taking a NumPy array back imports numpy.ma, ~6 ms of every run.)"""

    def divide(s: pl.Series) -> pl.Series:
        return s / pl.Series([divisor], dtype=pl.Float64).new_from_index(0, len(s))

    return expr.map_batches(divide, return_dtype=pl.Float64)


def _round_half_up_expr(expr: pl.Expr) -> pl.Expr:
    return _true_div(((expr + _EPSILON) * 100.0 + 0.5).floor(), 100.0)


def _rank_inputs(position: str, relevant: str, ks: Sequence[int]) -> list[pl.Expr]:
    """Per-item columns whose plain per-row sums/mins give the rank metrics (no filtered aggs)."""
    rel = pl.col(relevant)
    pos = pl.col(position)
    cols = [pl.when(rel).then(pos).otherwise(None).alias("_first")]
    gain = 1.0 / (pos + 2).cast(pl.Float64).log(2)
    for k in ks:
        top = rel & (pos < k)
        cols.append(top.cast(pl.Int64).alias(f"_top_{k}"))
        cols.append(pl.when(top).then(gain).otherwise(0.0).alias(f"_dcg_{k}"))
    return cols


def _rank_aggs(ks: Sequence[int]) -> list[pl.Expr]:
    aggs = [pl.col("_first").min()]
    for k in ks:
        aggs.append(pl.col(f"_top_{k}").sum())
        aggs.append(pl.col(f"_dcg_{k}").sum())
    return aggs


def _ideal_dcg(count: pl.Expr, k: int) -> pl.Expr:
    """Sum of 1/log2(i+2) for i < min(k, count), from a small lookup of prefix sums."""
    prefix = [0.0]
    for i in range(k):
        prefix.append(prefix[-1] + 1.0 / math.log2(i + 2))
    return pl.lit(pl.Series(prefix)).gather(pl.min_horizontal(count, pl.lit(k)))


def _rank_columns(ks: Sequence[int]) -> list[pl.Expr]:
    first = pl.col("_first")
    cols = [
        pl.when(first.is_null()).then(0.0).otherwise(1.0 / (first + 1)).alias("reciprocal_rank")
    ]
    for k in ks:
        top = pl.col(f"_top_{k}")
        ideal = _ideal_dcg(pl.col("relevant_count"), k)
        cols += [
            _true_div(top.cast(pl.Float64), float(k)).alias(f"precision_at_{k}"),
            (top > 0).alias(f"hit_at_{k}"),
            pl.when(ideal > 0)
            .then(pl.col(f"_dcg_{k}") / ideal)
            .otherwise(0.0)
            .alias(f"ndcg_at_{k}"),
        ]
    return cols


def rank_column_names(ks: Sequence[int]) -> list[str]:
    names = ["reciprocal_rank"]
    for k in ks:
        names += [f"precision_at_{k}", f"hit_at_{k}", f"ndcg_at_{k}"]
    return names


def map_stage(
    items: pl.DataFrame | pl.LazyFrame,
    *,
    key: str = "row",
    position: str = "position",
    relevant: str = "relevant",
    scale: float = 1.0,
    ks: Sequence[int] = (),
) -> pl.DataFrame:
    """`map_stage_lazy`, collected."""
    return map_stage_lazy(
        items, key=key, position=position, relevant=relevant, scale=scale, ks=ks
    ).collect()


def map_stage_lazy(
    items: pl.DataFrame | pl.LazyFrame,
    *,
    key: str = "row",
    position: str = "position",
    relevant: str = "relevant",
    scale: float = 1.0,
    ks: Sequence[int] = (),
) -> pl.LazyFrame:
    """Score many rows at once from one row per judged item.

    Input: columns `key`, `position` (0-based rank), `relevant` (bool), with each row's items
    contiguous and in position order (as `explode` produces them). Output, one row per key in
    first-seen order: `key`, `score` (rounded, scaled), `ap` (unrounded MAP), `relevant_count`,
    `context_count`, then for `ks` the rank metrics of `rank_metrics`. Runs without any
    per-group window: a global cumulative sum minus the count at each row's first item gives
    "relevant items so far".
    """
    rel = pl.col(relevant).cast(pl.Int64)
    seen = rel.cum_sum()
    before_row = pl.when(pl.col(position) == 0).then(seen - rel).otherwise(None).forward_fill()
    precision = (
        pl.when(pl.col(relevant)).then((seen - before_row) / (pl.col(position) + 1)).otherwise(0.0)
    )
    lf = items.lazy()
    schema = lf.collect_schema()
    if schema[position] != pl.Int64 or schema[relevant] != pl.Boolean:
        lf = lf.with_columns(pl.col(position).cast(pl.Int64), pl.col(relevant).cast(pl.Boolean))
    extra = _rank_inputs(position, relevant, ks)
    out = (
        lf.select(key, position, relevant, precision.alias("_p"), *extra)
        .group_by(key, maintain_order=True)
        .agg(
            pl.col("_p").sum().alias("_sum"),
            pl.col(relevant).sum().cast(pl.Int64).alias("relevant_count"),
            pl.len().cast(pl.Int64).alias("context_count"),
            *_rank_aggs(ks),
        )
        .with_columns(
            pl.when(pl.col("relevant_count") > 0)
            .then(pl.col("_sum") / pl.col("relevant_count"))
            .otherwise(0.0)
            .alias("ap")
        )
        .with_columns(
            _round_half_up_expr(pl.col("ap") * float(scale)).alias("score"), *_rank_columns(ks)
        )
        .select(key, "score", "ap", "relevant_count", "context_count", *rank_column_names(ks))
    )
    return out
