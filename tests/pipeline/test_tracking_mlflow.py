"""`--mlflow` against a real `mlflow server` (SQLite backend, local artifact root) started on
loopback by the test, read back through MLflow's own client: a week of `--incremental` nights,
one of them killed and resumed, one run while the server is stopped, one repeated, gives one
MLflow run per night with its params, metrics, tags and summary files; `compare --mlflow` adds
its difference and gate verdict; the experiment's page opens in headless Chromium. Without
MLflow's server (the `test` extra) it skips, except under CI=true, where it fails."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.core.seams import Seams
from tests.fakes.browser import chromium

pytestmark = pytest.mark.slow
NIGHTS = [f"2026-12-0{d}" for d in range(1, 8)]


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


class Server:
    """`mlflow server` on a free loopback port; stop() and start() keep its store."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
            "--port", str(self.port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
            "--default-artifact-root", str(self.root / "artifacts"),
        ]  # fmt: skip
        log = (self.root / "server.log").open("ab")
        self.process = subprocess.Popen(command, stdout=log, stderr=log, cwd=self.root)
        deadline = time.monotonic() + 300  # a loaded 2-core machine takes a while to import it
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.root / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.5)  # polling a starting server: there is no event to wait on
        pytest.fail("mlflow server did not start: " + (self.root / "server.log").read_text())

    def stop(self) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(60)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    try:
        import mlflow.server  # noqa: F401 (the full `mlflow`: its server and UI)
    except ImportError:
        _missing("MLflow's server is not installed (pip install -e '.[test]')")
    root = tmp_path / "mlflow"
    root.mkdir()
    found = Server(root)
    found.start()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", found.uri)
    try:
        yield found
    finally:
        if found.process is not None and found.process.poll() is None:
            found.stop()


PLACES = [("France", "Paris"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Peru", "Lima"),
          ("Chile", "Santiago"), ("Egypt", "Cairo"), ("Norway", "Oslo"), ("Canada", "Ottawa"),
          ("Ghana", "Accra"), ("Spain", "Madrid")]  # fmt: skip


def _night(tmp: Path, n: int) -> Path:
    """Night n's ten rows: the passage that answers is ranked lower, or cut, on some nights, so
    the offline judge's mean moves from night to night (the MLflow chart has something to show)."""
    ids, queries, expected, contexts = [], [], [], []
    for i, (country, capital) in enumerate(PLACES):
        noise = [f"The weather in {PLACES[(i + k) % 10][0]} is mild in spring." for k in (1, 2, 3)]
        noise.insert((i + n) % 4 if i % 3 else 0, f"{capital} is the capital of {country}.")
        ids.append(f"{NIGHTS[n]}-{i}")
        queries.append(f"What is the capital of {country}?")
        expected.append(f"The capital of {country} is {capital}.")
        contexts.append(noise[: 2 + n % 3])
    path = tmp / f"{NIGHTS[n]}.parquet"
    table = {"id": ids, "query": queries, "expected_output": expected, "contexts": contexts}
    pq.write_table(pa.table(table), path)
    return path


def _killed(point: str, _: object) -> None:
    if point == "commit":  # Ctrl-C as the first part is committed
        raise KeyboardInterrupt


def test_a_week_of_nights_is_one_mlflow_run_per_night(
    tmp_path: Path, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    out = tmp_path / "scores"
    argv = ["-o", str(out), "--incremental", "--mlflow", "week", "--batch-rows", "4", "--quiet"]
    for n in range(7):
        night = ["score", str(_night(tmp_path, n)), *argv]
        if n == 2:  # killed, then the same command resumes it
            assert main(night, seams=Seams(fault=_killed)) == 130
        if n == 4:  # the tracking server is down that night
            server.stop()
        capsys.readouterr()
        assert main(night) == 0
        err = capsys.readouterr().err
        if n == 4:
            assert err.count("MLflow") == 1, err
            assert "logged by the next run with --mlflow" in err
            server.start()
        else:
            assert "MLflow" not in err, err
        if n == 6:  # the same night again: the same MLflow run
            assert main(night) == 0
    summary = json.loads((out / "summary.json").read_text())
    state = json.loads((out / "_ctxprec" / "mlflow.json").read_text())
    assert state["pending"] == {}
    assert not any((out / "_ctxprec" / "mlflow-pending").glob("*"))

    client = MlflowClient(server.uri)
    experiment = client.get_experiment_by_name("week")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    names = sorted(r.info.run_name for r in runs)
    assert names == [f"{night}.parquet" for night in NIGHTS], names
    assert {r.info.run_id for r in runs} == {r["run_id"] for r in state["runs"].values()}
    for run in runs:
        assert run.info.status == "FINISHED"
        night = run.info.run_name.removesuffix(".parquet")
        params = run.data.params
        assert params["judge"] == "offline"
        assert params["model"] == "offline"
        assert params["mode"] == "item"
        assert params["prompt_version"].startswith("cp-item-")
        assert params["input"].endswith(f"{night}.parquet")
        metrics = run.data.metrics
        wanted = ("score_mean", "score_ci95_low", "score_ci95_high", "coverage", "rows_ok",
                  "rows_failed", "judge_calls", "paid_input_tokens", "rows_this_run")  # fmt: skip
        assert set(wanted) <= set(metrics), sorted(metrics)
        assert metrics["score_ci95_low"] <= metrics["score_mean"] <= metrics["score_ci95_high"]
        assert run.data.tags["ctxprec.outdir"] == str(out)
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert artifacts == {"summary.html", "summary.json", "summary.md"}
    last = runs[-1]
    assert last.data.metrics["score_mean"] == summary["score"]["mean"]
    assert last.data.metrics["rows_total"] == summary["rows"]["total"] == 70
    assert last.data.metrics["rows_this_run"] == 0  # the repeated night found nothing new
    history = client.get_metric_history(last.info.run_id, "rows_total")
    assert len(history) == 2  # logged by the night and by its repeat, one run

    # compare --mlflow: the difference and the gate's verdict, in the same experiment
    capsys.readouterr()
    first, later = tmp_path / "a", tmp_path / "b"
    assert main(["score", str(_night(tmp_path, 0)), "-o", str(first), "--quiet"]) == 0
    assert main(["score", str(_night(tmp_path, 0)), "-o", str(later), "--quiet"]) == 0
    cmp = ["compare", str(first), str(later), "--fail-drop", "0.1", "--mlflow", "week"]
    assert main([*cmp, "-o", str(tmp_path / "cmp")]) == 0
    assert "MLflow" not in capsys.readouterr().err
    (found,) = client.search_runs(
        [experiment.experiment_id], filter_string="tags.`ctxprec.kind` = 'compare'"
    )
    assert found.data.tags["ctxprec.gate"] == "passed"
    assert found.data.metrics["gate_failed"] == 0.0
    assert found.data.metrics["mean_delta"] == 0.0
    assert found.data.params["a"] == str(first)
    assert "compare.json" in {a.path for a in client.list_artifacts(found.info.run_id)}
    _experiment_page(server, experiment.experiment_id, tmp_path)


def _experiment_page(server: Server, experiment_id: str, tmp_path: Path) -> None:
    """The experiment's page in MLflow's UI lists the nights (a screenshot is kept: set
    CTXPREC_SCREENSHOT_DIR to keep it, as docs/img/mlflow-week.png was made)."""
    with chromium() as browser:
        page: Any = browser.new_page(viewport={"width": 1440, "height": 1000})
        # the chart view: the list of nights and the score's figures of each (MLflow's
        # assistant panel, open on a first visit, closed)
        runs = f"{server.uri}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
        page.goto(f"{runs}&compareRunsMode=CHART", timeout=120_000)
        for night in NIGHTS:
            page.get_by_text(f"{night}.parquet").first.wait_for(timeout=120_000)
        page.get_by_placeholder("Search metric charts").fill("score_")
        page.get_by_text("score_mean", exact=True).first.wait_for(timeout=120_000)
        close = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]')
        if close.count():
            close.click()
            close.wait_for(state="hidden", timeout=60_000)
        page.get_by_text("score_p90", exact=True).first.wait_for(timeout=120_000)
        shot = tmp_path / "mlflow-week.png"
        page.screenshot(path=str(shot))
    if keep := os.environ.get("CTXPREC_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(keep) / shot.name)
