"""Two outputs side by side for `ctxprec view A B`: their rows joined on id, a page at a time,
with both scores and the difference B − A; one pair opens to both rows' ranked items. Lazy
Polars queries over both outputs' part files, collected only for the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from storage.report.table import RowTable

__all__ = ["PAIR_SORTS", "PairFilter", "RowPairs"]

# "": A's file order; "delta": B − A lowest first (losses); "-delta": wins first;
# "change": the largest |B − A| first; "id"
PAIR_SORTS = ("", "delta", "-delta", "change", "id")
_QUERY_TEXT = 300


@dataclass(frozen=True)
class PairFilter:
    """Which pairs a page shows: a piece of the id or query, a status on either side, and
    `changed` (only pairs whose score or status differs)."""

    search: str = ""
    status: str | None = None
    changed: bool = False


class RowPairs:
    """The rows of `a` and `b` that share an id (an inner join: rows on one side only are
    counted, not listed)."""

    def __init__(self, a: RowTable, b: RowTable) -> None:
        self.a, self.b = a, b

    def _side(self, table: RowTable, tag: str) -> pl.LazyFrame:
        cols = [
            pl.col("id").cast(pl.String).alias("id"),
            pl.col("score").alias(f"score_{tag}"),
            pl.col("status").alias(f"status_{tag}"),
        ]
        if table.query_column:
            cols.append(pl.col(table.query_column).cast(pl.String).alias(f"query_{tag}"))
        return table.scan().select(cols)

    def _joined(self, f: PairFilter) -> pl.LazyFrame:
        lf = self._side(self.a, "a").join(self._side(self.b, "b"), on="id", how="inner")
        lf = lf.with_columns((pl.col("score_b") - pl.col("score_a")).round(4).alias("delta"))
        if f.status:
            lf = lf.filter((pl.col("status_a") == f.status) | (pl.col("status_b") == f.status))
        if f.changed:
            moved = (pl.col("delta").abs() > 1e-9).fill_null(False)
            lf = lf.filter(moved | (pl.col("status_a") != pl.col("status_b")))
        term = f.search.strip().lower()
        if term:
            hit = pl.col("id").str.to_lowercase().str.contains(term, literal=True)
            for tag in ("a", "b"):
                if f"query_{tag}" in lf.collect_schema().names():
                    text = pl.col(f"query_{tag}").str.to_lowercase()
                    hit = hit | text.str.contains(term, literal=True).fill_null(False)
            lf = lf.filter(hit)
        return lf

    def counts(self) -> dict[str, int]:
        """Pairs, and rows of each side without a partner."""
        ids_a = self.a.scan().select(pl.col("id").cast(pl.String))
        ids_b = self.b.scan().select(pl.col("id").cast(pl.String))
        pairs = ids_a.join(ids_b, on="id", how="inner").select(pl.len()).collect().item()
        rows_a = ids_a.select(pl.len()).collect().item()
        rows_b = ids_b.select(pl.len()).collect().item()
        return {"pairs": pairs, "only_a": rows_a - pairs, "only_b": rows_b - pairs}

    def page(self, f: PairFilter, sort: str, number: int, size: int) -> dict[str, Any]:
        lf = self._joined(f)
        total = int(lf.select(pl.len()).collect().item())
        if sort == "id":
            lf = lf.sort("id")
        elif sort in ("delta", "-delta"):
            lf = lf.sort(["delta", "id"], descending=[sort == "-delta", False], nulls_last=True)
        elif sort == "change":
            lf = lf.sort(
                [pl.col("delta").abs(), pl.col("id")], descending=[True, False], nulls_last=True
            )
        got = lf.slice(size * (number - 1), size).collect()
        rows = []
        for row in got.iter_rows(named=True):
            query = row.pop("query_a", None) or row.pop("query_b", None)
            row.pop("query_b", None)
            if isinstance(query, str) and len(query) > _QUERY_TEXT:
                query = query[:_QUERY_TEXT] + "…"
            rows.append({**row, "query": query})
        return {"total": total, "page": number, "size": size, "rows": rows}

    def pair(self, row_id: str) -> dict[str, Any] | None:
        """Both rows of one id with their items; None when neither side has it."""
        a, b = self.a.row(row_id), self.b.row(row_id)
        if a is None and b is None:
            return None
        delta = None
        if a and b and a["score"] is not None and b["score"] is not None:
            delta = b["score"] - a["score"]
        return {"id": row_id, "a": a, "b": b, "delta": delta}
