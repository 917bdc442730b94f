"""An OTLP/HTTP receiver on 127.0.0.1 for tests, as strict as a collector: POST only, the
signal's path (/v1/logs, /v1/traces), `Content-Type: application/x-protobuf`, a body (gzip when
the exporter says so) that decodes as the signal's export request with `opentelemetry-proto`;
anything else is refused (404, 405, 415, 400) and counted. Decoded requests are kept in order.
`down()` makes it refuse with 503 (a collector that is overloaded) until `up()`.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["OtlpReceiver", "attributes"]

_SIGNALS: dict[str, tuple[Any, Any]] = {
    "/v1/logs": (ExportLogsServiceRequest, ExportLogsServiceResponse),
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
}


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return None if kind is None else getattr(v, kind)


def attributes(items: Any) -> dict[str, Any]:
    """Protobuf KeyValue list -> {key: python value}."""
    return {kv.key: _value(kv.value) for kv in items}


@dataclass
class OtlpReceiver:
    logs: list[Any] = field(default_factory=list)  # ExportLogsServiceRequest, in order
    traces: list[Any] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    refusing: bool = False
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def records(self) -> list[tuple[dict[str, Any], Any, Any]]:
        """Every log record received: (resource attributes, scope, record)."""
        found = []
        for request in self.logs:
            for rl in request.resource_logs:
                resource = attributes(rl.resource.attributes)
                for sl in rl.scope_logs:
                    found.extend((resource, sl.scope, r) for r in sl.log_records)
        return found

    def spans(self) -> list[Any]:
        return [s for r in self.traces for rs in r.resource_spans for ss in rs.scope_spans
                for s in ss.spans]  # fmt: skip

    def down(self) -> None:
        self.refusing = True

    def up(self) -> None:
        self.refusing = False

    def __enter__(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._refuse(405, "GET")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                signal = _SIGNALS.get(self.path)
                if signal is None:
                    return self._refuse(404, f"path {self.path}")
                if self.headers.get("Content-Type") != "application/x-protobuf":
                    return self._refuse(415, f"content type {self.headers.get('Content-Type')}")
                if receiver.refusing:
                    return self._refuse(503, "down")
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = signal[0]()
                try:
                    request.ParseFromString(body)
                except Exception:
                    return self._refuse(400, "not protobuf")
                (receiver.logs if self.path == "/v1/logs" else receiver.traces).append(request)
                reply = signal[1]().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def _refuse(self, status: int, why: str) -> None:
                receiver.refused.append(why)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
