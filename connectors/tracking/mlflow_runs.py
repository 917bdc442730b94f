"""MLflow through its own client (`MlflowClient`, from `mlflow-skinny`: the `mlflow` extra),
imported only when a run logs to it. One record is one MLflow run: found again by the id OUTDIR
kept, else by its night tag in the experiment (a run killed between MLflow's answer and OUTDIR's
note of it), else created; then its params, metrics, tags and summary files are logged and it is
marked finished. The tracking server's address and credentials are MLflow's own settings
(`MLFLOW_TRACKING_URI`, `MLFLOW_TRACKING_TOKEN`, `MLFLOW_TRACKING_USERNAME`, Databricks', ...).
"""

from __future__ import annotations

import importlib.util
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxprec.storage.core.redact import without_url_secrets

__all__ = [
    "MLFLOW_INSTALL",
    "NIGHT_TAG",
    "OUTDIR_TAG",
    "Logged",
    "MlflowTarget",
    "RunRecord",
    "TrackingDown",
    "log_record",
    "mlflow_available",
]

MLFLOW_INSTALL = "pip install 'ctxprec[mlflow]'"
NIGHT_TAG = "ctxprec.night"  # the run's fingerprint: one MLflow run per night
OUTDIR_TAG = "ctxprec.outdir"
PROBE_TIMEOUT_S = 5.0  # a tracking server that does not answer /health this fast counts as down
_PARAM_CHARS = 6000  # MLflow's longest param value
_TAG_CHARS = 8000


class TrackingDown(Exception):
    """The tracking server cannot be reached: nothing was logged by this attempt."""


@dataclass(frozen=True)
class MlflowTarget:
    experiment: str
    tracking_uri: str | None = None  # None: MLflow's own (MLFLOW_TRACKING_URI, its default)


@dataclass(frozen=True)
class RunRecord:
    """What one MLflow run holds; `night` says which runs are the same one."""

    night: str
    run_name: str
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    timestamp_ms: int  # when the run finished: the metrics' time and the MLflow run's end
    artifacts: tuple[Path, ...] = ()
    start_ms: int | None = None  # when the run started (None: as it finished)


@dataclass(frozen=True)
class Logged:
    run_id: str
    experiment_id: str
    tracking_uri: str  # as MLflow resolved it, without credentials
    url: str | None  # the run's page, for an http(s) tracking server


def mlflow_available() -> bool:
    return importlib.util.find_spec("mlflow") is not None


def log_record(
    target: MlflowTarget,
    record: RunRecord,
    known_run_id: str | None = None,
    on_run: Callable[[str], None] | None = None,
) -> Logged:
    """Log `record` as one MLflow run (the one `known_run_id` names when it is still there);
    `on_run(run_id)` is called as soon as the run is known. TrackingDown when the server does
    not answer; MLflow's own exceptions for what it refuses."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=target.tracking_uri)
    given = str(client.tracking_uri)  # as MLflow resolved it (MLFLOW_TRACKING_URI, its default)
    uri = without_url_secrets(given)
    _probe(given, uri)
    experiment_id = _experiment(client, target.experiment)
    run = _find_run(client, experiment_id, record, known_run_id)
    if run is None:
        tags = {**record.tags, NIGHT_TAG: record.night}
        run = client.create_run(
            experiment_id,
            start_time=record.start_ms or record.timestamp_ms,
            tags=tags,
            run_name=record.run_name,
        )
    run_id = str(run.info.run_id)
    if on_run is not None:
        on_run(run_id)
    _log(client, run, record)
    for path in record.artifacts:
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, "FINISHED", end_time=record.timestamp_ms)
    return Logged(run_id, experiment_id, uri, _run_url(uri, experiment_id, run_id))


def _probe(given: str, uri: str) -> None:
    """An http(s) tracking server is asked for /health first, briefly: MLflow's own client
    retries a refused connection for minutes before it gives up."""
    parts = urllib.parse.urlsplit(given)
    if parts.scheme not in ("http", "https"):
        return
    host = parts.netloc.rpartition("@")[2]  # no credentials in a probe
    health = urllib.parse.urlunsplit(
        (parts.scheme, host, f"{parts.path.rstrip('/')}/health", "", "")
    )
    request = urllib.request.Request(health, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S):
            pass
    except urllib.error.HTTPError:
        return  # it answered (a proxy's 401 too): MLflow's client says what it thinks of us
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingDown(f"{uri} does not answer ({reason})") from None


def _experiment(client: Any, name: str) -> str:
    """The experiment's id, created when missing (another process may create it meanwhile)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            client.restore_experiment(found.experiment_id)
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name))
    except MlflowException:
        again = client.get_experiment_by_name(name)
        if again is None:
            raise
        return str(again.experiment_id)


def _find_run(
    client: Any, experiment_id: str, record: RunRecord, known_run_id: str | None
) -> Any | None:
    """The night's run: the id OUTDIR kept when it is still that night's run in this
    experiment, else the run tagged with the night and this output folder."""
    from mlflow.exceptions import MlflowException

    if known_run_id:
        try:
            run = client.get_run(known_run_id)
        except MlflowException:
            run = None  # deleted for good, or another server: searched for below
        if (
            run is not None
            and run.info.experiment_id == experiment_id
            and run.info.lifecycle_stage == "active"
            and run.data.tags.get(NIGHT_TAG) == record.night
        ):
            return run
    night, outdir = _quoted(record.night), _quoted(record.tags.get(OUTDIR_TAG, ""))
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{NIGHT_TAG}` = '{night}' and tags.`{OUTDIR_TAG}` = '{outdir}'",
        max_results=1,
        order_by=["attributes.start_time ASC"],
    )
    return found[0] if found else None


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _log(client: Any, run: Any, record: RunRecord) -> None:
    """Params once (MLflow refuses a changed value: one already there is kept), metrics at the
    night's time (a repeated night adds a point; the charts show the latest), tags."""
    from mlflow.entities import Metric, Param, RunTag

    have = run.data.params
    params = [Param(k, v[:_PARAM_CHARS]) for k, v in record.params.items() if k not in have]
    metrics = [Metric(k, float(v), record.timestamp_ms, 0) for k, v in record.metrics.items()]
    tags = [RunTag(k, v[:_TAG_CHARS]) for k, v in record.tags.items()]
    for start in range(0, max(len(metrics), len(params), len(tags)), 100):  # MLflow's batch cap
        client.log_batch(
            run.info.run_id,
            metrics=_slice(metrics, start),
            params=_slice(params, start),
            tags=_slice(tags, start),
        )


def _slice(items: Sequence[Any], start: int) -> list[Any]:
    return list(items[start : start + 100])


def _run_url(uri: str, experiment_id: str, run_id: str) -> str | None:
    if not uri.startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
