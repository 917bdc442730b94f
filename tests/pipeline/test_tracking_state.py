"""What OUTDIR keeps of `--mlflow` when MLflow cannot take a night (no server needed): the run
finishes with the scoring's exit code, says it once, and keeps the night's record and summary
files for the next run; a damaged state file is said and never fails a finished run; the score
bands of the events are summary.json's."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from ctxprec.run.tracking import band_of
from tests.fakes.inputs import write_input
from tests.fakes.runs import score

pytest.importorskip("mlflow")


def _dead_uri() -> str:
    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_down_server_keeps_the_night_for_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _dead_uri())
    data, out = write_input(tmp_path / "n1.parquet", range(6)), tmp_path / "out"
    assert score(data, "-o", out, "--mlflow", "nightly", "--incremental") == 0
    err = capsys.readouterr().err
    assert err.count("MLflow") == 1, err
    assert "does not answer" in err
    assert "1 run(s) kept in OUTDIR" in err
    state = json.loads((out / "_ctxprec" / "mlflow.json").read_text())
    ((night, record),) = state["pending"].items()
    assert state["runs"] == {}
    assert record["params"]["input"] == str(data)
    assert record["metrics"]["rows_total"] == 6
    kept = sorted(p.name for p in (out / "_ctxprec" / "mlflow-pending" / night).iterdir())
    assert kept == ["summary.html", "summary.json", "summary.md"]
    # a second night while still down: both kept, in order
    second = write_input(tmp_path / "n2.parquet", range(6, 9))
    assert score(second, "-o", out, "--mlflow", "nightly", "--incremental") == 0
    assert "2 run(s) kept in OUTDIR" in capsys.readouterr().err
    state = json.loads((out / "_ctxprec" / "mlflow.json").read_text())
    orders = sorted((r["order"], r["params"]["input"]) for r in state["pending"].values())
    assert [i for _, i in orders] == [str(data), str(second)]


def test_a_damaged_state_file_is_said_and_the_run_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _dead_uri())
    data, out = write_input(tmp_path / "n1.parquet", range(4)), tmp_path / "out"
    assert score(data, "-o", out) == 0
    bad = {"runs": {"0123456789abcdef01234567": {"run_id": "../../x", "experiment_id": "1"}}}
    (out / "_ctxprec" / "mlflow.json").write_text(json.dumps(bad))
    assert score(data, "-o", out, "--mlflow") == 0
    err = capsys.readouterr().err
    assert "mlflow.json is damaged" in err
    assert "not an MLflow id" in err
    assert json.loads((out / "_ctxprec" / "mlflow.json").read_text()) == bad  # left as it was
    assert not (out / "_ctxprec" / "mlflow-pending").exists()


@pytest.mark.parametrize(
    ("score_", "scale", "band"),
    [(0.0, 1.0, "none"), (0.01, 1.0, "low"), (0.39, 1.0, "low"), (0.4, 1.0, "medium"),
     (0.69, 1.0, "medium"), (0.7, 1.0, "good"), (0.89, 1.0, "good"), (0.9, 1.0, "excellent"),
     (1.0, 1.0, "excellent"), (9.0, 10.0, "excellent"), (3.0, 10.0, "low"), (0.0, 0.0, "none")],
)  # fmt: skip
def test_the_event_label_is_the_summary_band(score_: float, scale: float, band: str) -> None:
    assert band_of(score_, scale) == band


def test_the_python_api_says_what_was_not_logged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import ctxprec
    from ctxprec.storage.core.settings import MlflowSettings

    data = write_input(tmp_path / "n1.parquet", range(3))
    mlflow = MlflowSettings(enabled=True, experiment="api", tracking_uri=_dead_uri())
    result = ctxprec.score(data, tmp_path / "out", ctxprec.Config(mlflow=mlflow), progress="off")
    assert result.exit_code == 0
    assert result.tracking["mlflow"]["done"] is False
    assert result.tracking["mlflow"]["pending"] == 1
    assert "does not answer" in result.tracking["mlflow"]["error"]


def test_a_night_mlflow_refuses_stays_kept_and_the_others_are_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """MLflow's own store (SQLite, no server): a kept night whose metric name MLflow refuses is
    said and stays kept; tonight's run is logged all the same."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # a SQLite store's artifacts go to ./mlruns: not the checkout
    data, out = write_input(tmp_path / "n1.parquet", range(4)), tmp_path / "out"
    assert score(data, "-o", out) == 0
    poison = {"run_name": "old night", "timestamp_ms": 1, "start_ms": 1, "params": {},
              "metrics": {"bad/../name": 1.0}, "tags": {}, "artifacts": [], "order": 0}  # fmt: skip
    state = {"runs": {}, "pending": {"0" * 24: poison}}
    (out / "_ctxprec" / "mlflow.json").write_text(json.dumps(state))
    capsys.readouterr()
    assert score(data, "-o", out, "--mlflow", "local") == 0
    err = capsys.readouterr().err
    assert "did not take old night" in err, err
    after = json.loads((out / "_ctxprec" / "mlflow.json").read_text())
    assert list(after["pending"]) == ["0" * 24]
    ((night, run),) = after["runs"].items()
    logged = MlflowClient(uri).get_run(run["run_id"])
    assert logged.data.tags["ctxprec.night"] == night
    assert logged.data.metrics["rows_total"] == 4
