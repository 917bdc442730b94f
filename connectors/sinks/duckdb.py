"""`--sink duckdb:FILE:TABLE`: append a run's rows to a table of a DuckDB database file, creating
it on first use; each id at most once, in one transaction.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

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
from ctxprec.storage.core.errors import ConfigError, OutputError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.files.objpath import OutPath

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

__all__ = ["DuckDBSink"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SOURCE = "__ctxprec_source"
_COLUMNS = (
    "SELECT column_name, data_type FROM information_schema.columns "
    "WHERE table_schema = current_schema() AND lower(table_name) = lower(?) "
    "ORDER BY ordinal_position"
)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _table_columns(con: DuckDBPyConnection, table: str) -> dict[str, str]:
    """Column -> DuckDB type name of `table`; empty when there is no such table."""
    return {str(name): str(kind) for name, kind in con.execute(_COLUMNS, [table]).fetchall()}


def _duckdb_types(schema: pa.Schema) -> dict[str, str]:
    """The DuckDB type of each Arrow column, as DuckDB itself maps it (list<bool> -> BOOLEAN[],
    timestamp[us, UTC] -> TIMESTAMP WITH TIME ZONE, ...), from an in-memory empty table."""
    import duckdb

    con = duckdb.connect()
    try:
        con.register("__ctxprec_empty", schema.empty_table())
        con.execute("CREATE TABLE expected AS SELECT * FROM __ctxprec_empty")
        return _table_columns(con, "expected")
    finally:
        con.close()


def _create_sql(table: str, schema: pa.Schema, types: dict[str, str]) -> str:
    columns = ", ".join(
        f"{_quote(f.name)} {types[f.name]}{'' if f.nullable else ' NOT NULL'}" for f in schema
    )
    return f"CREATE TABLE IF NOT EXISTS {_quote(table)} ({columns})"


def _insert_sql(table: str) -> str:
    """Insert by name the source rows whose id the table lacks (planned as an anti join)."""
    target = _quote(table)
    return (
        f"INSERT INTO {target} BY NAME SELECT * FROM {_SOURCE} AS s "
        f"WHERE NOT EXISTS (SELECT 1 FROM {target} AS t WHERE t.id = s.id)"
    )


class DuckDBSink:
    """One table of a DuckDB file.

    Dedup and atomicity: BEGIN; CREATE TABLE IF NOT EXISTS; INSERT ... WHERE NOT EXISTS (same id)
    reading the run's part files as a registered Arrow stream; COMMIT. Any error (a broken
    stream included) rolls back, so a new table is not left behind either. DuckDB allows one
    writing process per file, so no other writer can slip ids in between.
    """

    def __init__(self, file: str | Path, table: str, seams: Seams = DEFAULT) -> None:
        self.seams = seams
        if not _IDENTIFIER.fullmatch(table):
            raise ConfigError(
                f"DuckDB table name {table!r} is not a plain identifier; use letters, digits "
                "and underscores, e.g. duckdb:scores.duckdb:context_precision"
            )
        self.file = Path(file)
        self.table = table
        self.name = f"duckdb:{self.file}:{table}"

    def check(self, schema: pa.Schema) -> None:
        require_package("duckdb", self.name)
        if not self.file.exists():
            check_creatable(self.file, self.name)
            return
        con = self._connect(read_only=True)
        try:
            actual = _table_columns(con, self.table)
        finally:
            con.close()
        if actual:
            raise_if_differs(self.name, _duckdb_types(schema), actual, passthrough_columns(schema))

    def append(
        self, outdir: OutPath, files: Sequence[str], schema: pa.Schema, partition_by: Sequence[str]
    ) -> SinkResult:
        types = _duckdb_types(schema)
        stream, counter = counted(read_parts(outdir, files, schema, partition_by, self.seams))
        self.file.parent.mkdir(parents=True, exist_ok=True)
        con = self._connect(read_only=False)
        try:
            added = self._load(con, schema, types, stream)
        except Exception as exc:
            with contextlib.suppress(Exception):
                con.rollback()
            raise_append_error(self.name, exc, counter)
        finally:
            con.close()
        return SinkResult(self.name, added, counter.rows - added)

    def _load(
        self,
        con: DuckDBPyConnection,
        schema: pa.Schema,
        types: dict[str, str],
        stream: pa.RecordBatchReader,
    ) -> int:
        con.begin()
        con.execute(_create_sql(self.table, schema, types))
        have = _table_columns(con, self.table)
        for name in raise_if_differs(self.name, types, have, passthrough_columns(schema)):
            # a passthrough column a later --incremental run added: null in the rows there
            con.execute(f"ALTER TABLE {_quote(self.table)} ADD COLUMN {_quote(name)} {types[name]}")
        raise_if_differs(self.name, types, _table_columns(con, self.table))
        con.register(_SOURCE, stream)
        row = con.execute(_insert_sql(self.table)).fetchone()
        con.commit()
        return int(row[0]) if row else 0

    def _connect(self, *, read_only: bool) -> DuckDBPyConnection:
        import duckdb

        try:
            return duckdb.connect(str(self.file), read_only=read_only)
        except duckdb.Error as exc:
            raise OutputError(
                f"{self.name}: cannot open {self.file} ({error_summary(exc)}); "
                "is it a DuckDB file, and is no other process writing to it?"
            ) from exc
