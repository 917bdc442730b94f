"""Input readers: the streaming Parquet source (files, folders, globs, Hive datasets)."""

from connectors.sources.parquet import (
    DEFAULT_EXPECTED,
    INPUT_ERROR,
    ColumnMap,
    SourceBatch,
    SourceInfo,
    inspect_source,
    iter_batches,
    resolve_inputs,
)

__all__ = [
    "DEFAULT_EXPECTED",
    "INPUT_ERROR",
    "ColumnMap",
    "SourceBatch",
    "SourceInfo",
    "inspect_source",
    "iter_batches",
    "resolve_inputs",
]
