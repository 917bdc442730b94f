"""Input readers: the streaming source (Parquet, JSON Lines, CSV; files, folders, globs, Hive
datasets, local or in an object store)."""

from ctxprec.connectors.sources.lookup import input_texts
from ctxprec.connectors.sources.stream import (
    SourceChunk,
    SourceInfo,
    inspect_input,
    inspect_source,
    iter_batches,
    read_ids,
    resolve_inputs,
)
from ctxprec.connectors.sources.validate import INPUT_ERROR
from ctxprec.storage.core.settings import DEFAULT_EXPECTED, ColumnMap

__all__ = [
    "DEFAULT_EXPECTED",
    "INPUT_ERROR",
    "ColumnMap",
    "SourceChunk",
    "SourceInfo",
    "input_texts",
    "inspect_input",
    "inspect_source",
    "iter_batches",
    "read_ids",
    "resolve_inputs",
]
