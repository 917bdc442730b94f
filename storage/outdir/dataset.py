"""The scored dataset already in an output folder (the part files ctxprec committed, as
`ctxprec.storage.outdir.ownership` names them): which ids it holds (for incremental runs) and
dropping rows that are about to be re-scored.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path, PurePath

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ctxprec.storage.core.constants import STATUS_FAILED
from ctxprec.storage.files import layout
from ctxprec.storage.files.confine import check_inside, is_regular
from ctxprec.storage.files.objpath import ObjPath, OutPath, readable
from ctxprec.storage.outdir.commit import PartRecord, write_part_file, write_record
from ctxprec.storage.outdir.ownership import named_files, part_files, records

__all__ = ["drop_ids", "parts_schema", "scan_parts", "scored_ids"]


def parts_schema(parts: Sequence[str]) -> pl.Schema | None:
    """The columns of every part file, read from one part of each run that wrote them: a later
    --incremental run may pass through more columns than the earlier ones (their rows read them
    as null). None when every run wrote the same columns (nothing to reconcile)."""
    first: dict[str, str] = {}
    for path in parts:
        first.setdefault(layout.run_of_part(PurePath(path).name), path)
    if len(first) < 2:
        return None
    schemas = [pl.read_parquet_schema(path) for path in first.values()]
    if all(s == schemas[0] for s in schemas):
        return None
    widest = max(schemas, key=lambda schema: len(schema))  # its columns keep their order
    merged = dict(widest)
    for schema in schemas:
        for name, dtype in schema.items():
            merged.setdefault(name, dtype)
    return pl.Schema(merged)


def scan_parts(parts: Sequence[Path | str], file_column: str | None = None) -> pl.LazyFrame:
    """Local part files as one lazy frame (Hive partition columns from their folders), every
    column of every run in it: a column a run did not write reads as null."""
    paths = [str(p) for p in parts]
    return pl.scan_parquet(
        paths,
        schema=parts_schema(paths),
        hive_partitioning=True,
        missing_columns="insert",
        extra_columns="ignore",
        include_file_paths=file_column,
    )


def scored_ids(outdir: OutPath, without: Collection[str] = ()) -> pl.DataFrame:
    """id and status of every row in the folder (one small scan of two columns); `without`: the
    keys of parts left out (missing or damaged: `ownership.incomplete_parts`)."""
    files = part_files(outdir, without)
    if not files:
        return pl.DataFrame({"id": [], "status": []}, schema={"id": pl.String, "status": pl.String})
    if isinstance(outdir, ObjPath):  # object store: read the two columns through pyarrow.fs
        tables = [pq.read_table(readable(f), columns=["id", "status"]) for f in files]
        got = pl.from_arrow(pa.concat_tables(tables, promote_options="permissive"))
        assert isinstance(got, pl.DataFrame)
        return got
    frames = [
        pl.scan_parquet(Path(str(f)), hive_partitioning=False).select("id", "status") for f in files
    ]
    return pl.concat(frames, how="vertical_relaxed").collect()


def drop_ids(outdir: OutPath, ids: Collection[object]) -> int:
    """Rewrite (atomically: rename, or one PUT in an object store) each part file holding any
    of `ids` without those rows, and its commit record with the rows, failed rows and checks
    the part now has."""
    if not ids:
        return 0
    # here, not at the top: pyarrow.compute builds a wrapper for every kernel when imported
    # (~25 ms), and only a re-scoring run drops rows
    import pyarrow.compute as pc

    wanted = list(ids)
    dropped = 0
    for raw in records(outdir).values():
        record = PartRecord(raw["key"], tuple(named_files(raw)), raw["rows"], raw["failed"])
        checks = dict(raw.get("checks") or {})
        gone = failed = 0
        for rel in record.files:
            path = outdir / rel
            if not is_regular(path):
                continue
            table = pq.read_table(readable(path))
            hit = pc.is_in(
                table.column("id"), value_set=pa.array(wanted, type=table.schema.field("id").type)
            )
            n = pc.sum(hit).as_py() or 0
            if not n:
                continue
            lost = table.filter(hit).column("status")
            failed += pc.sum(pc.equal(lost, STATUS_FAILED)).as_py() or 0
            checks[rel] = write_part_file(check_inside(outdir, path), table.filter(pc.invert(hit)))
            gone += int(n)
        if gone:
            rows, left = max(0, record.rows - gone), max(0, record.failed - failed)
            write_record(outdir, replace(record, rows=rows, failed=min(left, rows)), checks)
            dropped += gone
    return dropped
