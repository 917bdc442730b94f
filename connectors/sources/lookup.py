"""The texts of a few rows, read back from a run's input for the HTML report: the query, the
expected output and the context items of the ids it opens. Only when the input is local Parquet
that has not changed since the run (size and mtime as the manifest recorded them) and the
context came from a column, not an extractor. The file is read as a stream of small record
batches over a buffered file (no row group held whole: a 1 M-item input's lookup of 60 rows
peaks at ~120 MiB instead of ~770 MiB), only in the row groups that hold a wanted id, and only
the matching rows become Python objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ctxprec.storage.files import fs
from ctxprec.storage.report.rows import TextLookup, Texts, text_columns

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
        except (OSError, pa.ArrowException, pl.exceptions.PolarsError):
            return {}  # the report then shows verdicts and reasons without the texts

    return lookup


_BATCH_ROWS = 1024  # rows decoded at a time
_BUFFER = 1 << 20  # bytes read from the file at a time


def _read(files: list[str], id_column: str, names: Mapping[str, str], ids: Sequence[str]) -> Texts:
    """The texts of `ids`, matched in Python on each batch's ids (no pyarrow.compute, whose
    import a score run would otherwise pay for a few rows); a row whose text is not UTF-8 is
    left out (the report shows its verdicts without the texts)."""
    wanted = set(ids)
    out: Texts = {}
    for path in files:
        parquet = pq.ParquetFile(path, buffer_size=_BUFFER, pre_buffer=False)
        have = set(parquet.schema_arrow.names)
        if id_column not in have:
            continue
        fields = {field: column for field, column in names.items() if column in have}
        groups = [
            i
            for i in range(parquet.num_row_groups)
            if _found(parquet.read_row_group(i, [id_column]).column(0), wanted)
        ]
        if not groups:
            continue
        columns = [id_column, *{c for c in fields.values() if c != id_column}]
        batches = parquet.iter_batches(
            _BATCH_ROWS, row_groups=groups, columns=columns, use_threads=False
        )
        for batch in batches:
            for row in _found(batch.column(id_column), wanted):
                texts = _texts(batch.slice(row, 1), id_column, fields)
                if texts is not None:
                    out[texts.pop("id")] = texts
    return out


def _found(ids: pa.Array | pa.ChunkedArray, wanted: set[str]) -> list[int]:
    """The positions of `ids` (as text) that are in `wanted`."""
    return [i for i, key in enumerate(ids.to_pylist()) if key is not None and str(key) in wanted]


def _texts(row: pa.RecordBatch, id_column: str, fields: Mapping[str, str]) -> dict[str, Any] | None:
    try:
        (values,) = row.to_pylist()
    except (UnicodeDecodeError, ValueError, pa.ArrowException):
        return None
    got: dict[str, Any] = {"id": str(values[id_column])}
    for field, column in fields.items():
        value = values[column]
        if field == "context":
            items = value if isinstance(value, list) else None
            got[field] = None if items is None else [_text(item) for item in items]
        else:
            got[field] = _text(value)
    return got


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) or value is None else str(value)
