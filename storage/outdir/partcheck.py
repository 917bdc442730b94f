"""A committed part file checked against its commit record before it is trusted: a run that
resumes (or adds to) a folder, `ctxprec summary`, `compare` and `view` all read what the records
name, and a part truncated, rewritten or swapped for another file must be caught there, not
found by a Parquet reader half-way through (exit 3, `_SUCCESS` already gone).

When a part is written its bytes are in hand, so its record keeps, for each file, its size, a
CRC-32 of its bytes, its row count and a fingerprint of its Arrow schema (`checks_of`). Checking
a file (`file_problem`) compares those with the file as it is now: size first (a stat), then the
CRC (one read of the file: about 2.8 GB/s here), then the Parquet footer (rows, schema). A record
written before these checks existed is checked by what it carries: the file must read as Parquet
and the files' rows must add up to the record's. In an object store the CRC is not checked
(it would mean downloading every part): size, footer, rows and schema are.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from ctxprec.storage.files import confine
from ctxprec.storage.files.objpath import OutPath, readable

__all__ = ["MISSING", "checks_of", "file_problem", "record_problems", "schema_print"]

MISSING = "missing"
_CHUNK = 1 << 20  # bytes read at a time for the CRC


def schema_print(schema: pa.Schema) -> str:
    """A short fingerprint of an Arrow schema's field names and types (metadata left out)."""
    text = schema.remove_metadata().to_string(show_field_metadata=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _crc(data: Any) -> str:
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def checks_of(data: pa.Buffer) -> dict[str, Any]:
    """What a part file's record keeps of it, from the bytes about to be written."""
    import pyarrow.parquet as pq

    meta = pq.read_metadata(pa.BufferReader(data))
    return {
        "bytes": data.size,
        "rows": meta.num_rows,
        "crc32": _crc(memoryview(data)),
        "schema": schema_print(meta.schema.to_arrow_schema()),
    }


def _file_crc(path: Path) -> str:
    crc = 0
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc & 0xFFFFFFFF:08x}"


def _size(path: OutPath) -> int:
    return int(path.stat().st_size)


def file_problem(path: OutPath, expect: Mapping[str, Any] | None) -> tuple[str | None, int]:
    """(what is wrong with part file `path` against what its record keeps of it, or None; the
    rows its footer holds). `expect` None: a record from before the checks (footer only)."""
    import pyarrow.parquet as pq

    if not confine.is_regular(path):
        return MISSING, 0
    expect = expect or {}
    try:
        size = _size(path)
        want = expect.get("bytes")
        if isinstance(want, int) and size != want:
            return f"{size:,} bytes where its record says {want:,}", 0
        want = expect.get("crc32")
        if isinstance(want, str) and isinstance(path, Path) and _file_crc(path) != want:
            return "rewritten: its bytes are not those its record's checksum was made of", 0
        meta = pq.read_metadata(readable(path))
    except (OSError, pa.ArrowException) as exc:
        why = " ".join(str(exc).split())[:200]
        return f"not a Parquet file ctxprec can read ({why})", 0
    rows = int(meta.num_rows)
    want = expect.get("rows")
    if isinstance(want, int) and rows != want:
        return f"{rows:,} rows where its record says {want:,}", rows
    want = expect.get("schema")
    if isinstance(want, str) and schema_print(meta.schema.to_arrow_schema()) != want:
        return "another schema than the one its record names", rows
    return None, rows


def record_problems(outdir: OutPath, record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """[(file relative to OUTDIR, what is wrong)] of one checked commit record (`files`, `rows`,
    and `checks` when it has them); [] when every file is as its record says."""
    checks = record.get("checks") or {}
    found: list[tuple[str, str]] = []
    total = 0
    files = [str(rel) for rel in record.get("files", [])]
    for rel in files:
        expect = checks.get(rel)
        problem, rows = file_problem(outdir / rel, expect if isinstance(expect, dict) else None)
        if problem is not None:
            found.append((rel, problem))
        total += rows
    want = record.get("rows")
    if not found and files and isinstance(want, int) and total != want:
        held = f"its {len(files)} files hold" if len(files) > 1 else "it holds"
        found.append((files[0], f"{held} {total:,} rows where its record says {want:,}"))
    return found
