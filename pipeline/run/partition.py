"""Turn one scored table into part files: plain `part-KEY.parquet`, or Hive-partitioned
`col=value/part-KEY.parquet` with the partition columns carried by the path only.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

import polars as pl
import pyarrow as pa

from ctxprec.storage.core.constants import HIVE_NULL

__all__ = ["partition_tables"]


def _segment(column: str, value: object) -> str:
    text = HIVE_NULL if value is None else str(value)
    return f"{column}={quote(text, safe=' -_.:')}"


def partition_tables(
    table: pa.Table, partition_by: Sequence[str], name: str
) -> dict[str, pa.Table]:
    """Relative path -> table. Without partition columns, one file named `name.parquet`."""
    if not partition_by:
        return {f"{name}.parquet": table}
    missing = [c for c in partition_by if c not in table.column_names]
    if missing:
        raise ValueError(f"partition column(s) {missing} are not in the output")
    keys = pl.from_arrow(table.select(list(partition_by)))
    assert isinstance(keys, pl.DataFrame)
    groups = (
        keys.with_row_index("__row")
        .group_by(list(partition_by), maintain_order=True)
        .agg(pl.col("__row"))
    )
    keep = [c for c in table.column_names if c not in partition_by]
    out: dict[str, pa.Table] = {}
    for row in groups.iter_rows():
        *values, rows = row
        path = "/".join(_segment(c, v) for c, v in zip(partition_by, values, strict=True))
        out[f"{path}/{name}.parquet"] = table.take(pa.array(rows, pa.uint64())).select(keep)
    return out
