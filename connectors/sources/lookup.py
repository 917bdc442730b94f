"""The texts of a few rows, read back from a run's input for the HTML report: the query, the
expected output and the context items of the ids it opens. Only when the input is local Parquet
that has not changed since the run (size and mtime as the manifest recorded them) and the
context came from a column, not an extractor; Polars reads it lazily, filtered on the ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from storage import fs
from storage.report.rows import TextLookup, Texts, text_columns, with_keys

__all__ = ["input_texts"]


def _unchanged(entry: Any) -> str | None:
    """The file's path when it is local Parquet with the recorded size and mtime."""
    if not (isinstance(entry, list | tuple) and len(entry) == 3):
        return None
    path, size, mtime_ns = entry
    if not isinstance(path, str) or fs.is_uri(path) or not path.endswith(".parquet"):
        return None
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return path if (stat.st_size, stat.st_mtime_ns) == (size, mtime_ns) else None


def input_texts(describe: Mapping[str, Any]) -> TextLookup | None:
    """A lookup id -> texts over the run's input (the manifest's `describe`), or None when the
    input cannot be read back as it was."""
    columns = describe.get("columns") or []
    names = text_columns(describe)
    if describe.get("extractor") or not columns or "context" not in names:
        return None
    entries = describe.get("files") or []
    paths = [_unchanged(e) for e in entries]
    if not paths or None in paths:
        return None
    id_column = str(columns[0])
    files = [p for p in paths if p is not None]

    def lookup(ids: Sequence[str]) -> Texts:
        try:
            return _read(files, id_column, names, ids)
        except (OSError, pl.exceptions.PolarsError):
            return {}  # the report then shows verdicts and reasons without the texts

    return lookup


def _read(files: list[str], id_column: str, names: Mapping[str, str], ids: Sequence[str]) -> Texts:
    lf = pl.scan_parquet(files, hive_partitioning=False, missing_columns="insert")
    have = set(lf.collect_schema().names())
    key = pl.col(id_column).cast(pl.String)
    exprs = [key.alias("id")]
    for field, column in names.items():
        if column in have:
            kind = pl.List(pl.String) if field == "context" else pl.String
            exprs.append(pl.col(column).cast(kind, strict=False).alias(field))
    got = with_keys(lf, key, ids).select(exprs).collect(engine="streaming")
    return {str(r.pop("id")): r for r in got.iter_rows(named=True)}
