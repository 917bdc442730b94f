"""Commit of part files: a part's files are named in a pending record before they are written
(each by temp file and rename, or in an object store by one PUT under its final name), and count
as done only once its commit record exists. No rename of the part itself is needed, so the same
protocol holds on S3, GCS and Azure. Which files are ctxprec's is
`ctxprec.storage.outdir.ownership`'s answer, read from these records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.files import confine, layout
from ctxprec.storage.files.atomic import atomic_write, atomic_write_text
from ctxprec.storage.files.layout import COMMITTED, PENDING
from ctxprec.storage.files.objpath import OutPath
from ctxprec.storage.outdir import ownership
from ctxprec.storage.outdir.partcheck import checks_of

__all__ = [
    "PartRecord",
    "commit_part",
    "committed",
    "parquet_bytes",
    "write_part_file",
    "write_record",
]


def parquet_bytes(table: pa.Table) -> pa.Buffer:
    """A part file's bytes (zstd Parquet), made in memory so that its record can keep what
    they are (`partcheck.checks_of`) before they are written."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def _write_bytes(data: pa.Buffer, path: Path) -> None:
    with open(path, "wb") as fh:
        fh.write(memoryview(data))


def write_part_file(target: OutPath, table: pa.Table) -> dict[str, Any]:
    """Write one part file atomically; what its record keeps of it (`partcheck.checks_of`)."""
    data = parquet_bytes(table)
    checks = checks_of(data)
    atomic_write(target, partial(_write_bytes, data))
    return checks


@dataclass(frozen=True, slots=True)
class PartRecord:
    key: str
    files: tuple[str, ...]
    rows: int
    failed: int


def committed(outdir: OutPath, prefix: str = "") -> dict[str, PartRecord]:
    """The commit records of OUTDIR (of the parts whose key starts with `prefix`); blocking I/O."""
    return {
        key: PartRecord(key, tuple(raw["files"]), raw["rows"], raw["failed"])
        for key, raw in ownership.records(outdir, prefix).items()
    }


def commit_part(
    outdir: OutPath,
    key: str,
    tables: Mapping[str, pa.Table],
    *,
    rows: int,
    failed: int,
    seams: Seams = DEFAULT,
) -> PartRecord:
    """Name the files in a pending record, write each atomically, then the commit record.
    A file already at a target path that no record of this part names is never replaced.
    `seams.at("part_write", target)` is called before each file's write. Blocking I/O: call it
    from a thread."""
    files = sorted(tables)
    odd = [rel for rel in files if not layout.is_part_file(rel, key)]
    if odd:  # e.g. a --partition-by column whose name holds `/` or `=`
        raise OutputError(
            f"cannot write {outdir / odd[0]}: not a part file name ctxprec can read back "
            "(col=value folders, part-KEY.parquet); partition by a column whose name holds "
            "no `/` and does not start with `=`"
        )
    _refuse_foreign_targets(outdir, key, files)
    pending = layout.pending_record(outdir, key)
    atomic_write_text(
        confine.check_inside(outdir, pending), json.dumps({"key": key, "files": files})
    )
    checks: dict[str, dict[str, Any]] = {}
    for rel, table in tables.items():
        # checked again right before each write: a folder swapped for a link meanwhile
        target = confine.check_inside(outdir, outdir / rel)
        seams.at("part_write", target)
        checks[rel] = write_part_file(target, table)
    record = PartRecord(key, tuple(files), rows, failed)
    write_record(outdir, record, checks)
    confine.unlink(outdir, pending)
    return record


def write_record(outdir: OutPath, record: PartRecord, checks: Mapping[str, Any]) -> None:
    """The commit record of a part whose files are written: its files, rows, failed rows and
    what each file is (`partcheck`: size, CRC-32, rows, schema)."""
    body = {
        "key": record.key,
        "files": list(record.files),
        "rows": record.rows,
        "failed": record.failed,
        "checks": {rel: checks[rel] for rel in record.files if rel in checks},
    }
    target = confine.check_inside(outdir, layout.commit_record(outdir, record.key))
    atomic_write_text(target, json.dumps(body))


def _refuse_foreign_targets(outdir: OutPath, key: str, files: list[str]) -> None:
    for rel in files:
        confine.check_inside(outdir, outdir / rel)
    taken = [rel for rel in files if (outdir / rel).exists() or (outdir / rel).is_symlink()]
    if not taken:
        return
    named: set[str] = set()
    for suffix in (COMMITTED, PENDING):
        raw = ownership.records(outdir, key, suffix).get(key)
        named.update(raw["files"] if raw else ())
    foreign = [rel for rel in taken if rel not in named]
    if foreign:
        raise OutputError(
            f"{outdir / foreign[0]} exists and ctxprec did not write it; it is left as "
            "it is: move it out of the output folder and run the same command again"
        )
