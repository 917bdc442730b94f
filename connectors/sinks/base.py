"""The sink protocol and what every warehouse sink shares: one conformed, counted stream of a
run's part files, and the column comparison that guards an existing table.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from ctxprec.storage.core.errors import ConfigError, OutputError, UserError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.files.objpath import ObjPath, OutPath, readable

__all__ = [
    "RowCounter",
    "Sink",
    "SinkResult",
    "check_creatable",
    "counted",
    "error_summary",
    "passthrough_columns",
    "raise_append_error",
    "raise_if_differs",
    "read_parts",
    "require_package",
    "schema_one_hint",
]


@dataclass(frozen=True)
class SinkResult:
    """What one append did: rows written, and rows skipped because their id was in the table."""

    sink: str
    rows_added: int
    rows_skipped: int


class Sink(Protocol):
    """A warehouse table that a run's part files are appended to, each id at most once."""

    name: str  # e.g. "delta:/data/scores": shown to the user, never holds a secret

    def check(self, schema: pa.Schema) -> None:
        """Before the run: the target is reachable or creatable, and an existing table has
        exactly the columns of `schema` (same names and types) — else OutputError."""
        ...

    def append(
        self, outdir: OutPath, files: Sequence[str], schema: pa.Schema, partition_by: Sequence[str]
    ) -> SinkResult:
        """Add the rows of `files` (paths relative to `outdir`) whose id is not yet in the table,
        in one transaction: on any error the table is left as it was."""
        ...


def read_parts(
    outdir: OutPath,
    files: Sequence[str],
    schema: pa.Schema,
    partition_by: Sequence[str],
    seams: Seams = DEFAULT,
) -> pa.RecordBatchReader:
    """One stream over the part files, every batch cast and ordered exactly as `schema`.

    Hive partition columns are read from the relative paths (as strings, then cast). Rows with
    status `failed` are held back: a sink keeps each id once, so a failed row loaded now would
    block the scored row of the re-run that fills it in.
    """
    # here, not at the top: pyarrow.dataset imports pandas (~0.15 s), and only a sink needs it
    import pyarrow.dataset as ds

    paths = [outdir / rel for rel in files]
    _check_part_columns(outdir, paths, schema, partition_by)
    as_read = pa.schema(
        [pa.field(f.name, pa.string()) if f.name in partition_by else f for f in schema]
    )
    partitioning = None
    if partition_by:
        keys = pa.schema([pa.field(name, pa.string()) for name in partition_by])
        partitioning = ds.partitioning(keys, flavor="hive")
    if isinstance(outdir, ObjPath):  # the object store's own paths, read through pyarrow.fs
        dataset = ds.dataset(
            [p.path for p in paths if isinstance(p, ObjPath)],
            schema=as_read,
            format="parquet",
            partitioning=partitioning,
            partition_base_dir=outdir.path,
            filesystem=outdir.fs,
        )
    else:
        dataset = ds.dataset(
            [str(p) for p in paths],
            schema=as_read,
            format="parquet",
            partitioning=partitioning,
            partition_base_dir=str(outdir),
        )
    keep = ds.field("status") != "failed"
    batches = dataset.scanner(columns=schema.names, filter=keep).to_batches()
    return pa.RecordBatchReader.from_batches(schema, _conform(batches, schema, seams))


def _conform(
    batches: Iterator[pa.RecordBatch], schema: pa.Schema, seams: Seams
) -> Iterator[pa.RecordBatch]:
    for index, batch in enumerate(batches):
        seams.at("sink_batch", index)
        columns = [batch.column(f.name).cast(f.type) for f in schema]
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


def passthrough_columns(schema: pa.Schema) -> list[str]:
    """The output's columns copied from the input (between `id` and `score`): a later
    --incremental run may add some, which the rows of earlier runs hold as null."""
    names = schema.names
    return names[1 : names.index("score")] if "score" in names else []


def _check_part_columns(
    outdir: OutPath, paths: Sequence[OutPath], schema: pa.Schema, partition_by: Sequence[str]
) -> None:
    """Footers only: a missing file or column fails here, not as silent nulls mid-load (a
    passthrough column an earlier run did not write is read as null)."""
    skip = {*partition_by, *passthrough_columns(schema)}
    wanted = [name for name in schema.names if name not in skip]
    for path in paths:
        if not path.is_file():
            raise OutputError(f"part file {path} is missing; rerun the scoring run for {outdir}")
        have = set(pq.read_schema(readable(path)).names)
        missing = [name for name in wanted if name not in have]
        if missing:
            raise OutputError(
                f"part file {path} lacks column(s) {missing}; it was not written by this "
                f"version of ctxprec: rerun the scoring run into a new folder"
            )


class RowCounter:
    """How many rows passed through a stream made by `counted`, and the error that ended it."""

    rows: int = 0
    error: Exception | None = None


def counted(reader: pa.RecordBatchReader) -> tuple[pa.RecordBatchReader, RowCounter]:
    """The same stream, counting the rows the consumer pulls."""
    counter = RowCounter()

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            for batch in reader:
                counter.rows += batch.num_rows
                yield batch
        except Exception as exc:  # the engine only sees a C-stream error: keep the real one
            counter.error = exc
            raise

    return pa.RecordBatchReader.from_batches(reader.schema, batches()), counter


def raise_if_differs(
    sink: str,
    expected: Mapping[str, str],
    actual: Mapping[str, str],
    addable: Collection[str] = (),
) -> list[str]:
    """Column name -> type name, both in the target's own type names; order does not matter.
    When all that differs is `addable` columns the table lacks, they are returned for the sink
    to add (a passthrough column a later --incremental run added to the output); a table that
    differs otherwise is refused, every difference named."""
    missing = [name for name in expected if name not in actual]
    extra = [name for name in actual if name not in expected]
    changed = [
        f"{name} (table {actual[name]}, output {expected[name]})"
        for name in expected
        if name in actual and actual[name] != expected[name]
    ]
    problems = [
        f"{label}: {', '.join(names)}"
        for label, names in (("missing", missing), ("unexpected", extra), ("type", changed))
        if names
    ]
    if not problems or (not extra and not changed and set(missing) <= set(addable)):
        return missing
    raise OutputError(
        f"{sink}: the existing table's columns differ from ctxprec's output "
        f"({'; '.join(problems)}); append to a new table instead{schema_one_hint(actual)}"
    )


def schema_one_hint(columns: Iterable[str]) -> str:
    """For a table made from output schema 1 (one token pair, `input_tokens`/`output_tokens`):
    what became of its columns and where the migration is written; "" for any other table."""
    names = set(columns)
    if not {"input_tokens", "output_tokens"} <= names or "verdict_input_tokens" in names:
        return ""
    return (
        ", or migrate this one: it was made from ctxprec's output schema 1, whose "
        "input_tokens/output_tokens are verdict_input_tokens/verdict_output_tokens in schema 2, "
        "beside the new paid_input_tokens/paid_output_tokens (docs/output.md, "
        '"Schema versions", has the SQL)'
    )


def require_package(module: str, sink: str) -> None:
    """Before the run: the sink's engine (an optional extra) can be imported."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{sink} needs the `{module}` package, which is not installed: "
            "pip install 'ctxprec[warehouse]' (or drop the --sink)"
        ) from None


def check_creatable(path: Path, sink: str) -> None:
    """A local target that does not exist yet: its nearest existing ancestor is writable."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{sink}: cannot create {path}: {parent} is not a writable folder")


def error_summary(exc: BaseException) -> str:
    """The first line of an error, without the Python traceback engines append to theirs."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0].split(" Detail: Python exception")[0]


def raise_append_error(sink: str, exc: Exception, counter: RowCounter) -> NoReturn:
    """Report a failed append by its root cause: the source's own error when the stream broke."""
    cause = counter.error or exc
    if isinstance(cause, UserError):
        raise cause
    raise OutputError(
        f"{sink}: the append failed and the table is as it was: {error_summary(cause)}"
    ) from cause
