"""Output sinks: warehouse tables a run's scored part files are appended to (Delta Lake, DuckDB,
Apache Iceberg).
The engines are imported only when a sink is used, so importing this package stays cheap.
"""

from __future__ import annotations

from ctxprec.connectors.sinks.base import Sink, SinkResult
from ctxprec.connectors.sinks.delta import DeltaSink
from ctxprec.connectors.sinks.duckdb import DuckDBSink
from ctxprec.connectors.sinks.iceberg import IcebergSink, parse_identifier
from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.core.seams import DEFAULT, Seams

__all__ = ["Sink", "SinkResult", "parse_sink"]

_FORMS = (
    "use delta:PATH (e.g. delta:/data/scores) "
    "or duckdb:FILE:TABLE (e.g. duckdb:evals.duckdb:scores) "
    "or iceberg:CATALOG/NAMESPACE.TABLE (e.g. iceberg:lake/analytics.scores)"
)


def parse_sink(spec: str, seams: Seams = DEFAULT) -> Sink:
    """`delta:PATH`, `duckdb:FILE:TABLE` (the table is what follows the last colon) or
    `iceberg:CATALOG/NAMESPACE.TABLE` (a catalog configured the pyiceberg way)."""
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ConfigError(f"sink {spec!r} is not understood; {_FORMS}")
    if kind == "delta":
        return DeltaSink(rest, seams)
    if kind == "duckdb":
        file, sep, table = rest.rpartition(":")
        if not sep or not file or not table:
            raise ConfigError(f"sink {spec!r} names no DuckDB file and table; {_FORMS}")
        return DuckDBSink(file, table, seams)
    if kind == "iceberg":
        return IcebergSink(*parse_identifier(spec, rest), seams)
    raise ConfigError(f"unknown sink kind {kind!r} in {spec!r}; {_FORMS}")
