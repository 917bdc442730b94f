"""`--otel`: one `gen_ai.evaluation.result` event per scored row and a span for the run, sent
over OTLP/HTTP to a real receiver on loopback that decodes the protobuf with
`opentelemetry-proto` (tests/fakes/otlp_receiver.py) and checks every event against the GenAI
semantic conventions; rows carrying a trace of their own are parented to it. A run repeated or
resumed sends no row twice; a collector that refuses is said once and the next run sends what is
left; a run without the flags imports neither OpenTelemetry nor MLflow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.run.tracking import band_of
from tests.fakes.inputs import REPO
from tests.fakes.otlp_receiver import OtlpReceiver, attributes
from tests.fakes.runs import score

pytest.importorskip("opentelemetry.sdk")

ROWS = 9


def _trace(i: int) -> str | None:
    return None if i % 3 == 0 else f"{i + 1:032x}"


def _input(path: Path) -> Path:
    """Rows with a trace id (hex) and a span id on two rows of three; row r4 has an empty
    context list (score 0, band none) and row r7 a null query (a failed row)."""
    ids = range(ROWS)
    table = pa.table(
        {
            "id": [f"r{i}" for i in ids],
            "query": [None if i == 7 else f"who wrote book {i}?" for i in ids],
            "expected_output": [f"author {i} wrote book {i}" for i in ids],
            "contexts": [
                [] if i == 4 else [f"book {i} was written by author {i}", "rain"] for i in ids
            ],
            "trace": [_trace(i) for i in ids],
            "span": [None if i % 3 == 0 else f"{i + 7:016x}" for i in ids],
        }
    )
    pq.write_table(table, path)
    return path


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> OtlpReceiver:
    with OtlpReceiver() as found:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", found.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")  # a refusing collector: 2 s
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        yield found


def _events(receiver: OtlpReceiver) -> dict[str, tuple[dict[str, object], object, object]]:
    found = {}
    for resource, scope, record in receiver.records():
        attrs = attributes(record.attributes)
        assert record.event_name == "gen_ai.evaluation.result"
        assert str(attrs["gen_ai.response.id"]) not in found, "an event sent twice"
        found[str(attrs["gen_ai.response.id"])] = (attrs, record, (resource, scope))
    return found


def test_every_scored_row_is_one_evaluation_event(tmp_path: Path, receiver: OtlpReceiver) -> None:
    data, out = _input(tmp_path / "in.parquet"), tmp_path / "out"
    argv = [data, "-o", out, "--otel", "--map", "trace_id=trace,span_id=span", "--batch-rows", 4]
    assert score(*argv) == 1  # r7 failed on its input
    rows = pl.read_parquet(out / "*.parquet").sort("id")
    events = _events(receiver)
    assert sorted(events) == rows["id"].to_list()
    assert receiver.refused == []
    (span,) = receiver.spans()
    assert span.name == "ctxprec score"
    assert attributes(span.attributes)["gen_ai.evaluation.name"] == "context_precision"
    assert attributes(span.attributes)["ctxprec.events"] == ROWS
    assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
    for row in rows.iter_rows(named=True):
        attrs, record, (resource, scope) = events[row["id"]]
        assert resource["service.name"] == "ctxprec"
        assert scope.name == "ctxprec"
        assert attrs["gen_ai.evaluation.name"] == "context_precision"
        assert record.time_unix_nano == int(row["scored_at"].timestamp() * 1e9)
        if row["status"] == "failed":
            assert row["id"] == "r7"
            assert "gen_ai.evaluation.score.value" not in attrs
            assert "gen_ai.evaluation.score.label" not in attrs
            assert attrs["error.type"] == row["error"].split(":")[0]
        else:
            assert attrs["gen_ai.evaluation.score.value"] == row["score"]
            assert attrs["gen_ai.evaluation.score.label"] == band_of(row["score"], 1.0)
            assert attrs["gen_ai.evaluation.explanation"] == row["reason"]
            assert "error.type" not in attrs
        i = int(row["id"][1:])
        if _trace(i) is None:  # no trace of its own: the run's span
            assert (record.trace_id, record.span_id) == (span.trace_id, span.span_id)
        else:
            assert record.trace_id.hex() == _trace(i)
            assert record.span_id.hex() == f"{i + 7:016x}"
    assert events["r4"][0]["gen_ai.evaluation.score.label"] == "none"
    # the same command again (r7 still fails): no row is sent a second time
    assert score(*argv) == 1
    assert len(receiver.records()) == ROWS


def test_a_refusing_collector_is_said_once_and_the_next_run_sends_the_rows(
    tmp_path: Path, receiver: OtlpReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    data, out = _input(tmp_path / "in.parquet"), tmp_path / "out"
    receiver.down()
    assert score(data, "-o", out, "--otel") == 1  # r7's failure, not the collector's
    err = capsys.readouterr().err
    assert err.count("OpenTelemetry") == 1, err
    assert "sent by the next run with --otel" in err
    assert (out / "_SUCCESS").is_file()
    receiver.up()
    assert score(data, "-o", out, "--otel") == 1
    assert sorted(_events(receiver)) == [f"r{i}" for i in range(ROWS)]


def test_an_incremental_night_sends_only_its_own_rows(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    """A folder's first --otel run: the rows of runs before it are not sent."""
    out = tmp_path / "out"
    first = _input(tmp_path / "a.parquet")
    assert score(first, "-o", out, "--incremental") == 1
    table = pq.read_table(first).to_pylist()
    for row in table:
        row["id"] = "n" + row["id"]
    pq.write_table(pa.Table.from_pylist(table), tmp_path / "b.parquet")
    assert score(tmp_path / "b.parquet", "-o", out, "--incremental", "--otel") == 1
    assert sorted(_events(receiver)) == sorted(f"nr{i}" for i in range(ROWS))


def test_a_score_run_without_the_flags_imports_neither_otel_nor_mlflow(tmp_path: Path) -> None:
    data = _input(tmp_path / "in.parquet")
    argv = ["score", str(data), "-o", str(tmp_path / "out"), "--progress", "off", "--quiet"]
    probe = (
        "import sys\n"
        "from ctxprec.cli.main import main\n"
        f"assert main({argv!r}) == 1\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'opentelemetry', 'mlflow'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_python_api_and_the_quiet_line_say_what_was_sent(
    tmp_path: Path, receiver: OtlpReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    import ctxprec
    from ctxprec.storage.core.settings import OtelSettings

    data = _input(tmp_path / "in.parquet")
    cfg = ctxprec.Config(otel=OtelSettings(enabled=True, endpoint=receiver.endpoint))
    result = ctxprec.score(data, tmp_path / "api", cfg, progress="off")
    assert result.tracking["otel"] == {"done": True, "events": ROWS, "parts": 1, "parts_left": 0}
    assert len(_events(receiver)) == ROWS
    capsys.readouterr()
    assert score(data, "-o", tmp_path / "cli", "--otel", "--quiet") == 1
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert line["tracking"]["otel"]["events"] == ROWS
