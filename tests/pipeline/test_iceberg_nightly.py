"""Issue-level check of the Iceberg sink: a pyiceberg SQL catalog configured by
PYICEBERG_CATALOG__* variables; two nights of labelled rows from `logs/dt=...` folders scored with
`--incremental --partition-by dt` into one OUTDIR and `--sink iceberg:...`, then the second night
again (and once more after a kill between the table's commit and the run's record of it); the table
read back with pyiceberg holds every id once, row for row equal to the Parquet parts."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from ctxprec.cli.main import main
from ctxprec.config import load_config
from ctxprec.storage.core.errors import ConfigError
from tests.fakes.inputs import HOTPOT_MAP, REPO
from tests.fakes.judge_server import FakeJudgeServer

NIGHTS = ("2026-11-29", "2026-11-30")
_NAMES = itertools.count()  # pyiceberg reads its variables once: one catalog name per test


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, SqlCatalog]:
    name = f"nightly{next(_NAMES)}"
    properties = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
    }
    for key, value in properties.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper()}__{key.upper()}", value)
    return name, SqlCatalog(name, **properties)


@pytest.fixture
def logs(hotpot: Path, tmp_path: Path) -> list[Path]:
    """logs/dt=2026-11-29 (ids 0-59) and logs/dt=2026-11-30 (ids 30-89: 30 seen the night
    before); the files carry no dt column, the folder does."""
    df = pl.read_parquet(hotpot).head(90)
    folders = []
    for night, rows in zip(NIGHTS, (df.head(60), df.slice(30, 60)), strict=True):
        folder = tmp_path / "logs" / f"dt={night}"
        folder.mkdir(parents=True)
        rows.write_parquet(folder / "part-0.parquet")
        folders.append(folder)
    return folders


def _table(catalog: SqlCatalog) -> Table:
    return catalog.load_table("ctxprec.scores")


@pytest.mark.parametrize(
    ("passthrough", "toml"),
    [(["--passthrough", "dt"], False), ([], False), ([], True)],
    ids=["dt", "folder-only", "sinks-in-toml"],
)
def test_two_nights_and_a_rerun_keep_every_id_once(
    catalog: tuple[str, SqlCatalog],
    logs: list[Path],
    tmp_path: Path,
    passthrough: list[str],
    toml: bool,
) -> None:
    name, sql = catalog
    out = tmp_path / "scores"
    sink = ["--sink", f"iceberg:{name}/ctxprec.scores"]
    if toml:
        config = tmp_path / "nightly.toml"
        config.write_text(f'[[sinks]]\nkind = "iceberg"\ntable = "{name}/ctxprec.scores"\n')
        sink = ["--config", str(config)]
    common = [
        "-o",
        str(out),
        *HOTPOT_MAP,
        "--map",
        "labels=labels",
        *passthrough,
        "--partition-by",
        "dt",
        "--incremental",
        *sink,
        "--progress",
        "off",
    ]
    for night in (*logs, logs[1]):  # the second night twice: a re-run of the same night
        assert main(["score", str(night), *common]) == 0
    snapshots = len(_table(sql).snapshots())
    for state in out.rglob("sink-*.json"):  # killed after the table's commit, before its record
        state.unlink()
    assert main(["score", str(logs[1]), *common]) == 0

    table = _table(sql)
    assert len(table.snapshots()) == snapshots == 2  # one commit per night that added rows
    back = table.scan().to_arrow()
    parts = ds.dataset(
        out,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("dt", pa.string())]), flavor="hive"),
        exclude_invalid_files=True,
    ).to_table()
    assert back.num_rows == parts.num_rows == 90
    assert sorted(back["id"].to_pylist()) == sorted(set(back["id"].to_pylist()))
    per_night = back.group_by("dt").aggregate([("id", "count")]).sort_by("dt").to_pylist()
    assert per_night == [{"dt": NIGHTS[0], "id_count": 60}, {"dt": NIGHTS[1], "id_count": 30}]
    assert str(table.schema().find_field("dt").field_type) == "string"
    assert [f.name for f in table.spec().fields] == ["dt"]
    names = [f for f in parts.column_names if f in back.column_names]
    assert set(names) == set(back.column_names)
    got = back.select(names).sort_by("id").to_pylist()
    want = parts.select(names).sort_by("id").to_pylist()
    assert got == want
    assert all(row["label_score"] is not None for row in got)  # label MAP, as in the parts
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"]["total"] == 90


def test_iceberg_mistakes_stop_before_any_judge_call(
    catalog: tuple[str, SqlCatalog],
    logs: list[Path],
    fake: FakeJudgeServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name, sql = catalog
    sql.create_namespace("ctxprec")
    sql.create_table("ctxprec.scores", pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    cases = {
        f"iceberg:unknown{next(_NAMES)}/ctxprec.scores": "is not configured",
        f"iceberg:{name}/ctxprec.scores": "id (table long, output string)",
        f"iceberg:{name}": "names no Iceberg catalog, namespace and table",
    }
    for spec, fragment in cases.items():
        argv = ["score", str(logs[0]), "-o", str(tmp_path / "out"), *HOTPOT_MAP]
        code = main([*argv, "--model", "openai/judge-1", "--sink", spec, "--progress", "off"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert fragment in err
        assert "Traceback" not in err
    assert fake.stats.total == 0
    assert not (tmp_path / "out").exists()


def test_sinks_as_toml_tables(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[output]\nsinks = ["duckdb:w.duckdb:scores"]\n'
        '[[sinks]]\nkind = "iceberg"\ntable = "lake/analytics.scores"\n'
        '[[sinks]]\nkind = "delta"\ntable = "/data/lake/scores"\n'
    )
    sinks = load_config(config, {}, env={}).output.sinks
    assert sinks == (
        "duckdb:w.duckdb:scores",
        "iceberg:lake/analytics.scores",
        "delta:/data/lake/scores",
    )
    config.write_text('[[sinks]]\nkind = "iceberg"\ncatalog = "lake"\n')
    with pytest.raises(ConfigError, match=r"sinks must be \[\[sinks\]\] tables of kind and table"):
        load_config(config, {}, env={})


def test_without_pyiceberg_in_a_fresh_interpreter(
    catalog: tuple[str, SqlCatalog], logs: list[Path], fake: FakeJudgeServer, tmp_path: Path
) -> None:
    """pyiceberg really missing from the interpreter: exit 2 naming the extra, no judge call."""
    name, _ = catalog
    code = (
        "import sys; sys.modules['pyiceberg'] = None; from ctxprec.cli.main import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    argv = ["score", str(logs[0]), "-o", str(tmp_path / "out"), *HOTPOT_MAP]
    argv += ["--model", "openai/judge-1", "--sink", f"iceberg:{name}/ctxprec.scores"]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert "needs the `pyiceberg` package, which is not installed" in done.stderr
    assert "ctxprec[warehouse]" in done.stderr
    assert fake.stats.total == 0
    assert not (tmp_path / "out").exists()
