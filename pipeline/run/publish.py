"""After a run: append the part files that a table sink has not loaded yet (Delta, DuckDB).
What each sink has loaded is recorded in the run state, so a sink that failed once catches up
on the next run, and a sink never sees a file twice (it also skips ids it already holds).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ctxprec.connectors.sinks import Sink, parse_sink
from ctxprec.storage.core.errors import UserError
from ctxprec.storage.files import layout
from ctxprec.storage.files.objpath import OutPath
from ctxprec.storage.outdir.commit import committed
from ctxprec.storage.outdir.runlog import RunLog
from ctxprec.storage.outdir.statefile import SINK_RECORD

__all__ = ["check_sinks", "publish"]


def check_sinks(specs: Sequence[str], schema: pa.Schema) -> list[Sink]:
    """Before any judge call: every sink parses and can take this schema."""
    sinks = [parse_sink(spec) for spec in specs]
    for sink in sinks:
        sink.check(schema)
    return sinks


def _state_path(runlog: RunLog, sink: Sink) -> OutPath:
    return layout.sink_record(runlog.outdir, hashlib.sha256(sink.name.encode()).hexdigest()[:16])


def publish(
    specs: Sequence[str], runlog: RunLog, schema: pa.Schema, partition_by: Sequence[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Load pending files into each sink; a sink's failure is reported, not raised."""
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    # file -> failed rows it held when committed; failed rows are held back by the sinks, so a
    # file loaded while it had some is loaded again later (ids already loaded are skipped)
    files = {f: r.failed for r in committed(runlog.outdir).values() for f in r.files}
    for sink in (parse_sink(spec) for spec in specs):
        state = runlog.load_json(_state_path(runlog, sink), SINK_RECORD) or {
            "sink": sink.name,
            "loaded": {},
        }
        loaded: dict[str, int] = state["loaded"]
        pending = sorted(f for f in files if loaded.get(f, 1) > 0)
        try:
            result = sink.append(runlog.outdir, pending, schema, partition_by) if pending else None
        except UserError as exc:
            errors.append(f"{sink.name}: {exc}")
            continue
        loaded.update({f: files[f] for f in pending})
        runlog.save_json(_state_path(runlog, sink), state)
        results.append(
            {
                "sink": sink.name,
                "files": len(pending),
                "rows_added": result.rows_added if result else 0,
                "rows_skipped": result.rows_skipped if result else 0,
            }
        )
    return results, errors
