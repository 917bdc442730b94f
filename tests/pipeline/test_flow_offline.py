"""The batch pipeline end to end with the built-in offline judge: outputs, schema, re-runs."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec import RunOptions, load_config, score
from ctxprec.cli.main import main
from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.core.metric import map_score
from ctxprec.storage.outdir.schema import SCHEMA_VERSION, output_schema
from tests.fakes.inputs import SAMPLE


def _run(*args: str) -> int:
    return main(["score", *map(str, args), "--progress", "off"])


def _read(out: Path) -> pl.DataFrame:
    return pl.read_parquet(out / "**/*.parquet", hive_partitioning=True).sort("id")


def test_sample_scores_and_writes_everything(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run(SAMPLE, "-o", out, "--map", "labels=labels", "--passthrough", "retriever") == 0
    df = _read(out)
    assert df.height == 12
    assert df.get_column("id").n_unique() == 12
    for row in df.iter_rows(named=True):
        if row["status"] == "ok":
            assert row["score"] == map_score(row["verdicts"])
            assert len(row["verdicts"]) == len(row["verdict_reasons"]) == row["context_count"]
            assert row["relevant_count"] == sum(row["verdicts"])
        else:
            assert row["status"] == "empty_context"
            assert row["score"] == 0.0
    assert (out / "_SUCCESS").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"]["total"] == 12
    assert (out / "summary.md").read_text().strip()


def test_written_schema_is_the_documented_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run(SAMPLE, "-o", out, "--passthrough", "retriever") == 0
    written = pq.read_schema(next(out.glob("*.parquet")))
    expected = output_schema(pa.string(), [pa.field("retriever", pa.string())])
    assert written.names == expected.names
    for field in expected:
        assert written.field(field.name).type == field.type, field.name
    assert written.metadata[b"ctxprec.schema_version"] == SCHEMA_VERSION.encode() == b"2"


def test_second_run_makes_no_judge_calls_and_same_output(tmp_path: Path) -> None:
    out1, out2 = tmp_path / "a", tmp_path / "b"
    assert _run(SAMPLE, "-o", out1) == 0
    assert _run(SAMPLE, "-o", out2) == 0
    run2 = json.loads((out2 / "_ctxprec" / "run.json").read_text())
    assert run2["judge_calls"] == 0
    assert run2["memo_hits"] > 0
    cols = ["id", "score", "status", "verdicts"]
    assert _read(out1).select(cols).equals(_read(out2).select(cols))


def test_same_command_again_on_a_finished_folder_is_a_no_op(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run(SAMPLE, "-o", out) == 0
    before = _read(out).select("id", "score")
    assert _run(SAMPLE, "-o", out) == 0
    run = json.loads((out / "_ctxprec" / "run.json").read_text())
    assert run["rows_this_run"] == 0
    assert run["judge_calls"] == 0
    assert _read(out).select("id", "score").equals(before)


def test_output_folder_holding_another_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _run(SAMPLE, "-o", out) == 0
    assert _run(SAMPLE, "-o", out, "--scale", "10") == 2
    assert "holds another run" in capsys.readouterr().err
    assert _run(SAMPLE, "-o", out, "--scale", "10", "--overwrite") == 0
    assert _read(out).get_column("score").max() > 1


def test_partitioned_output_reads_as_one_table(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run(SAMPLE, "-o", out, "--passthrough", "retriever", "--partition-by", "retriever") == 0
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("retriever=")) == [
        "retriever=bm25",
        "retriever=dense",
    ]
    df = _read(out)
    assert df.height == 12
    assert set(df.get_column("retriever")) == {"bm25", "dense"}


def test_query_only_rows_use_their_own_prompt(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run(SAMPLE, "-o", out) == 0
    df = _read(out)
    versions = dict(zip(df.get_column("id"), df.get_column("prompt_version"), strict=True))
    assert versions["q010"] == "cp-item-query-v3"
    assert versions["q001"] == "cp-item-v3"


def test_the_prompt_versions_reported_are_the_ones_the_rows_used(tmp_path: Path) -> None:
    """summary.json (its `run` and `judge`) and run.json name the prompts the rows were judged
    with: one when every row has an expected output, not every prompt the judge has."""
    every = tmp_path / "every.parquet"
    pl.read_parquet(SAMPLE).filter(pl.col("expected_output").is_not_null()).write_parquet(every)
    assert _run(every, "-o", tmp_path / "one") == 0
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    run = json.loads((tmp_path / "one" / "_ctxprec" / "run.json").read_text())
    assert summary["run"]["prompt_version"] == run["prompt_version"] == "cp-item-v3"
    assert summary["judge"]["prompt_version"] == "cp-item-v3"
    assert _run(SAMPLE, "-o", tmp_path / "both") == 0  # one row has no expected output
    summary = json.loads((tmp_path / "both" / "summary.json").read_text())
    assert summary["run"]["prompt_version"] == "cp-item-v3 / cp-item-query-v3"
    assert summary["judge"]["prompt_version"] == "cp-item-v3 (11 rows) / cp-item-query-v3 (1 row)"


def test_the_python_entry_point_takes_one_options_object(tmp_path: Path) -> None:
    """`pipeline.score(input, outdir, config, RunOptions(...))`, or its fields as keywords."""
    out, cfg = tmp_path / "out", load_config(None, {}, env={})
    first = score(SAMPLE, out, cfg, RunOptions(progress="off"))
    assert first.summary["rows"]["total"] == 12
    with pytest.raises(OutputError, match="holds another run"):
        score(SAMPLE, out, load_config(None, {"scoring.scale": "10"}, env={}), progress="off")
    again = score(
        SAMPLE, out, load_config(None, {"scoring.scale": "10"}, env={}),
        RunOptions(overwrite=True), progress="off",
    )  # fmt: skip
    assert again.summary["rows"]["total"] == 12
    assert json.loads((out / "summary.json").read_text())["rows"]["total"] == 12
