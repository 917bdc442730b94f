"""OpenTelemetry over OTLP/HTTP (protobuf) through the SDK's own exporters (`opentelemetry-sdk`
and `opentelemetry-exporter-otlp-proto-http`: the `otel` extra), imported only when a run sends
events. Each scored row is one `gen_ai.evaluation.result` event (the GenAI semantic
conventions): evaluation name `context_precision`, the score and its band, the row's reason as
the explanation, the row id as `gen_ai.response.id`, and the row's trace and span ids when the
input carries them (else the run's span); the run itself is one span. Where they go, with which
headers, timeout and certificates, is OpenTelemetry's own OTEL_EXPORTER_OTLP_* variables (or the
endpoint given). Events are exported `batch` at a time and flushed before more are made, so at
most that many are held; a collector that does not take a batch ends the sending.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EVALUATION_EVENT",
    "EVALUATION_NAME",
    "OTEL_INSTALL",
    "EvaluationRow",
    "EventSender",
    "ExportFailed",
    "otel_available",
]

OTEL_INSTALL = "pip install 'ctxprec[otel]'"
EVALUATION_EVENT = "gen_ai.evaluation.result"
EVALUATION_NAME = "context_precision"
EXPLANATION_CHARS = 8192  # a row's reason, at most, in one event
_SCOPE = "ctxprec"


class ExportFailed(Exception):
    """The collector did not take a batch (down, refused, too slow): sending stopped there."""


@dataclass(frozen=True, slots=True)
class EvaluationRow:
    """One scored row as an event: `score` and `label` are None for a failed row, whose
    `error` says why; `trace_id` / `span_id` are the request's own when the input has them."""

    id: str
    score: float | None
    label: str | None
    explanation: str | None
    error: str | None
    time_ns: int | None
    trace_id: int | None = None
    span_id: int | None = None


def otel_available() -> bool:
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
    )


def event_attributes(row: EvaluationRow) -> dict[str, Any]:
    """The event's attributes: the semantic conventions' names, then ctxprec's own."""
    attributes: dict[str, Any] = {
        "gen_ai.evaluation.name": EVALUATION_NAME,
        "gen_ai.response.id": row.id,
    }
    if row.score is not None:
        attributes["gen_ai.evaluation.score.value"] = row.score
    if row.label is not None:
        attributes["gen_ai.evaluation.score.label"] = row.label
    if row.explanation:
        attributes["gen_ai.evaluation.explanation"] = row.explanation[:EXPLANATION_CHARS]
    if row.error is not None:
        attributes["error.type"] = row.error
    return attributes


class _Watched:
    """An exporter that remembers whether its last export failed (the SDK's processors only
    log it)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.failed = False

    def export(self, batch: Sequence[Any]) -> Any:
        result = self.inner.export(batch)
        if getattr(result, "name", "SUCCESS") != "SUCCESS":
            self.failed = True
        return result

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))

    def shutdown(self) -> None:
        self.inner.shutdown()


class EventSender:
    """One run's span and its events. Not thread-safe: one thread sends."""

    def __init__(
        self, endpoint: str | None, batch: int, resource: Mapping[str, Any], version: str
    ) -> None:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        base = endpoint.rstrip("/") if endpoint else None
        found = Resource.create(dict(resource))
        if str(found.attributes.get("service.name", "")).startswith("unknown_service"):
            found = found.merge(Resource({"service.name": _SCOPE}))  # OTEL_SERVICE_NAME wins
        self._logs = _Watched(OTLPLogExporter(endpoint=f"{base}/v1/logs" if base else None))
        self._spans = _Watched(OTLPSpanExporter(endpoint=f"{base}/v1/traces" if base else None))
        self._batch = batch
        self._processor = BatchLogRecordProcessor(
            self._logs,  # type: ignore[arg-type]
            max_queue_size=2 * batch,
            max_export_batch_size=batch,
        )
        self._log_provider = LoggerProvider(resource=found)
        self._log_provider.add_log_record_processor(self._processor)
        self._logger = self._log_provider.get_logger(_SCOPE, version)
        self._trace_provider = TracerProvider(resource=found)
        self._trace_provider.add_span_processor(SimpleSpanProcessor(self._spans))  # type: ignore[arg-type]
        self._tracer = self._trace_provider.get_tracer(_SCOPE, version)
        self._run_span: Any = None

    def start_run(self, name: str, start_ns: int, attributes: Mapping[str, Any]) -> None:
        """The run's span: events of rows without a trace of their own belong to it."""
        self._run_span = self._tracer.start_span(
            name, start_time=start_ns, attributes=dict(attributes)
        )

    def send(self, rows: Iterable[EvaluationRow]) -> int:
        """Emit one event per row, `batch` at a time, each batch flushed before the next is
        made; the rows sent. ExportFailed when a batch is not taken."""
        sent = pending = 0
        for row in rows:
            self._emit(row)
            pending += 1
            if pending == self._batch:
                sent += self._flush(pending)
                pending = 0
        return sent + (self._flush(pending) if pending else 0)

    def _emit(self, row: EvaluationRow) -> None:
        from opentelemetry._logs import SeverityNumber

        self._logger.emit(
            timestamp=row.time_ns,
            context=self._context(row),
            severity_number=SeverityNumber.INFO,
            event_name=EVALUATION_EVENT,
            attributes=event_attributes(row),
        )

    def _context(self, row: EvaluationRow) -> Any:
        from opentelemetry import trace

        if row.trace_id is None:
            if self._run_span is None:
                return None
            return trace.set_span_in_context(self._run_span)
        flags = trace.TraceFlags(trace.TraceFlags.SAMPLED)
        context = trace.SpanContext(row.trace_id, row.span_id or 0, True, flags)
        return trace.set_span_in_context(trace.NonRecordingSpan(context))

    def _flush(self, count: int) -> int:
        if not self._processor.force_flush() or self._logs.failed:
            raise ExportFailed("the OTLP endpoint did not take the events")
        return count

    def end_run(self, end_ns: int, attributes: Mapping[str, Any]) -> None:
        """End the run's span (exported at once); ExportFailed when it is not taken."""
        if self._run_span is None:
            return
        self._run_span.set_attributes(dict(attributes))
        self._run_span.end(end_time=end_ns)
        if self._spans.failed:
            raise ExportFailed("the OTLP endpoint did not take the run's span")

    def close(self) -> None:
        """Stop the exporters' threads and sessions (what was not flushed is dropped)."""
        self._log_provider.shutdown()
        self._trace_provider.shutdown()
