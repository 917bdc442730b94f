"""Issue-level check of nightly runs: two overlapping nightly inputs scored incrementally into a
partitioned folder, a Delta table and a DuckDB table; each read back with its own library, every
id once, scores equal to one full run; `--quiet` prints one JSON line."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from ctxprec.cli.main import main
from ctxprec.storage.core.seams import Seams
from ctxprec.storage.outdir.ownership import part_files
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


# -- every order of the README's nightly commands ----------------------------------------------
# three nights with overlapping ids: night 2 repeats half of night 1, night 3 half of night 2
_NIGHTS = {"n1": (range(0, 20), "2026-11-29"), "n2": (range(10, 30), "2026-11-30")}
_NIGHTS["n3"] = (range(20, 40), "2026-12-01")
_PARTITIONED = ["--passthrough", "dt", "--partition-by", "dt"]
_COMMANDS = {  # the README's nightly command, its re-run without --incremental, --overwrite, ...
    "n1 --incremental --partition-by dt": ("n1", ["--incremental", *_PARTITIONED]),
    "n2 --incremental --partition-by dt": ("n2", ["--incremental", *_PARTITIONED]),
    "n2 --partition-by dt": ("n2", _PARTITIONED),
    "n3 --overwrite --partition-by dt": ("n3", ["--overwrite", *_PARTITIONED]),
    "n3 --incremental": ("n3", ["--incremental", "--passthrough", "dt"]),
}


def _night(path: Path, ids: range, dt: str) -> Path:
    """Rows `r{i}` of one night whose first, second or no item names the query's subject (the
    offline judge's scores 1.0, 0.5 and 0.0), with a `dt` column."""
    named = [f"Country {i}\nThe capital of country {i} is City {i}." for i in ids]
    other = [f"Weather\nRain fell on day {i}." for i in ids]
    orders = [(n, o) if i % 3 == 0 else (o, n) if i % 3 == 1 else (o, o) for i, n, o in
              zip(ids, named, other, strict=True)]  # fmt: skip
    table = pa.table(
        {
            "id": [f"r{i}" for i in ids],
            "query": [f"what is the capital of country {i}?" for i in ids],
            "contexts": [list(pair) for pair in orders],
            "dt": [dt] * len(ids),
        }
    )
    pq.write_table(table, path)
    return path


def _output_ids(out: Path) -> list[str]:
    """Every id in the parts the commit records name (what readers of the output read)."""
    files = part_files(out)
    return [i for f in files for i in pl.read_parquet(f, columns=["id"]).get_column("id")]


def _listing(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}


class _Orders:
    """Runs each order of `_COMMANDS` as a walk of their prefix tree: the folder a prefix left
    is copied before each next command, so every permutation runs once without repeating its
    common prefixes."""

    def __init__(self, inputs: dict[str, Path], root: Path, capsys: pytest.CaptureFixture[str]):
        self.inputs, self.root, self.capsys = inputs, root, capsys
        self.folders = itertools.count()
        self.orders = 0
        self.refusals: set[tuple[str, ...]] = set()
        self.means: set[float] = set()

    def walk(self, before: Path | None, done: tuple[str, ...]) -> None:
        left = [c for c in _COMMANDS if c not in done]
        if not left:
            self.orders += 1
        for name in left:
            out = self.root / f"o{next(self.folders)}"
            if before is not None:
                shutil.copytree(before, out, symlinks=True)
            self.run(out, done, name)
            self.walk(out, (*done, name))
            shutil.rmtree(out, ignore_errors=True)

    def run(self, out: Path, done: tuple[str, ...], name: str) -> None:
        night, flags = _COMMANDS[name]
        ids_before = set(_output_ids(out)) if out.exists() else set()
        files_before = _listing(out) if out.exists() else {}
        argv = ["score", str(self.inputs[night]), "-o", str(out), *flags, "--quiet"]
        rc = main(argv)
        printed = self.capsys.readouterr()
        order = " | ".join((*done, name))
        lines = (printed.out if rc == 0 else printed.err).strip().splitlines()
        assert rc in (0, 2), (order, rc, printed)
        assert len(lines) == 1, (order, rc, printed)
        if rc == 2:  # refused before any judge call: the folder is as it was
            assert lines[0].startswith("ctxprec: error: "), order
            assert (_listing(out) if out.exists() else {}) == files_before, order
            self.refusals.add((*done, name))
            return
        ids = _output_ids(out)
        assert len(ids) == len(set(ids)), (order, len(ids), len(set(ids)))
        incoming = {f"r{i}" for i in _NIGHTS[night][0]}
        want = ids_before | incoming if "--incremental" in flags else incoming
        assert set(ids) == want, order
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rows"]["total"] == len(set(ids)), order
        scores = pl.concat([pl.read_parquet(f, columns=["score"]) for f in part_files(out)])
        mean = scores.get_column("score").mean()
        assert summary["score"]["mean"] == pytest.approx(mean), order
        self.means.add(round(float(mean), 6))


def test_every_order_of_the_nightly_commands_keeps_each_id_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command into a fresh copy of the folder every earlier prefix left: exit 0 with
    every id once (and the summary counting each once), or exit 2 with one line and the folder
    untouched. A plain re-run of a night into a folder --incremental runs added to is refused
    (it used to add "250 rows" where 150 ids exist)."""
    inputs = {
        night: _night(tmp_path / f"{night}.parquet", ids, dt)
        for night, (ids, dt) in _NIGHTS.items()
    }
    orders = _Orders(inputs, tmp_path / "outs", capsys)
    orders.walk(None, ())
    assert orders.orders == math.factorial(len(_COMMANDS))
    readme = ("n1 --incremental --partition-by dt", "n2 --incremental --partition-by dt")
    assert readme not in orders.refusals
    assert readme[:1] not in orders.refusals
    assert (*readme, "n2 --partition-by dt") in orders.refusals  # a re-run with another order
    assert len(orders.means) > 1  # the means checked are not all one value
    assert max(orders.means) > 0


def test_plain_rerun_after_an_incremental_run_killed_before_its_first_commit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Night 1 plain, night 2 --incremental killed before it committed a part, night 2 again
    without --incremental: the plain run would have taken night 1's parts (same part keys) as
    its own finished ones and left night 2's new ids out. It is refused; --incremental then
    adds them."""
    n1 = _night(tmp_path / "n1.parquet", range(0, 20), "2026-11-29")
    n2 = _night(tmp_path / "n2.parquet", range(10, 30), "2026-11-30")
    out = tmp_path / "scores"
    assert main(["score", str(n1), "-o", str(out), *_PARTITIONED, "--quiet"]) == 0

    def killed(point: str, _: object) -> None:
        if point == "commit":  # Ctrl-C as the first part is committed
            raise KeyboardInterrupt

    argv = ["score", str(n2), "-o", str(out), "--incremental", *_PARTITIONED, "--quiet"]
    assert main(argv, seams=Seams(fault=killed)) == 130
    capsys.readouterr()
    assert main(["score", str(n2), "-o", str(out), *_PARTITIONED, "--quiet"]) == 2
    assert "--incremental" in capsys.readouterr().err
    assert main([*argv]) == 0
    ids = _output_ids(out)
    assert sorted(ids) == sorted(f"r{i}" for i in range(30))
