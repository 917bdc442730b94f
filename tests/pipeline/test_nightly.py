"""Issue-level check of nightly runs: two overlapping nightly inputs scored incrementally into a
partitioned folder, a Delta table and a DuckDB table; each read back with its own library, every
id once, scores equal to one full run; `--quiet` prints one JSON line."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable

from pipeline.cli import main
from tests.fakes.inputs import HOTPOT_MAP


@pytest.fixture
def nights(hotpot: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    df = pl.read_parquet(hotpot).head(90)
    night1 = df.head(60).with_columns(pl.lit("2026-11-29").alias("dt"))
    night2 = df.slice(30, 60).with_columns(pl.lit("2026-11-30").alias("dt"))  # 30 ids overlap
    paths = tmp_path / "n1.parquet", tmp_path / "n2.parquet", tmp_path / "all.parquet"
    night1.write_parquet(paths[0])
    night2.write_parquet(paths[1])
    pl.concat([night1, night2.slice(30)]).write_parquet(paths[2])
    return paths


def test_two_overlapping_nights_into_folder_delta_and_duckdb(
    nights: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, lake, wh = tmp_path / "scores", tmp_path / "lake", tmp_path / "wh.duckdb"
    common = [
        *HOTPOT_MAP,
        "--passthrough",
        "dt",
        "--partition-by",
        "dt",
        "--incremental",
        "--sink",
        f"delta:{lake}",
        "--sink",
        f"duckdb:{wh}:scores",
        "--quiet",
    ]
    lines = []
    for night in nights[:2]:
        assert main(["score", str(night), "-o", str(out), *common]) == 0
        lines.append(capsys.readouterr().out.strip().splitlines())
    assert all(len(printed) == 1 for printed in lines)  # --quiet: one JSON line per run
    second = json.loads(lines[1][0])
    assert second["rows_this_run"] == 30
    assert second["rows"]["total"] == 90

    full = tmp_path / "full"
    assert main(["score", str(nights[2]), "-o", str(full), *HOTPOT_MAP, "--progress", "off"]) == 0
    expected = pl.read_parquet(full / "*.parquet").select("id", "score").sort("id")

    folder = pl.read_parquet(out / "**/*.parquet", hive_partitioning=True)
    arrow = ds.dataset(
        out, format="parquet", partitioning="hive", exclude_invalid_files=True
    ).to_table()
    delta = pl.from_arrow(DeltaTable(str(lake)).to_pyarrow_table())
    with duckdb.connect(str(wh), read_only=True) as con:
        duck = pl.DataFrame(
            con.execute("SELECT id, score FROM scores").fetchall(),
            schema=["id", "score"],
            orient="row",
        )
    assert arrow.num_rows == 90
    for table in (folder, delta, duck):
        assert isinstance(table, pl.DataFrame)
        assert table.height == 90
        assert table.get_column("id").is_unique().all()
        assert table.select("id", "score").sort("id").equals(expected)
    assert set(folder.get_column("dt").cast(pl.String)) == {"2026-11-29", "2026-11-30"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"]["total"] == 90
    assert summary["run"]["rows_this_run"] == 30


def test_incremental_refuses_another_judge_configuration(
    nights: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "scores"
    assert (
        main(
            [
                "score",
                str(nights[0]),
                "-o",
                str(out),
                *HOTPOT_MAP,
                "--incremental",
                "--progress",
                "off",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "score",
                str(nights[1]),
                "-o",
                str(out),
                *HOTPOT_MAP,
                "--incremental",
                "--scale",
                "10",
                "--progress",
                "off",
            ]
        )
        == 2
    )
    assert "another judge configuration" in capsys.readouterr().err
