"""The texts summary.html shows, read back from the run's input: the rows asked for, from every
row group that holds one, whatever the id column's type; nothing for ids the input lacks; no
lookup once the file has changed."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ctxprec.connectors.sources.lookup import input_texts


def _describe(path: Path, columns: list[str | None]) -> dict[str, object]:
    stat = path.stat()
    return {
        "columns": columns,
        "files": [[str(path), stat.st_size, stat.st_mtime_ns]],
    }


def _write(path: Path, ids: pa.Array) -> None:
    n = len(ids)
    table = pa.table(
        {
            "id": ids,
            "query": [f"query {i}" for i in range(n)],
            "contexts": [[f"item {i}.{p}" for p in range(3)] for i in range(n)],
        }
    )
    pq.write_table(table, path, row_group_size=7)  # many small row groups


def test_the_rows_asked_for_come_back_from_every_row_group(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    _write(path, pa.array([f"r{i:03d}" for i in range(50)]))
    lookup = input_texts(_describe(path, ["id", "query", None, "contexts"]))
    assert lookup is not None
    asked = ["r000", "r013", "r049", "r404"]  # first, middle and last row group; one not there
    got = lookup(asked)
    assert sorted(got) == ["r000", "r013", "r049"]
    assert got["r013"]["query"] == "query 13"
    assert got["r013"]["context"] == ["item 13.0", "item 13.1", "item 13.2"]
    assert lookup([]) == {}


def test_integer_ids_are_matched_as_text_and_a_changed_file_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    _write(path, pa.array(range(30), pa.int64()))
    describe = _describe(path, ["id", "query", None, "contexts"])
    lookup = input_texts(describe)
    assert lookup is not None
    got = lookup(["3", "29"])
    assert got["29"]["query"] == "query 29"
    os.utime(path, ns=(1, 1))  # touched since the run: its rows may not be the run's
    assert input_texts(describe) is None
