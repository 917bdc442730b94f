"""A later --incremental night may pass through more input columns: adding an output column is
not a judge change. The folder's earlier rows read the new column back as null (as a Delta or
Iceberg table adds a column), everything that reads the output sees it, and one note says so.
Anything else that changes stays refused."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main


def _night(path: Path, first: int, n: int = 6) -> Path:
    pl.DataFrame(
        {
            "id": [f"r{i}" for i in range(first, first + n)],
            "query": [f"Who wrote book {i}?" for i in range(first, first + n)],
            "expected_output": [f"Author {i}" for i in range(first, first + n)],
            "contexts": [
                [f"Book {i} was written by Author {i}.", "Other."] for i in range(first, first + n)
            ],
            "source": ["web" if i % 2 else "app" for i in range(first, first + n)],
        }
    ).write_parquet(path)
    return path


def _score(src: Path, out: Path, *flags: str) -> int:
    return main(["score", str(src), "-o", str(out), "--incremental", "--progress", "off", *flags])


def test_a_later_night_adds_a_passthrough_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _score(_night(tmp_path / "n1.parquet", 0), out) == 0
    capsys.readouterr()
    assert _score(_night(tmp_path / "n2.parquet", 6), out, "--passthrough", "source") == 0
    err = capsys.readouterr().err
    note = (
        f"ctxprec: note: --incremental adds the column(s) `source` to {out}: the rows earlier "
        "runs wrote read them back as null (as a Delta or Iceberg table adds a column)"
    )
    assert err.count(note) == 1, err
    frames = [pl.read_parquet(f) for f in sorted(out.glob("*.parquet"))]
    rows = pl.concat(frames, how="diagonal").sort("id")
    seen = dict(zip(rows["id"], rows["source"], strict=True))
    assert [seen[f"r{i}"] for i in range(6)] == [None] * 6  # the first night's rows
    assert [seen[f"r{i}"] for i in range(6, 12)] == ["app", "web"] * 3
    # every reader of the output sees the column: the summary groups by it
    assert main(["summary", str(out), "--group-by", "source"]) == 0
    groups = json.loads((out / "summary.json").read_text())["by_group"]
    by = {g["group"]: g["rows"] for g in groups["groups"]}
    assert by == {None: 6, "app": 3, "web": 3}, (by, seen)
    assert json.loads((out / "summary.json").read_text())["rows"]["total"] == 12
    # a third night with the same columns is the same configuration: no note
    capsys.readouterr()
    assert _score(_night(tmp_path / "n3.parquet", 12), out, "--passthrough", "source") == 0
    assert "adds the column" not in capsys.readouterr().err


def test_dropping_a_column_or_changing_the_judge_is_still_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _score(_night(tmp_path / "n1.parquet", 0), out, "--passthrough", "source") == 0
    capsys.readouterr()
    assert _score(_night(tmp_path / "n2.parquet", 6), out) == 2  # source dropped
    assert "was scored with another judge configuration" in capsys.readouterr().err
    flags = ("--passthrough", "source", "--scale", "10")
    assert _score(_night(tmp_path / "n3.parquet", 12), out, *flags) == 2
    assert "--scale: 1.0 there, 10.0 here" in capsys.readouterr().err


def test_the_sinks_add_the_column_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Delta (a MERGE that merges the schema), DuckDB (ALTER TABLE ADD COLUMN) and Iceberg (a
    schema update in the same commit) take the new night's rows with the new column; the rows
    already there hold null in it."""
    pytest.importorskip("deltalake")
    duckdb = pytest.importorskip("duckdb")
    pytest.importorskip("pyiceberg")
    from deltalake import DeltaTable
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
               "warehouse": f"file://{tmp_path}/warehouse"}  # fmt: skip
    for key, value in catalog.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__NIGHTS__{key.upper()}", value)
    sinks = [
        *("--sink", f"delta:{tmp_path / 'delta'}"),
        *("--sink", f"duckdb:{tmp_path / 'wh.duckdb'}:scores"),
        *("--sink", "iceberg:nights/lake.scores"),
    ]
    out = tmp_path / "out"
    assert _score(_night(tmp_path / "n1.parquet", 0), out, *sinks) == 0
    flags = ("--passthrough", "source", *sinks)
    assert _score(_night(tmp_path / "n2.parquet", 6), out, *flags) == 0, capsys.readouterr().err
    want = {f"r{i}": (None if i < 6 else ("web" if i % 2 else "app")) for i in range(12)}
    delta = DeltaTable(str(tmp_path / "delta")).to_pyarrow_table().to_pydict()
    assert dict(zip(delta["id"], delta["source"], strict=True)) == want
    with duckdb.connect(str(tmp_path / "wh.duckdb"), read_only=True) as con:
        assert dict(con.execute("SELECT id, source FROM scores").fetchall()) == want
    table = SqlCatalog("nights", **catalog).load_table(("lake", "scores")).scan().to_arrow()
    assert dict(zip(table["id"].to_pylist(), table["source"].to_pylist(), strict=True)) == want
