"""Where a finished run is also tracked (docs/tracking.md): an MLflow run per night and an
OpenTelemetry event per scored row, once the output is complete (`_SUCCESS` written), each in a
worker thread bounded by its timeout. Tracking never fails or holds back the scoring: what cannot
be logged is said once, kept in OUTDIR (`ctxprec.storage.outdir.tracking`) and logged by the next
run. The MLflow run is made from the run's finished figures (summary.json) in one place,
`mlflow_record`; `paid_figures` says which of them are what this run paid.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pyarrow.parquet as pq

from ctxprec.config import Config
from ctxprec.connectors.tracking.mlflow_runs import (
    MLFLOW_INSTALL,
    OUTDIR_TAG,
    Logged,
    MlflowTarget,
    RunRecord,
    TrackingDown,
    log_record,
    mlflow_available,
)
from ctxprec.connectors.tracking.otel_events import (
    EVALUATION_NAME,
    OTEL_INSTALL,
    EvaluationRow,
    EventSender,
    ExportFailed,
    otel_available,
)
from ctxprec.storage.core.constants import STATUS_FAILED
from ctxprec.storage.core.errors import ConfigError, CtxprecError
from ctxprec.storage.core.redact import without_url_secrets
from ctxprec.storage.files import layout
from ctxprec.storage.files.objpath import OutPath, local_copies
from ctxprec.storage.outdir import tracking as state
from ctxprec.storage.outdir.commit import committed
from ctxprec.storage.report.summary import BANDS
from ctxprec.version import __version__

__all__ = [
    "DEFAULT_EXPERIMENT",
    "band_of",
    "check_tracking",
    "compare_record",
    "log_comparison",
    "mlflow_record",
    "paid_figures",
    "start_tracking",
    "track_run",
]

DEFAULT_EXPERIMENT = "ctxprec"  # [mlflow] experiment unset and no MLFLOW_EXPERIMENT_NAME
_EPS = 1e-9
T = TypeVar("T")


def check_tracking(cfg: Config) -> None:
    """Before the first judge call: --mlflow and --otel need their extra installed."""
    if cfg.mlflow.enabled and not mlflow_available():
        raise ConfigError(f"--mlflow needs MLflow's client: {MLFLOW_INSTALL}")
    if cfg.otel.enabled and not otel_available():
        raise ConfigError(f"--otel needs OpenTelemetry's SDK: {OTEL_INSTALL}")


def start_tracking(cfg: Config, outdir: OutPath) -> None:
    """When the folder is opened: a folder's first --otel run sends the rows of its own parts
    only, not those of runs before it."""
    if cfg.otel.enabled:
        state.start_exported(outdir, list(committed(outdir)))


# -- the figures ---------------------------------------------------------------------------
def paid_figures(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What this run paid for its verdicts: tokens sent and received and their cost (a memo hit
    costs nothing)."""
    tokens = summary.get("tokens") or {}
    return {
        "paid_input_tokens": tokens.get("paid_input_this_run"),
        "paid_output_tokens": tokens.get("paid_output_this_run"),
        "paid_cost_usd": (summary.get("cost_usd") or {}).get("paid_this_run"),
    }


def _metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """summary.json's figures as MLflow metrics (the whole output's, and this run's work)."""
    score, rows, judge = summary.get("score") or {}, summary.get("rows") or {}, summary["judge"]
    ci = summary.get("score_ci95") or {}
    estimate = summary.get("estimate") or {}
    est_ci = estimate.get("ci95") or [None, None]
    found: dict[str, Any] = {
        **{f"score_{k}": score.get(k) for k in ("mean", "median", "p10", "p90", "std")},
        "score_ci95_low": ci.get("low"),
        "score_ci95_high": ci.get("high"),
        "estimate_mean": estimate.get("mean"),
        "estimate_ci95_low": est_ci[0],
        "estimate_ci95_high": est_ci[1],
        "coverage": summary.get("coverage"),
        **{f"rows_{k}": rows.get(k) for k in ("total", "ok", "empty_context", "failed")},
        "rows_this_run": (summary.get("run") or {}).get("rows_this_run"),
        **{f"share_{b['band']}": b.get("share") for b in summary.get("bands") or []},
        **dict((summary.get("rank_metrics") or {}).items()),
        "judge_calls": judge.get("calls"),
        **{k: judge.get(k) for k in ("memo_hits", "retries", "rate_limited")},
        **paid_figures(summary),
        "wall_s": summary.get("wall_s"),
    }
    return {k: float(v) for k, v in found.items() if isinstance(v, int | float)}


def mlflow_record(
    summary: Mapping[str, Any], cfg: Config, outdir: OutPath, night: str
) -> RunRecord:
    """The MLflow run of a finished score run, from its summary.json: the judge, model, mode,
    prompt version and input as params; the figures as metrics; where the output is as tags."""
    run = summary.get("run") or {}
    model = str(run.get("judge_model") or cfg.judge.model)
    params = {
        "judge": model.partition("/")[0],
        "model": model,
        "mode": cfg.judge.mode,
        "prompt_version": str(run.get("prompt_version") or ""),
        "input": str(run.get("input") or ""),
        "scale": f"{cfg.scoring.scale:g}",
        "verdict_only": str(cfg.judge.verdict_only).lower(),
        **({"audit_model": cfg.judge.audit_model} if cfg.judge.audit_model else {}),
    }
    where = without_url_secrets(str(outdir.absolute() if isinstance(outdir, Path) else outdir))
    mean, ci = (summary.get("score") or {}).get("mean"), summary.get("score_ci95") or {}
    note = f"ctxprec score of `{params['input']}` into `{where}`: mean {mean}" + (
        f" (95 % CI {ci['low']}–{ci['high']})" if ci else ""
    )
    tags = {
        OUTDIR_TAG: where,
        "ctxprec.summary": without_url_secrets(str(layout.summary_html(outdir))),
        "ctxprec.kind": "score",
        "ctxprec.incremental": str(bool(run.get("incremental"))).lower(),
        "ctxprec.version": __version__,
        "mlflow.source.name": "ctxprec score",
        "mlflow.note.content": note,
    }
    name = Path(params["input"].rstrip("/")).name or params["input"] or "ctxprec"
    finished, started = _ms(run.get("finished_at")), _ms(run.get("started_at"))
    return RunRecord(night, name, params, _metrics(summary), tags, finished, (), started)


def _ms(iso: Any) -> int:
    try:
        return int(datetime.fromisoformat(str(iso)).timestamp() * 1000)
    except ValueError:
        return int(datetime.now().timestamp() * 1000)


def band_of(score: float, scale: float) -> str:
    """The score band of summary.json (`BANDS`) a score falls in."""
    n = score / scale if scale > 0 else 0.0
    if n < _EPS:
        return "none"
    return next(name for name, lower, *_ in BANDS if name != "none" and n >= lower - _EPS)


def compare_record(report: Mapping[str, Any], night: str) -> RunRecord:
    """The MLflow run of `ctxprec compare`: the two sides and the options as params, the paired
    difference (and the corrected one) and the gate's verdict as metrics and tags."""
    sides = {k: report.get(k) or {} for k in ("a", "b")}
    params = {
        **{k: _side_text(side) for k, side in sides.items()},
        **{
            f"model_{k}": str((side.get("judge") or {}).get("judge_model"))
            for k, side in sides.items()
        },
        "on": str(report.get("on")),
        "test": str(report.get("test")),
    }
    ci = report.get("ci95") or [None, None]
    corrected = report.get("corrected") or {}
    corrected_ci = corrected.get("ci95") or [None, None]
    gate = report.get("gate")
    found: dict[str, Any] = {
        **{k: report.get(k) for k in ("n_pairs", "mean_a", "mean_b", "mean_delta", "p_value")},
        **{k: report.get(k) for k in ("wins", "losses", "ties", "cohens_dz")},
        "ci95_low": ci[0],
        "ci95_high": ci[1],
        "corrected_delta": corrected.get("mean_delta"),
        "corrected_ci95_low": corrected_ci[0],
        "corrected_ci95_high": corrected_ci[1],
        "gate_failed": None if gate is None else float(bool(gate.get("failed"))),
    }
    metrics = {k: float(v) for k, v in found.items() if isinstance(v, int | float)}
    verdict = "none" if gate is None else ("failed" if gate.get("failed") else "passed")
    tags = {
        OUTDIR_TAG: params["a"],
        "ctxprec.kind": "compare",
        "ctxprec.gate": verdict,
        "ctxprec.version": __version__,
        "mlflow.source.name": "ctxprec compare",
        "mlflow.note.content": str((gate or {}).get("message") or f"gate: {verdict}"),
    }
    name = f"compare {Path(params['a']).name} vs {Path(params['b']).name}"
    return RunRecord(night, name, params, metrics, tags, int(datetime.now().timestamp() * 1000))


def _side_text(side: Mapping[str, Any]) -> str:
    where = ", ".join(f"{k}={v}" for k, v in (side.get("filters") or {}).items())
    return without_url_secrets(str(side.get("source")) + (f" ({where})" if where else ""))


def log_comparison(report: Mapping[str, Any], cfg: Config, files: list[Path]) -> dict[str, Any]:
    """Log a comparison to MLflow (`compare --mlflow`) with `files` as its artifacts, in a worker
    thread bounded by [mlflow] timeout_s; a failure is said once, never raised."""
    check_tracking(cfg)
    target = MlflowTarget(cfg.mlflow.experiment or DEFAULT_EXPERIMENT, cfg.mlflow.tracking_uri)
    record = compare_record(report, secrets.token_hex(12))
    record = dataclasses.replace(record, artifacts=tuple(files))
    job = _Job("mlflow", lambda: log_record(target, record))
    job.start()
    assert job.thread is not None
    job.thread.join(cfg.mlflow.timeout_s)
    if job.thread.is_alive() or job.error is not None:
        why = job.error or f"not done after {cfg.mlflow.timeout_s:g} s"
        _note(f"MLflow: could not log the comparison to experiment {target.experiment!r}: {why}")
        return {"done": False, "error": str(why)}
    got: Logged = job.result
    return {"done": True, "run_id": got.run_id, "experiment_id": got.experiment_id, "url": got.url}


# -- the run's end ------------------------------------------------------------------------
@dataclass
class _Job:
    """One tracking target's work in a worker thread, and what came of it."""

    name: str
    work: Callable[[], Any]
    result: Any = None
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"ctxprec-{self.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.work()
        except Exception as exc:  # reported by the caller, never raised into the run
            self.error = exc


def track_run(
    outdir: OutPath, cfg: Config, night: str, summary: Mapping[str, Any]
) -> dict[str, Any]:
    """Log the finished run to MLflow and send its rows' events, side by side; what could not be
    done is said once on stderr and kept for the next run. Returns what was done (RunResult's
    `tracking`)."""
    done: dict[str, Any] = {}
    jobs = []
    if cfg.mlflow.enabled:
        jobs.append(_mlflow_job(outdir, cfg, night, summary, done))
    if cfg.otel.enabled:
        jobs.append(_otel_job(outdir, cfg, summary, done))
    for job, _ in jobs:
        job.start()
    for job, settle in jobs:
        timeout = cfg.mlflow.timeout_s if job.name == "mlflow" else cfg.otel.timeout_s
        assert job.thread is not None
        job.thread.join(timeout)
        if job.thread.is_alive():
            _note(f"{job.name}: not done after {timeout:g} s; what is left is kept in "
                  "OUTDIR and sent by the next run")  # fmt: skip
            done[job.name] = {"done": False, "error": "timeout"}
            continue
        settle(job)
    return done


def _note(text: str) -> None:
    print(f"ctxprec: note: {text}", file=sys.stderr, flush=True)


def _guarded(name: str, done: dict[str, Any], fn: Callable[[], T]) -> T | None:
    """State files read and written in the run's own thread: a damaged one is said and
    skipped, never raised into a finished run."""
    try:
        return fn()
    except (CtxprecError, OSError) as exc:
        _note(f"{name}: {exc}")
        done[name] = {"done": False, "error": str(exc)}
        return None


def _mlflow_job(
    outdir: OutPath, cfg: Config, night: str, summary: Mapping[str, Any], done: dict[str, Any]
) -> tuple[_Job, Callable[[_Job], None]]:
    """This night written ahead into OUTDIR (record and summary files), then every night not
    logged yet logged in order, this one last, until one fails: to the experiment and tracking
    server asked for now (a night kept while the server was down goes where the series is)."""
    target = MlflowTarget(cfg.mlflow.experiment or DEFAULT_EXPERIMENT, cfg.mlflow.tracking_uri)
    record = mlflow_record(summary, cfg, outdir, night)
    known = _guarded("mlflow", done, lambda: _write_ahead(outdir, record))

    refused: list[str] = []

    def work() -> list[tuple[str, Logged]]:
        """A server that does not answer stops the nights; a night MLflow refuses (or a damaged
        kept record) is said and stays kept, and the nights after it are still logged."""
        logged: list[tuple[str, Logged]] = []
        if known is None:
            return logged
        nights = sorted(known.pending, key=lambda n: known.pending[n]["order"])
        for each in nights:
            try:
                logged.append((each, _log_kept(outdir, target, known, each)))
            except TrackingDown:
                raise
            except Exception as exc:
                refused.append(f"{known.pending[each].get('run_name', each)}: {exc!r}")
        return logged

    def settle(job: _Job) -> None:
        if known is None:
            return
        for each, got in job.result or []:
            known.runs[each] = {"run_id": got.run_id, "experiment_id": got.experiment_id,
                                "tracking_uri": got.tracking_uri}  # fmt: skip
            del known.pending[each]
            _guarded("mlflow", done, functools.partial(state.drop_pending, outdir, each))
        _guarded("mlflow", done, lambda: state.write_mlflow(outdir, known))
        ours = dict(job.result or []).get(night)
        done["mlflow"] = {"done": ours is not None, "pending": len(known.pending)}
        if ours is not None:
            done["mlflow"] |= {"run_id": ours.run_id, "experiment_id": ours.experiment_id,
                               "url": ours.url}  # fmt: skip
        for said in refused:
            _note(f"MLflow: experiment {target.experiment!r} did not take {said}; kept in OUTDIR")
        if refused:
            done["mlflow"]["error"] = "; ".join(refused)
        if job.error is not None:
            why = job.error if isinstance(job.error, TrackingDown) else repr(job.error)
            _note(f"MLflow: could not log to experiment {target.experiment!r}: {why}; "
                  f"{len(known.pending)} run(s) kept in OUTDIR, logged by the next run with "
                  "--mlflow")  # fmt: skip
            done["mlflow"]["error"] = str(job.error)

    return _Job("mlflow", work), settle


def _log_kept(
    outdir: OutPath, target: MlflowTarget, known: state.MlflowState, night: str
) -> Logged:
    """One kept night, with its summary files, as its MLflow run (the one OUTDIR knows, if)."""
    entry = known.pending[night]
    files = state.pending_files(outdir, night, entry["artifacts"])
    with local_copies(files, outdir) as local:
        run_id = (known.runs.get(night) or {}).get("run_id")
        return log_record(target, _record_of(night, entry, local), run_id)


def _write_ahead(outdir: OutPath, record: RunRecord) -> state.MlflowState:
    known = state.read_mlflow(outdir)
    files = layout.summary_files(outdir)
    kept = state.keep_pending(outdir, record.night, files)
    order = max((p["order"] for p in known.pending.values()), default=0) + 1
    known.pending[record.night] = {
        "run_name": record.run_name,
        "timestamp_ms": record.timestamp_ms,
        "start_ms": record.start_ms or record.timestamp_ms,
        "params": record.params,
        "metrics": record.metrics,
        "tags": record.tags,
        "artifacts": kept,
        "order": known.pending.get(record.night, {}).get("order", order),
    }
    state.write_mlflow(outdir, known)
    return known


def _record_of(night: str, entry: Mapping[str, Any], files: list[Path]) -> RunRecord:
    return RunRecord(
        night, entry["run_name"], dict(entry["params"]), dict(entry["metrics"]),
        dict(entry["tags"]), int(entry["timestamp_ms"]), tuple(files), entry.get("start_ms"),
    )  # fmt: skip


# -- OpenTelemetry --------------------------------------------------------------------------
def _otel_job(
    outdir: OutPath, cfg: Config, summary: Mapping[str, Any], done: dict[str, Any]
) -> tuple[_Job, Callable[[_Job], None]]:
    """The rows of every part not sent yet, then the run's span."""
    exported = _guarded("otel", done, lambda: state.read_exported(outdir)) or set()
    records = _guarded("otel", done, lambda: committed(outdir)) or {}
    todo = sorted(key for key in records if key not in exported)
    sent_keys: list[str] = []
    run = summary.get("run") or {}

    def work() -> int:
        sender = EventSender(cfg.otel.endpoint, cfg.otel.batch_events, {}, __version__)
        try:
            sender.start_run("ctxprec score", _ns(run.get("started_at")), _span_start(cfg, run))
            sent = 0
            for key in todo:
                files = [outdir / rel for rel in records[key].files]
                with local_copies(files, outdir) as local:
                    sent += sender.send(_rows(local, cfg))
                sent_keys.append(key)
            sender.end_run(_ns(run.get("finished_at")), _span_end(summary, sent))
            return sent
        finally:
            sender.close()

    def settle(job: _Job) -> None:
        if sent_keys:
            _guarded("otel", done, lambda: state.write_exported(outdir, exported | set(sent_keys)))
        left = len(todo) - len(sent_keys)
        done["otel"] = {"done": job.error is None, "events": job.result or 0,
                        "parts": len(sent_keys), "parts_left": left}  # fmt: skip
        if job.error is not None:
            why = job.error if isinstance(job.error, ExportFailed) else repr(job.error)
            _note(f"OpenTelemetry: {why}; the rows of {left} part(s) are sent by the next run "
                  "with --otel")  # fmt: skip
            done["otel"]["error"] = str(job.error)

    return _Job("otel", work), settle


def _span_start(cfg: Config, run: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "gen_ai.evaluation.name": EVALUATION_NAME,
        "gen_ai.request.model": str(run.get("judge_model") or cfg.judge.model),
        "ctxprec.input": str(run.get("input") or ""),
    }


def _span_end(summary: Mapping[str, Any], sent: int) -> dict[str, Any]:
    rows, mean = summary.get("rows") or {}, (summary.get("score") or {}).get("mean")
    found = {
        "ctxprec.rows": rows.get("total"),
        "ctxprec.rows_failed": rows.get("failed"),
        "ctxprec.rows_this_run": (summary.get("run") or {}).get("rows_this_run"),
        "ctxprec.events": sent,
        "ctxprec.score_mean": mean,
    }
    return {k: v for k, v in found.items() if v is not None}


def _ns(iso: Any) -> int:
    return _ms(iso) * 1_000_000


def _rows(files: list[Path], cfg: Config) -> Iterator[EvaluationRow]:
    """The event of each row of a part's files, read a record batch at a time."""
    names = cfg.column_map
    trace = names.output_name(cfg.columns.trace_id) if cfg.columns.trace_id else None
    span = names.output_name(cfg.columns.span_id) if cfg.columns.span_id else None
    wanted = ["id", "score", "status", "error", "reason", "scored_at", *filter(None, (trace, span))]
    scale = cfg.scoring.scale
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(cfg.otel.batch_events, columns=wanted):
            for row in batch.to_pylist():
                yield _event_row(row, scale, trace, span)


def _event_row(row: dict[str, Any], scale: float, trace: str | None, span: str | None
               ) -> EvaluationRow:  # fmt: skip
    score, failed = row["score"], row["status"] == STATUS_FAILED
    error = None
    if failed:
        error = str(row["error"] or "failed").split(":", 1)[0].strip() or "failed"
    when = row["scored_at"]
    return EvaluationRow(
        id=str(row["id"]),
        score=None if score is None else float(score),
        label=None if score is None else band_of(float(score), scale),
        explanation=row["reason"],
        error=error,
        time_ns=None if when is None else int(when.timestamp() * 1e9),
        trace_id=_hex_id(row.get(trace) if trace else None, 16),
        span_id=_hex_id(row.get(span) if span else None, 8),
    )


def _hex_id(value: Any, size: int) -> int | None:
    """A W3C trace id (16 bytes) or span id (8 bytes) as hex text or raw bytes; None when the
    value is not one (or all zeros, which OpenTelemetry reads as none)."""
    if isinstance(value, bytes | bytearray) and len(value) == size:
        number = int.from_bytes(value, "big")
    elif isinstance(value, str) and len(text := value.strip().lower()) == 2 * size:
        try:
            number = int(text, 16)
        except ValueError:
            return None
    else:
        return None
    return number or None
