"""The one definition of context precision (MAP over a ranked list) and the rank metrics.

`map_score` is the per-row function; `map_stage` is the vectorized Polars stage over one row per
judged item. Both round half up exactly like JavaScript's `Math.round((x + EPSILON) * 100) / 100`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import polars as pl

__all__ = ["average_precision", "map_score", "map_stage", "round_half_up"]

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


def _round_half_up_expr(expr: pl.Expr) -> pl.Expr:
    return ((expr + _EPSILON) * 100.0 + 0.5).floor() / 100.0


def map_stage(
    items: pl.DataFrame | pl.LazyFrame,
    *,
    key: str = "row",
    position: str = "position",
    relevant: str = "relevant",
    scale: float = 1.0,
) -> pl.DataFrame:
    """Score many rows at once from one row per judged item.

    Input: columns `key`, `position` (0-based rank), `relevant` (bool), with each row's items
    contiguous and in position order (as `explode` produces them). Output, one row per key in
    first-seen order: `key`, `score` (rounded, scaled), `ap` (unrounded MAP), `relevant_count`,
    `context_count`. Runs without any per-group window: a global cumulative sum minus the
    count at each row's first item gives "relevant items so far".
    """
    rel = pl.col(relevant).cast(pl.Int64)
    seen = rel.cum_sum()
    before_row = pl.when(pl.col(position) == 0).then(seen - rel).otherwise(None).forward_fill()
    precision = (
        pl.when(pl.col(relevant)).then((seen - before_row) / (pl.col(position) + 1)).otherwise(0.0)
    )
    out = (
        items.lazy()
        .select(pl.col(key), pl.col(position).cast(pl.Int64), pl.col(relevant).cast(pl.Boolean))
        .with_columns(precision.alias("_p"))
        .group_by(key, maintain_order=True)
        .agg(
            pl.col("_p").sum().alias("_sum"),
            pl.col(relevant).sum().cast(pl.Int64).alias("relevant_count"),
            pl.len().cast(pl.Int64).alias("context_count"),
        )
        .with_columns(
            pl.when(pl.col("relevant_count") > 0)
            .then(pl.col("_sum") / pl.col("relevant_count"))
            .otherwise(0.0)
            .alias("ap")
        )
        .with_columns(_round_half_up_expr(pl.col("ap") * float(scale)).alias("score"))
        .select(key, "score", "ap", "relevant_count", "context_count")
    )
    return out.collect()
