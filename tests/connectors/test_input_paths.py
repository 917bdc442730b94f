"""Partition keys from the given path: `k=v` folders that end INPUT itself are partition columns
like those below it, so the README's nightly and Airflow commands run as written (on local
folders, against the fake OpenAI-compatible judge)."""

from __future__ import annotations

import ast
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest
from deltalake import DeltaTable

from ctxprec.cli.main import main
from ctxprec.connectors.sources import ColumnMap, inspect_source, iter_batches
from tests.fakes.inputs import REPO, SAMPLE
from tests.fakes.judge_server import FakeJudgeServer

BIN = Path(sys.executable).parent


def _day(root: Path, day: str, rows: slice = slice(0, 12)) -> Path:
    folder = root / "logs" / f"dt={day}"
    folder.mkdir(parents=True)
    pl.read_parquet(SAMPLE)[rows].write_parquet(folder / "part-0.parquet")
    return folder


@pytest.mark.parametrize("given", ["folder", "folder/", "file", "file-uri"])
def test_partition_key_taken_from_the_given_path(tmp_path: Path, given: str) -> None:
    folder = _day(tmp_path, "2026-11-28")
    spec = {
        "folder": str(folder),
        "folder/": f"{folder}/",
        "file": str(folder / "part-0.parquet"),
        "file-uri": folder.as_uri() + "/",
    }[given]
    info = inspect_source(spec, ColumnMap(), use_extractor=False)
    assert info.partition_columns == ("dt",)
    assert [f.name for f in info.passthrough_fields] == ["dt"]
    frame = next(iter_batches(info, ColumnMap(), batch_rows=100)).frame
    assert frame.get_column("dt").unique().to_list() == ["2026-11-28"]


def test_only_trailing_key_value_folders_of_the_path_count(tmp_path: Path) -> None:
    deep = tmp_path / "team=search" / "logs" / "dt=2026-11-28" / "region=eu"
    deep.mkdir(parents=True)
    pl.read_parquet(SAMPLE).write_parquet(deep / "a.parquet")
    info = inspect_source(str(deep), ColumnMap(), use_extractor=False)
    assert info.partition_columns == ("dt", "region")  # team= is above `logs`, not a key
    below = inspect_source(str(tmp_path / "team=search" / "logs"), ColumnMap(), use_extractor=False)
    assert below.partition_columns == ("dt", "region")


def test_passthrough_of_a_partition_key_is_the_folder_value(tmp_path: Path) -> None:
    folder = _day(tmp_path, "2026-11-28")
    out = tmp_path / "scores"
    args = ["score", str(folder), "-o", str(out), "--passthrough", "dt,retriever"]
    assert main([*args, "--partition-by", "dt", "--progress", "off"]) == 0
    written = pl.read_parquet(out / "dt=2026-11-28" / "*.parquet")
    assert written.height == 12
    assert "retriever" in written.columns


# ---------------------------------------------------------------- the README's commands


def _readme() -> str:
    """The nightly page: its recipe and Airflow task (the batch page has an Airflow task too)."""
    return (REPO / "docs" / "nightly.md").read_text(encoding="utf-8")


def _nightly_command() -> str:
    block = next(
        b for b in re.findall(r"```bash\n(.*?)```", _readme(), flags=re.S) if "every night" in b
    )
    lines = [line for line in block.splitlines() if not line.startswith("#")]
    return "\n".join(lines).strip()


def _airflow_command() -> str:
    block = next(
        b for b in re.findall(r"```python\n(.*?)```", _readme(), flags=re.S) if "Bash" in b
    )
    found = re.search(r"bash_command=(\(.*?\)),\n", block, flags=re.S)
    assert found is not None
    command = ast.literal_eval(found.group(1))
    assert isinstance(command, str)
    return command


def _workspace(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A working folder with the repo's configs; the commands' absolute folders moved below it."""
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / "srv" / "ctxprec").mkdir(parents=True)
    (tmp_path / "srv" / "ctxprec" / "configs").symlink_to(REPO / "configs")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return tmp_path, env


def _relocate(command: str, root: Path) -> str:
    return command.replace("/data/", f"{root}/data/").replace(
        "/srv/ctxprec/", f"{root}/srv/ctxprec/"
    )


def _run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [bash, "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_readme_nightly_recipe_runs_as_written(tmp_path: Path, fake: FakeJudgeServer) -> None:
    root, env = _workspace(tmp_path)
    today = dt.date.today().isoformat()  # the recipe's $(date +%F)
    _day(root, today)
    (root / "data" / "ctxprec").mkdir(parents=True)
    command = _relocate(_nightly_command(), root)
    assert '"logs/dt=$(date +%F)"' in command
    assert "--partition-by dt" in command
    done = _run(command, root, env)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1  # --quiet: one JSON line
    scores = root / "data" / "ctxprec" / "scores"
    folder = pl.read_parquet(scores / f"dt={today}" / "*.parquet")
    assert folder.height == 12
    assert folder.get_column("id").is_unique().all()
    assert fake.stats.total > 0
    delta = pl.from_arrow(
        DeltaTable(str(root / "data" / "lake" / "ctxprec_scores")).to_pyarrow_table()
    )
    assert isinstance(delta, pl.DataFrame)
    assert set(delta.get_column("dt").cast(pl.String)) == {today}
    with duckdb.connect(str(root / "data" / "warehouse.duckdb"), read_only=True) as con:
        row = con.execute("SELECT count(*), count(DISTINCT id) FROM ctxprec_scores").fetchone()
    assert row == (12, 12)


@pytest.mark.slow
def test_readme_airflow_command_runs_as_written(tmp_path: Path, fake: FakeJudgeServer) -> None:
    root, env = _workspace(tmp_path)
    (root / "data" / "ctxprec").mkdir(parents=True)
    nights = {"2026-11-28": slice(0, 8), "2026-11-29": slice(4, 12)}  # 4 ids overlap
    for day, rows in nights.items():
        _day(root / "data", day, rows)
        command = _relocate(_airflow_command().replace("{{ ds }}", day), root)
        done = _run(command, root, env)
        assert done.returncode == 0, done.stderr
    scores = pl.read_parquet(
        root / "data" / "ctxprec" / "scores" / "**" / "*.parquet", hive_partitioning=True
    )
    assert scores.height == 12
    assert scores.get_column("id").is_unique().all()
    assert set(scores.get_column("dt").cast(pl.String)) == set(nights)
    delta = pl.from_arrow(
        DeltaTable(str(root / "data" / "lake" / "ctxprec_scores")).to_pyarrow_table()
    )
    assert isinstance(delta, pl.DataFrame)
    assert delta.height == 12
