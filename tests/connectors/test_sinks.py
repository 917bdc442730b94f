"""The Delta Lake and DuckDB sinks against the real `deltalake` and `duckdb` libraries, loading
part files written the way a run writes them (plain, and Hive-partitioned by `dt`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from ctxprec.connectors.sinks import Sink, SinkResult, parse_sink
from ctxprec.run.partition import partition_tables
from ctxprec.storage.core.errors import ConfigError, OutputError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.outdir.commit import commit_part
from ctxprec.storage.outdir.runlog import RunLog
from ctxprec.storage.outdir.schema import output_schema
from tests.fakes.inputs import REPO

SCHEMA = output_schema(pa.string(), [pa.field("dt", pa.string())])
DAYS = ["2026-11-29", "2026-11-30", None]  # None: the __HIVE_DEFAULT_PARTITION__ folder
SCORED_AT = datetime(2026, 11, 30, 2, 15, tzinfo=UTC)


# -- part files as a run writes them ------------------------------------------------------------
def _value(field: pa.Field, i: int) -> Any:
    if pa.types.is_boolean(field.type):
        return i % 2 == 0
    if pa.types.is_floating(field.type):
        return (i % 4) / 4
    if pa.types.is_integer(field.type):
        return i % 5
    return f"{field.name}-{i}"


def scored(ids: range, score: float) -> pa.Table:
    """Realistic scored rows; `score` tells which run wrote a row."""
    special: dict[str, Callable[[int], Any]] = {
        "id": lambda i: f"q{i:04d}",
        "dt": lambda i: DAYS[i % 3],
        "score": lambda i: score,
        "status": lambda i: "ok",
        "error": lambda i: None,
        "verdicts": lambda i: [True, i % 2 == 0, False],
        "verdict_reasons": lambda i: ["on topic", f"row {i}", "off topic"],
        "judge_model": lambda i: "openai/gpt-4o-mini",
        "scored_at": lambda i: SCORED_AT,
    }
    columns = {
        f.name: [special[f.name](i) if f.name in special else _value(f, i) for i in ids]
        for f in SCHEMA
    }
    return pa.table(columns, schema=SCHEMA)


def write_run(
    outdir: Path, table: pa.Table, partition_by: Sequence[str], parts: int = 2
) -> list[str]:
    """Commit `table` as `parts` part files of a fresh OUTDIR; the relative paths written."""
    log = RunLog(outdir, "fingerprint", {"input": "logs.parquet"}, "config")
    log.open()
    files: list[str] = []
    size = -(-table.num_rows // parts)
    for k in range(parts):
        chunk = table.slice(k * size, size)
        tables = partition_tables(chunk, partition_by, f"part-{k:05d}")
        files += commit_part(outdir, f"{k:05d}", tables, rows=chunk.num_rows, failed=0).files
    return files


# -- the two engines, read with their own readers ------------------------------------------------
def target(kind: str, tmp_path: Path, seams: Seams = DEFAULT) -> Sink:
    if kind == "delta":
        return parse_sink(f"delta:{tmp_path / 'lake' / 'scores'}", seams)
    return parse_sink(f"duckdb:{tmp_path / 'wh' / 'evals.duckdb'}:scores", seams)


def read_back(kind: str, tmp_path: Path) -> pa.Table:
    """The whole table in `SCHEMA` column order, sorted by id."""
    if kind == "delta":
        table = DeltaTable(str(tmp_path / "lake" / "scores")).to_pyarrow_table()
    else:
        with duckdb.connect(str(tmp_path / "wh" / "evals.duckdb"), read_only=True) as con:
            table = con.sql("SELECT * FROM scores").to_arrow_table()
    return table.select(SCHEMA.names).sort_by("id")


def row_count(kind: str, tmp_path: Path) -> int:
    if kind == "delta":
        ids = DeltaTable(str(tmp_path / "lake" / "scores")).to_pyarrow_table(columns=["id"])
        return int(ids.num_rows)
    with duckdb.connect(str(tmp_path / "wh" / "evals.duckdb"), read_only=True) as con:
        row = con.execute("SELECT count(*) FROM scores").fetchone()
    assert row is not None
    return int(row[0])


def table_exists(kind: str, tmp_path: Path) -> bool:
    if kind == "delta":
        return DeltaTable.is_deltatable(str(tmp_path / "lake" / "scores"))
    file = tmp_path / "wh" / "evals.duckdb"
    if not file.exists():
        return False
    with duckdb.connect(str(file), read_only=True) as con:
        return "scores" in {name for (name,) in con.execute("SHOW TABLES").fetchall()}


def delta_version(tmp_path: Path) -> int:
    return DeltaTable(str(tmp_path / "lake" / "scores")).version()


@pytest.fixture(params=["delta", "duckdb"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=[(), ("dt",)], ids=["plain", "hive"])
def partition_by(request: pytest.FixtureRequest) -> tuple[str, ...]:
    return tuple(request.param)


# -- parsing ---------------------------------------------------------------------------------------
def test_parse_sink_forms() -> None:
    delta = parse_sink("delta:/data/lake/scores")
    assert delta.name == "delta:/data/lake/scores"
    duck = parse_sink("duckdb:/data/a:b/evals.duckdb:context_precision")  # split on the LAST colon
    assert duck.name == "duckdb:/data/a:b/evals.duckdb:context_precision"
    assert "hunter2" not in parse_sink("delta:s3://me:hunter2@bucket/scores").name


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "delta",
        "delta:",
        "parquet:/data/out",
        "/data/lake/scores",
        "duckdb:evals.duckdb",
        "duckdb::scores",
        "duckdb:evals.duckdb:",
        "duckdb:evals.duckdb:drop table;--",
        "duckdb:evals.duckdb:1scores",
    ],
)
def test_bad_specs_are_config_errors(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"delta:PATH|identifier"):
        parse_sink(spec)


def test_import_is_cheap() -> None:
    code = (
        "import sys, ctxprec.connectors.sinks; "
        "print(sorted(m for m in ('deltalake', 'duckdb') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# -- appends ---------------------------------------------------------------------------------------
def test_first_append_creates_the_table(
    kind: str, partition_by: tuple[str, ...], tmp_path: Path
) -> None:
    sink = target(kind, tmp_path)
    sink.check(SCHEMA)
    assert not table_exists(kind, tmp_path)  # check() creates nothing
    rows = scored(range(40), 0.25)
    files = write_run(tmp_path / "run1", rows, partition_by)

    result = sink.append(tmp_path / "run1", files, SCHEMA, partition_by)

    assert result == SinkResult(sink.name, rows_added=40, rows_skipped=0)
    assert read_back(kind, tmp_path).to_pylist() == rows.to_pylist()
    sink.check(SCHEMA)  # the table it made passes its own check


def test_overlapping_runs_keep_every_id_once(
    kind: str, partition_by: tuple[str, ...], tmp_path: Path
) -> None:
    sink = target(kind, tmp_path)
    first, second = scored(range(40), 0.25), scored(range(30, 70), 0.75)
    sink.append(
        tmp_path / "run1", write_run(tmp_path / "run1", first, partition_by), SCHEMA, partition_by
    )

    result = sink.append(
        tmp_path / "run2",
        write_run(tmp_path / "run2", second, partition_by, parts=3),
        SCHEMA,
        partition_by,
    )

    assert (result.rows_added, result.rows_skipped) == (30, 10)
    table = read_back(kind, tmp_path)
    assert table["id"].to_pylist() == [f"q{i:04d}" for i in range(70)]
    # rows already in the table are kept as they were, never updated
    assert table.to_pylist() == first.to_pylist() + second.slice(10).to_pylist()
    again = sink.append(
        tmp_path / "run3", write_run(tmp_path / "run3", second, partition_by), SCHEMA, partition_by
    )
    assert (again.rows_added, again.rows_skipped) == (0, 40)
    assert row_count(kind, tmp_path) == 70


def test_delta_table_types_and_partitioning(partition_by: tuple[str, ...], tmp_path: Path) -> None:
    sink = target("delta", tmp_path)
    sink.append(
        tmp_path / "run",
        write_run(tmp_path / "run", scored(range(9), 0.5), partition_by),
        SCHEMA,
        partition_by,
    )

    table = DeltaTable(str(tmp_path / "lake" / "scores"))
    stored = pa.schema(table.schema().to_arrow())
    assert stored.names == SCHEMA.names
    for field in SCHEMA:  # pyarrow list types compare without the child field's name
        assert stored.field(field.name).type == field.type, field.name
    assert not stored.field("id").nullable
    assert stored.field("error").nullable
    assert table.metadata().partition_columns == list(partition_by)
    assert sorted(table.to_pyarrow_table(columns=["dt"])["dt"].to_pylist(), key=str) == sorted(
        DAYS * 3, key=str
    )


def test_duckdb_table_types(tmp_path: Path) -> None:
    sink = target("duckdb", tmp_path)
    sink.append(
        tmp_path / "run",
        write_run(tmp_path / "run", scored(range(9), 0.5), ("dt",)),
        SCHEMA,
        ["dt"],
    )

    with duckdb.connect(str(tmp_path / "wh" / "evals.duckdb"), read_only=True) as con:
        described = con.execute("DESCRIBE scores").fetchall()
        per_day = con.execute("SELECT dt, count(*) FROM scores GROUP BY dt ORDER BY dt").fetchall()
    types = {name: kind for name, kind, *_ in described}
    nullable = {name: null for name, _, null, *_ in described}
    assert [name for name, *_ in described] == SCHEMA.names
    assert types["id"] == "VARCHAR"
    assert nullable["id"] == "NO"
    assert types["verdicts"] == "BOOLEAN[]"
    assert types["verdict_reasons"] == "VARCHAR[]"
    assert types["scored_at"] == "TIMESTAMP WITH TIME ZONE"
    assert nullable["scored_at"] == "NO"
    assert (types["score"], types["context_count"], types["hit_at_1"]) == (
        "DOUBLE",
        "BIGINT",
        "BOOLEAN",
    )
    assert per_day == [("2026-11-29", 3), ("2026-11-30", 3), (None, 3)]


# -- failures leave the table as it was -----------------------------------------------------------
def vanishing(pulled: list[int]) -> Seams:
    """Seams whose hook makes a sink's stream of the run's parts fail after its first batch, as
    if a part file vanished mid-load; `pulled` gets the index of each batch taken."""

    def hook(point: str, index: object) -> None:
        if point == "sink_batch":
            assert isinstance(index, int)
            pulled.append(index)
            if index == 1:
                raise OSError("part-00001.parquet vanished mid-load")

    return Seams(fault=hook)


@pytest.mark.parametrize("existing", [True, False], ids=["existing-table", "first-use"])
def test_failed_append_leaves_the_table_as_it_was(
    kind: str, existing: bool, tmp_path: Path
) -> None:
    sink = target(kind, tmp_path)
    if existing:
        sink.append(
            tmp_path / "run1", write_run(tmp_path / "run1", scored(range(20), 0.25), ()), SCHEMA, []
        )
        before = (delta_version(tmp_path) if kind == "delta" else None, row_count(kind, tmp_path))
    files = write_run(tmp_path / "run2", scored(range(10, 60), 0.75), ("dt",), parts=4)
    pulled: list[int] = []

    with pytest.raises(OutputError, match="vanished mid-load") as info:
        target(kind, tmp_path, vanishing(pulled)).append(tmp_path / "run2", files, SCHEMA, ["dt"])

    assert pulled == [0, 1]  # one batch was taken before the stream failed
    assert "as it was" in str(info.value)
    assert "Traceback" not in str(info.value)
    if existing:
        after = (delta_version(tmp_path) if kind == "delta" else None, row_count(kind, tmp_path))
        assert after == before
    else:
        assert not table_exists(kind, tmp_path)
    # the rerun, with the files intact, loads everything once
    rerun = sink.append(tmp_path / "run2", files, SCHEMA, ["dt"])
    assert rerun.rows_added == (40 if existing else 50)
    assert row_count(kind, tmp_path) == (60 if existing else 50)


# -- check ---------------------------------------------------------------------------------------
def _foreign_table(kind: str, tmp_path: Path) -> None:
    """A table at the sink's target that some other tool made, with other columns."""
    other = pa.table({"id": ["x"], "score": ["high"], "note": ["hand-made"]})
    if kind == "delta":
        write_deltalake(str(tmp_path / "lake" / "scores"), other)
        return
    (tmp_path / "wh").mkdir()
    with duckdb.connect(str(tmp_path / "wh" / "evals.duckdb")) as con:
        con.execute("CREATE TABLE scores (id VARCHAR, score VARCHAR, note VARCHAR)")
        con.execute("INSERT INTO scores VALUES ('x', 'high', 'hand-made')")


def test_existing_table_with_other_columns_is_refused(kind: str, tmp_path: Path) -> None:
    _foreign_table(kind, tmp_path)
    sink = target(kind, tmp_path)

    with pytest.raises(OutputError) as info:
        sink.check(SCHEMA)

    message = str(info.value)
    assert "missing: dt, status, error" in message
    assert "unexpected: note" in message
    assert "score (table" in message
    assert "new table" in message
    files = write_run(tmp_path / "run", scored(range(5), 0.5), ())
    with pytest.raises(OutputError, match="unexpected: note"):
        sink.append(tmp_path / "run", files, SCHEMA, [])
    assert row_count(kind, tmp_path) == 1


def test_check_refuses_targets_that_cannot_be_used(tmp_path: Path) -> None:
    (tmp_path / "lake").write_text("not a folder")
    with pytest.raises(OutputError, match="writable folder"):
        parse_sink(f"delta:{tmp_path / 'lake' / 'scores'}").check(SCHEMA)
    (tmp_path / "scores").write_text("not a folder")
    with pytest.raises(OutputError, match="is a file"):
        parse_sink(f"delta:{tmp_path / 'scores'}").check(SCHEMA)
    (tmp_path / "junk.duckdb").write_bytes(b"definitely not a database" * 200)
    with pytest.raises(OutputError, match="cannot open"):
        parse_sink(f"duckdb:{tmp_path / 'junk.duckdb'}:scores").check(SCHEMA)


def test_missing_part_file_is_an_output_error(kind: str, tmp_path: Path) -> None:
    files = write_run(tmp_path / "run", scored(range(10), 0.5), ("dt",))
    (tmp_path / "run" / files[-1]).unlink()
    with pytest.raises(OutputError, match="is missing"):
        target(kind, tmp_path).append(tmp_path / "run", files, SCHEMA, ["dt"])
    assert not table_exists(kind, tmp_path)
