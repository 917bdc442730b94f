"""`--sink delta:PATH`: append a run's rows to a Delta Lake table (the `deltalake` package),
creating it on first use; each id at most once, in one commit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa

from ctxprec.connectors.sinks.base import (
    SinkResult,
    check_creatable,
    counted,
    error_summary,
    passthrough_columns,
    raise_append_error,
    raise_if_differs,
    read_parts,
    require_package,
)
from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.files.objpath import OutPath

if TYPE_CHECKING:
    from deltalake import DeltaTable, WriterProperties

__all__ = ["DeltaSink"]

# Insert-only MERGE: a source row whose id is already in the table is skipped, never updated.
_MERGE_ON = "target.id = source.id"


def _redact(uri: str) -> str:
    """The URI without any user:password part, fit for messages."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _local_path(uri: str) -> Path | None:
    """The folder of a local table; None for an object-store URI."""
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    return None if "://" in uri else Path(uri)


def _storage_options(uri: str) -> dict[str, str] | None:
    """delta-rs reads credentials and AWS_ENDPOINT_URL from the environment itself; an s3://
    table behind a plain-http endpoint (MinIO, a loopback test server) also needs allow_http."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL", "")
    if uri.startswith(("s3://", "s3a://")) and endpoint.startswith("http://"):
        return {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"}
    return None


def _column_types(schema: pa.Schema) -> dict[str, str]:
    """Column -> type name as Delta stores it (so Arrow spellings like list field names agree)."""
    from deltalake import Schema

    try:
        stored = pa.schema(Schema.from_arrow(schema).to_arrow())
    except Exception as exc:
        raise OutputError(f"the output schema cannot be stored in Delta: {exc}") from exc
    return {field.name: str(field.type) for field in stored}


class DeltaSink:
    """A Delta table at a local path or object-store URI (credentials from the environment).

    Dedup and atomicity: the first append creates the table and writes the rows in one commit
    (version 0; a run's ids are unique, the source checks that). Later appends are one insert-only
    MERGE on `id`: delta-rs streams the source, anti-joins it against the table and commits once;
    if the stream or the commit fails, nothing is committed and the table stays at its version.
    A concurrent writer that adds data meanwhile makes the commit fail rather than duplicate ids.
    """

    def __init__(self, path: str, seams: Seams = DEFAULT) -> None:
        self.path, self.seams = path, seams
        self.name = f"delta:{_redact(path)}"

    def check(self, schema: pa.Schema) -> None:
        require_package("deltalake", self.name)
        local = _local_path(self.path)
        if local is not None and local.exists() and not local.is_dir():
            raise OutputError(f"{self.name}: {local} is a file; give a folder for the table")
        table = self._open()
        if table is not None:
            actual = pa.schema(table.schema().to_arrow())
            expected, have = _column_types(schema), _column_types(actual)
            raise_if_differs(self.name, expected, have, passthrough_columns(schema))
        elif local is not None:
            check_creatable(local, self.name)

    def append(
        self, outdir: OutPath, files: Sequence[str], schema: pa.Schema, partition_by: Sequence[str]
    ) -> SinkResult:
        self.check(schema)
        table = self._open()
        stream, counter = counted(read_parts(outdir, files, schema, partition_by, self.seams))
        try:
            if table is None:
                self._create(stream, partition_by)
                added = counter.rows
            else:
                have = set(pa.schema(table.schema().to_arrow()).names)
                added = self._merge(table, stream, grows=not set(schema.names) <= have)
        except Exception as exc:
            raise_append_error(self.name, exc, counter)
        return SinkResult(self.name, added, counter.rows - added)

    def _open(self) -> DeltaTable | None:
        from deltalake import DeltaTable

        try:
            options = _storage_options(self.path)
            if not DeltaTable.is_deltatable(self.path, storage_options=options):
                return None
            return DeltaTable(self.path, storage_options=options)
        except Exception as exc:
            raise OutputError(f"{self.name}: cannot open the table: {error_summary(exc)}") from exc

    def _create(self, stream: pa.RecordBatchReader, partition_by: Sequence[str]) -> None:
        from deltalake import write_deltalake

        write_deltalake(
            self.path,
            stream,
            storage_options=_storage_options(self.path),
            mode="error",  # a table that appeared since `_open` is not overwritten
            partition_by=list(partition_by) or None,
            name="ctxprec scores",
            description="context precision scores written by ctxprec",
            writer_properties=_writer_properties(),
        )

    def _merge(self, table: DeltaTable, stream: pa.RecordBatchReader, grows: bool) -> int:
        """`grows`: the output has columns the table lacks (passthrough columns a later
        --incremental run added): the same commit adds them, null in the rows already there."""
        metrics = (
            table.merge(
                stream,
                _MERGE_ON,
                source_alias="source",
                target_alias="target",
                merge_schema=grows,
                writer_properties=_writer_properties(),
                streamed_exec=True,
            )
            .when_not_matched_insert_all()
            .execute()
        )
        return int(metrics["num_target_rows_inserted"])


def _writer_properties() -> WriterProperties:
    from deltalake import WriterProperties

    return WriterProperties(compression="ZSTD")
