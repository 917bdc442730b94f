"""The streaming Parquet source: input resolution, normalized batches, keys, skip, and every
up-front input error, on real Parquet files written to tmp_path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.connectors.sources import (
    INPUT_ERROR,
    ColumnMap,
    SourceChunk,
    SourceInfo,
    inspect_source,
    iter_batches,
    resolve_inputs,
)
from ctxprec.storage.core.errors import ConfigError, InputError

COLS = ColumnMap()


def write(path: Path, *, rows: int = 3, start: int = 0, **overrides: Any) -> Path:
    """A valid input file (id, query, contexts) with columns replaced or added by `overrides`."""
    data: dict[str, Any] = {
        "id": [f"r{start + i}" for i in range(rows)],
        "query": [f"q{i}" for i in range(rows)],
        "contexts": [[f"c{i}", "other"] for i in range(rows)],
    }
    data.update(overrides)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data), path)
    return path


def inspect(spec: Path | str, columns: ColumnMap = COLS, **kw: Any) -> SourceInfo:
    return inspect_source(spec, columns, use_extractor=kw.pop("use_extractor", False), **kw)


def batches(info: SourceInfo, columns: ColumnMap = COLS, **kw: Any) -> list[SourceChunk]:
    return list(iter_batches(info, columns, batch_rows=kw.pop("batch_rows", 100), **kw))


def fails(message: str, spec: Path | str, columns: ColumnMap = COLS, **kw: Any) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        inspect(spec, columns, **kw)


# ---------------------------------------------------------------- resolving inputs


def paths(spec: str | Path) -> list[Path]:
    return [Path(f.path) for f in resolve_inputs(spec)]


def test_resolve_single_file(tmp_path: Path) -> None:
    f = write(tmp_path / "one.parquet")
    assert paths(f) == [f]
    assert paths(str(f)) == [f]


def test_resolve_folder_is_recursive_sorted_and_skips_hidden(tmp_path: Path) -> None:
    b = write(tmp_path / "b.parquet")
    a = write(tmp_path / "sub" / "a.parquet")
    for skipped in ["_tmp.parquet", ".x.parquet", "_temporary/y.parquet", ".hidden/z.parquet"]:
        write(tmp_path / skipped)
    (tmp_path / "notes.txt").write_text("not data")
    assert paths(tmp_path) == [b, a]


def test_resolve_glob_with_double_star(tmp_path: Path) -> None:
    files = [write(tmp_path / p) for p in ["x/1.parquet", "x/y/2.parquet", "3.parquet"]]
    write(tmp_path / "x" / "_skip.parquet")
    assert paths(f"{tmp_path}/**/*.parquet") == sorted(files, key=Path.as_posix)
    assert paths(f"{tmp_path}/x/*.parquet") == [files[0]]


def test_resolve_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist; give a Parquet, JSON Lines or CSV file"):
        resolve_inputs(tmp_path / "nope.parquet")
    with pytest.raises(InputError, match=re.escape("matched no input files")):
        resolve_inputs(f"{tmp_path}/*.parquet")
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(InputError, match=re.escape("holds no input files")):
        resolve_inputs(tmp_path)


# ---------------------------------------------------------------- normalized batches


def test_frame_has_normalized_columns_and_types(tmp_path: Path) -> None:
    f = write(
        tmp_path / "in.parquet",
        id=pa.array([1, 2, 3], pa.int32()),
        query=pa.array(["a", "b", "c"], pa.large_string()),
        contexts=pa.array([["x", None], None, []], pa.large_list(pa.string())),
        gold=pa.array(["g", None, "h"]).dictionary_encode(),
        human=pa.array([[True, False], None, []], pa.list_(pa.bool_())),
        extra=[1.5, 2.5, 3.5],
    )
    cols = ColumnMap(expected="gold", labels="human", passthrough=("extra",))
    info = inspect(f, cols)
    assert (info.total_rows, info.id_type, info.has_expected) == (3, pa.int32(), True)
    assert info.passthrough_fields == (pa.field("extra", pa.float64()),)
    [batch] = batches(info, cols)
    assert batch.frame.schema == pl.Schema(
        [
            ("id", pl.Int32()),
            ("query", pl.String()),
            ("expected", pl.String()),
            ("context", pl.List(pl.String)),
            ("labels", pl.List(pl.Boolean)),
            ("extra", pl.Float64()),
        ]
    )
    assert batch.frame["context"].to_list() == [["x", None], None, []]
    assert batch.frame["expected"].to_list() == ["g", None, "h"]


def test_absent_default_expected_gives_null_column(tmp_path: Path) -> None:
    info = inspect(write(tmp_path / "in.parquet"))
    assert info.has_expected is False
    [batch] = batches(info)
    assert batch.frame.columns == ["id", "query", "expected", "context"]
    assert batch.frame["expected"].dtype == pl.String
    assert batch.frame["expected"].null_count() == 3


def test_id_source_column_is_passed_through(tmp_path: Path) -> None:
    f = write(tmp_path / "in.parquet", request_id=["a", "b", "c"])
    cols = ColumnMap(id="request_id")
    info = inspect(f, cols)
    assert info.passthrough_fields == (pa.field("request_id", pa.string()),)
    [batch] = batches(info, cols)
    assert batch.frame["id"].to_list() == batch.frame["request_id"].to_list() == ["a", "b", "c"]


def test_null_typed_columns_are_accepted(tmp_path: Path) -> None:
    f = write(
        tmp_path / "in.parquet",
        contexts=pa.array([None, [None], []], pa.list_(pa.null())),
        expected_output=pa.array([None] * 3, pa.null()),
    )
    info = inspect(f)
    [batch] = batches(info)
    assert batch.frame["context"].dtype == pl.List(pl.String)
    assert batch.frame["expected"].dtype == pl.String


def test_hive_dataset_adds_partition_columns(tmp_path: Path) -> None:
    write(tmp_path / "dt=2026-11-30" / "region=eu" / "part.parquet", start=0)
    write(tmp_path / "dt=2026-12-01" / "region=us%2Fwest" / "part.parquet", start=3)
    write(tmp_path / "dt=2026-12-02" / "region=__HIVE_DEFAULT_PARTITION__" / "p.parquet", start=6)
    info = inspect(tmp_path)
    assert info.partition_columns == ("dt", "region")
    assert info.passthrough_fields == (pa.field("dt", pa.string()), pa.field("region", pa.string()))
    frame = pl.concat([b.frame for b in batches(info)])
    assert frame.columns == ["id", "query", "expected", "context", "dt", "region"]
    assert frame["dt"].unique(maintain_order=True).to_list() == [
        "2026-11-30",
        "2026-12-01",
        "2026-12-02",
    ]
    assert frame["region"].unique(maintain_order=True).to_list() == ["eu", "us/west", None]
    assert inspect(f"{tmp_path}/dt=*/*/*.parquet").partition_columns == ("dt", "region")


def test_extractor_mode_reads_the_whole_row(tmp_path: Path) -> None:
    f = write(tmp_path / "dt=1" / "in.parquet", docs=["a|b", "c", ""])
    cols = ColumnMap(context=None)
    info = inspect(tmp_path, cols, use_extractor=True)
    [batch] = batches(info, cols)
    assert Path(batch.file.path) == f
    assert batch.frame["context"].null_count() == 3
    assert batch.frame["source_row"][0] == {
        "id": "r0",
        "query": "q0",
        "contexts": ["c0", "other"],
        "docs": "a|b",
        "dt": "1",
    }


def test_no_context_and_no_extractor_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("no context source")):
        inspect(write(tmp_path / "in.parquet"), ColumnMap(context=None))


def test_zero_row_file_is_valid(tmp_path: Path) -> None:
    empty = {"id": pa.array([], pa.string()), "contexts": pa.array([], pa.list_(pa.string()))}
    info = inspect(write(tmp_path / "in.parquet", rows=0, **empty))
    assert info.total_rows == 0
    assert batches(info) == []


# ---------------------------------------------------------------- streaming, keys, skip


@pytest.fixture
def two_files(tmp_path: Path) -> SourceInfo:
    big = tmp_path / "a.parquet"
    pq.write_table(pa.table(write_data(25)), big, row_group_size=7)
    write(tmp_path / "b.parquet", rows=5, start=100)
    return inspect(tmp_path)


def write_data(rows: int) -> dict[str, Any]:
    return {
        "id": [f"r{i}" for i in range(rows)],
        "query": ["q"] * rows,
        "contexts": [["c"]] * rows,
        "unused": ["x" * 100] * rows,
    }


def test_batches_stream_with_iter_batches(
    two_files: SourceInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, list[str]]] = []
    real = pq.ParquetFile.iter_batches

    def spy(self: pq.ParquetFile, *args: Any, **kw: Any) -> Any:
        calls.append((kw["batch_size"], kw["columns"]))
        return real(self, *args, **kw)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    got = batches(two_files, batch_rows=4)
    assert [b.frame.height for b in got] == [4, 4, 4, 4, 4, 4, 1, 4, 1]
    assert calls == [(4, ["id", "query", "contexts"])] * 2  # never the `unused` column


def test_batch_keys_are_deterministic(two_files: SourceInfo) -> None:
    first = [(b.key, b.file.name, b.first_row) for b in batches(two_files, batch_rows=4)]
    again = [(b.key, b.file.name, b.first_row) for b in batches(two_files, batch_rows=4)]
    assert first == again
    assert first[5:] == [
        ("00000-00005", "a.parquet", 20),
        ("00000-00006", "a.parquet", 24),
        ("00001-00000", "b.parquet", 0),
        ("00001-00001", "b.parquet", 4),
    ]
    # batch count is predictable from the footer (ceil(rows / batch_rows)) across row groups
    for size in (1, 3, 7, 10, 25, 26):
        keys = [b.key for b in batches(two_files, batch_rows=size) if b.key.startswith("00000")]
        assert len(keys) == -(-25 // size)


def test_skip_leaves_out_committed_parts_without_converting(
    two_files: SourceInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    converted: list[int] = []
    real = pl.from_arrow

    def spy(batch: pa.RecordBatch) -> Any:
        converted.append(batch.num_rows)
        return real(batch)

    monkeypatch.setattr(pl, "from_arrow", spy)
    got = batches(two_files, batch_rows=10, skip={"00000-00000", "00000-00002"})
    assert [(b.key, b.first_row) for b in got] == [("00000-00001", 10), ("00001-00000", 0)]
    assert got[0].frame["id"].to_list() == [f"r{i}" for i in range(10, 20)]
    assert converted == [10, 5]


def test_fully_skipped_file_is_not_read(
    two_files: SourceInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[int] = []
    real = pq.ParquetFile.iter_batches

    def spy(self: pq.ParquetFile, *args: Any, **kw: Any) -> Any:
        read.append(self.metadata.num_rows)
        return real(self, *args, **kw)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    got = batches(two_files, batch_rows=10, skip={"00000-00000", "00000-00001", "00000-00002"})
    assert [b.key for b in got] == ["00001-00000"]
    assert read == [5]  # only b.parquet (5 rows) was decoded


def test_batch_rows_must_be_positive(two_files: SourceInfo) -> None:
    with pytest.raises(ConfigError, match="batch_rows must be at least 1"):
        batches(two_files, batch_rows=0)


# ---------------------------------------------------------------- up-front errors


def test_missing_file(tmp_path: Path) -> None:
    fails("input " + str(tmp_path / "gone.parquet") + " does not exist", tmp_path / "gone.parquet")


def test_not_parquet(tmp_path: Path) -> None:
    f = tmp_path / "data.parquet"
    f.write_text("id,query\n1,hi\n")
    fails(f"{f} is not a Parquet file", f)


def test_truncated_parquet(tmp_path: Path) -> None:
    f = write(tmp_path / "data.parquet")
    f.write_bytes(f.read_bytes()[:-40])
    fails(f"{f} is a corrupt or truncated Parquet file", f)


def test_zero_byte_file(tmp_path: Path) -> None:
    f = tmp_path / "data.parquet"
    f.write_bytes(b"")
    fails(f"{f} is empty (0 bytes)", f)


def test_missing_mapped_columns(tmp_path: Path) -> None:
    f = write(tmp_path / "x.parquet")
    fails(
        f"column `question` is missing in {f} (columns: id, query, contexts); "
        'map it with --map query=COLUMN or [columns] query = "COLUMN"',
        f,
        ColumnMap(query="question"),
    )
    fails("column `docs` is missing", f, ColumnMap(context="docs"))
    fails("column `uid` is missing", f, ColumnMap(id="uid"))
    fails("column `human` is missing", f, ColumnMap(labels="human"))


@pytest.mark.parametrize(
    ("column", "values", "message"),
    [
        (
            "query",
            [1, 2, 3],
            "column `query` (query) in {f} has type int64; query must be a string",
        ),
        ("query", [b"\xff", b"a", b"b"], "has type binary; query must be a string column; binary"),
        ("contexts", [[1], [2], []], "context must be a list<string> column"),
        ("contexts", [[1], [2], []], "the context items must be strings"),
        ("contexts", ["a", "b", "c"], "has type string; context must be a list<string>"),
        ("id", [1.5, 2.5, 3.5], "column `id` (id) in {f} has type double; id must be a string"),
        ("expected_output", [1, 2, 3], "expected must be a string column"),
    ],
)
def test_wrong_column_types(tmp_path: Path, column: str, values: list[Any], message: str) -> None:
    overrides: dict[str, Any] = {column: values}
    f = write(tmp_path / "x.parquet", **overrides)
    fails(message.format(f=f), f)


def test_wrong_labels_type(tmp_path: Path) -> None:
    f = write(tmp_path / "x.parquet", human=["yes", "no", "yes"])
    fails("column `human` (labels) in", f, ColumnMap(labels="human"))


def test_null_id(tmp_path: Path) -> None:
    f = write(tmp_path / "x.parquet", id=["a", None, "c"])
    fails(f"column `id` (id) is null in {f} row 2 (1 null ids in total)", f)  # from 1


def test_duplicate_ids_across_files(tmp_path: Path) -> None:
    a = write(tmp_path / "a.parquet", id=["x", "y", "z"])
    b = write(tmp_path / "b.parquet", id=["w", "y", "v"])
    fails(
        f"duplicate id 'y' in column `id`: {a} row 2; {b} row 2 (1 duplicated id in total", tmp_path
    )


def test_duplicate_integer_ids_within_a_file(tmp_path: Path) -> None:
    f = write(tmp_path / "a.parquet", id=[7, 8, 7])
    fails(f"duplicate id 7 in column `id`: {f} row 1; {f} row 3", f)


def test_explicit_expected_column_missing(tmp_path: Path) -> None:
    f = write(tmp_path / "x.parquet")
    fails("column `gold` is missing", f, ColumnMap(expected="gold"))
    fails("column `expected_output` is missing", f, expected_explicit=True)
    assert inspect(f).has_expected is False


def test_passthrough_missing(tmp_path: Path) -> None:
    f = write(tmp_path / "x.parquet")
    fails("column `tenant` is missing in", f, ColumnMap(passthrough=("tenant",)))
    fails("fix the name or remove it from passthrough", f, ColumnMap(passthrough=("tenant",)))


@pytest.mark.parametrize("name", ["score", "status", "verdicts", "ndcg_at_10", "label_score", "id"])
def test_passthrough_named_like_an_output_column(tmp_path: Path, name: str) -> None:
    overrides: dict[str, Any] = {name: [1, 2, 3]} if name != "id" else {}
    f = write(tmp_path / "x.parquet", **overrides)
    fails(
        f"passthrough column `{name}` has the name of an output column; rename it",
        f,
        ColumnMap(passthrough=(name,)),
    )


def test_passthrough_clashing_with_a_normalized_column(tmp_path: Path) -> None:
    f = write(tmp_path / "x.parquet", context=["a", "b", "c"])
    fails(
        "passthrough column `context` clashes with the normalized `context` column",
        f,
        ColumnMap(passthrough=("context",)),
    )
    cols = ColumnMap(passthrough=("query",))  # the mapped query column itself is fine
    [batch] = batches(inspect(f, cols), cols)
    assert batch.frame.columns == ["id", "query", "expected", "context"]


def test_schema_mismatch_between_files(tmp_path: Path) -> None:
    a = write(tmp_path / "a.parquet", id=[1, 2, 3])
    b = write(tmp_path / "b.parquet", id=["4", "5", "6"])
    fails(f"column `id` is int64 in {a} but string in {b}; all input files need the same", tmp_path)


def test_string_variants_across_files_are_one_schema(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", id=pa.array(["1", "2", "3"], pa.large_string()))
    write(tmp_path / "b.parquet", id=["4", "5", "6"], expected_output=pa.array([None] * 3))
    write(tmp_path / "c.parquet", id=["7", "8", "9"], expected_output=["e", "f", "g"])
    with pytest.raises(InputError, match=r"is in .*b\.parquet but not in .*a\.parquet"):
        inspect(tmp_path)
    (tmp_path / "a.parquet").unlink()
    info = inspect(tmp_path)
    assert (info.id_type, info.has_expected, info.total_rows) == (pa.string(), True, 6)


def test_hive_layout_errors(tmp_path: Path) -> None:
    write(tmp_path / "dt=1" / "a.parquet")
    write(tmp_path / "b.parquet", start=10)
    fails("Hive partition folders differ", tmp_path)
    (tmp_path / "b.parquet").unlink()
    write(tmp_path / "dt=2" / "b.parquet", start=10, dt=["x", "y", "z"])
    fails("`dt` is both a Hive partition folder (dt=...) and a column in", tmp_path)


def test_invalid_utf8_is_a_row_problem_not_a_crash(tmp_path: Path) -> None:
    raw = pa.array([b"\xff\xfe", b"ok", b"fine"], pa.binary()).view(pa.string())
    info = inspect(write(tmp_path / "x.parquet", query=raw))
    (batch,) = batches(info)
    problems = batch.frame.get_column(INPUT_ERROR).to_list()
    assert problems[0] is not None
    assert "column `query`" in problems[0]
    assert "UTF-8" in problems[0]
    assert problems[1:] == [None, None]
    assert batch.frame.get_column("query").to_list() == ["\ufffd\ufffd", "ok", "fine"]
