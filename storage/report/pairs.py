"""Two outputs side by side for `ctxprec view A B`: their rows joined on id, a page at a time,
with both scores and the difference B − A; one pair opens to both rows' ranked items. Lazy
Polars queries: the join carries ids, scores and statuses only (and whether a row matches the
search), and the page's query texts are read afterwards for its ids alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import polars as pl

from ctxprec.storage.report.table import RowTable

__all__ = ["PAIR_SORTS", "PairFilter", "RowPairs"]

# "": A's file order; "delta": B − A lowest first (losses); "-delta": wins first;
# "change": the largest |B − A| first; "id"
PAIR_SORTS = ("", "delta", "-delta", "change", "id")
_QUERY_TEXT = 300
_STREAMING: Final = "streaming"


@dataclass(frozen=True)
class PairFilter:
    """Which pairs a page shows: a piece of the id or query, a status on either side, and
    `changed` (only pairs whose score or status differs)."""

    search: str = ""
    status: str | None = None
    changed: bool = False


def _matches(table: RowTable, term: str) -> pl.Expr:
    """Whether a row's id or query holds `term` (lowercase), as a boolean column."""
    hit = pl.col("id").cast(pl.String).str.to_lowercase().str.contains(term, literal=True)
    if table.query_column:
        text = pl.col(table.query_column).cast(pl.String).str.to_lowercase()
        hit = hit | text.str.contains(term, literal=True).fill_null(False)
    return hit


class RowPairs:
    """The rows of `a` and `b` that share an id (an inner join: rows on one side only are
    counted, not listed)."""

    def __init__(self, a: RowTable, b: RowTable) -> None:
        self.a, self.b = a, b

    def _side(self, table: RowTable, tag: str, term: str) -> pl.LazyFrame:
        cols = [
            pl.col("id").cast(pl.String).alias("id"),
            pl.col("score").alias(f"score_{tag}"),
            pl.col("status").alias(f"status_{tag}"),
        ]
        if term:
            cols.append(_matches(table, term).alias(f"hit_{tag}"))
        return table.scan().select(cols)

    def _joined(self, f: PairFilter) -> pl.LazyFrame:
        term = f.search.strip().lower()
        a, b = self._side(self.a, "a", term), self._side(self.b, "b", term)
        lf = a.join(b, on="id", how="inner", maintain_order="left")
        lf = lf.with_columns((pl.col("score_b") - pl.col("score_a")).round(4).alias("delta"))
        if f.status:
            lf = lf.filter((pl.col("status_a") == f.status) | (pl.col("status_b") == f.status))
        if f.changed:
            moved = (pl.col("delta").abs() > 1e-9).fill_null(False)
            lf = lf.filter(moved | (pl.col("status_a") != pl.col("status_b")))
        if term:
            lf = lf.filter(pl.col("hit_a") | pl.col("hit_b")).drop("hit_a", "hit_b")
        return lf

    def counts(self) -> dict[str, int]:
        """Pairs, and rows of each side without a partner."""
        ids_a = self.a.scan().select(pl.col("id").cast(pl.String))
        ids_b = self.b.scan().select(pl.col("id").cast(pl.String))
        joined = ids_a.join(ids_b, on="id", how="semi").select(pl.len())
        pairs = int(joined.collect(engine=_STREAMING).item())
        rows_a, rows_b = self.a.count_all(), self.b.count_all()
        return {"pairs": pairs, "only_a": rows_a - pairs, "only_b": rows_b - pairs}

    def page(self, f: PairFilter, sort: str, number: int, size: int) -> dict[str, Any]:
        lf = self._joined(f)
        total = int(lf.select(pl.len()).collect(engine=_STREAMING).item())
        if sort == "id":
            lf = lf.sort("id")
        elif sort in ("delta", "-delta"):
            lf = lf.sort(["delta", "id"], descending=[sort == "-delta", False], nulls_last=True)
        elif sort == "change":
            lf = lf.sort(
                [pl.col("delta").abs(), pl.col("id")], descending=[True, False], nulls_last=True
            )
        got = lf.slice(size * (number - 1), size).collect(engine=_STREAMING)
        queries = self._queries(got.get_column("id"))
        rows = [{**row, "query": queries.get(row["id"])} for row in got.iter_rows(named=True)]
        return {"total": total, "page": number, "size": size, "rows": rows}

    def _queries(self, ids: pl.Series) -> dict[str, str | None]:
        """The query text of these ids, from A (or B when only B keeps it), clipped."""
        table = self.a if self.a.query_column else self.b
        if ids.is_empty() or not table.query_column:
            return {}
        key = pl.col("id").cast(pl.String)
        got = (
            table.scan()
            .filter(key.is_in(ids.implode()))
            .select(key.alias("id"), pl.col(table.query_column).cast(pl.String).alias("q"))
            .collect(engine=_STREAMING)
        )
        return {i: _clip(q) for i, q in got.iter_rows()}

    def pair(self, row_id: str) -> dict[str, Any] | None:
        """Both rows of one id with their items; None when neither side has it."""
        a, b = self.a.row(row_id), self.b.row(row_id)
        if a is None and b is None:
            return None
        delta = None
        if a and b and a["score"] is not None and b["score"] is not None:
            delta = round(b["score"] - a["score"], 4)
        return {"id": row_id, "a": a, "b": b, "delta": delta}


def _clip(text: str | None) -> str | None:
    if text is not None and len(text) > _QUERY_TEXT:
        return text[:_QUERY_TEXT] + "…"
    return text
