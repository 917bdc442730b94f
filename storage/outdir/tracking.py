"""What an output folder keeps of its tracking (docs/tracking.md): the MLflow run of each night,
the nights MLflow has not taken yet (their record and a copy of their summary files, so that a
night logged while the tracking server was down reaches it with the next run) and the parts
whose rows went out as OpenTelemetry events. Read back through `statefile`'s schemas like every
state file: night keys, run ids and file names are checked before any of them names a path or
goes into a request.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxprec.storage.files import confine, layout
from ctxprec.storage.files.atomic import atomic_write_bytes, atomic_write_text
from ctxprec.storage.files.objpath import OutPath
from ctxprec.storage.outdir import statefile
from ctxprec.storage.outdir.statefile import Spec

__all__ = [
    "MLFLOW_STATE",
    "OTEL_STATE",
    "MlflowState",
    "drop_pending",
    "keep_pending",
    "pending_files",
    "read_exported",
    "read_mlflow",
    "start_exported",
    "write_exported",
    "write_mlflow",
]

_NIGHT = re.compile(r"[0-9a-f]{8,64}")  # a run's fingerprint (`runlog.fingerprint_of`)
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # MLflow's run and experiment ids
_FIX = "remove it: the next run with --mlflow or --otel starts it again"
_RECORD = {
    "run_name": "str",
    "timestamp_ms": "int",
    "start_ms": "int",
    "params": {"*": "str"},
    "metrics": {"*": "num"},
    "tags": {"*": "str"},
    "artifacts": ["str"],
    "order": "int",
}
MLFLOW_STATE = Spec(
    {
        "runs": {"*": {"run_id": "str", "experiment_id": "str", "tracking_uri": "?str"}},
        "pending": {"*": _RECORD},
    }
)
OTEL_STATE = Spec({"exported": ["str"]}, required=("exported",), cap=statefile.RUN_INFO_CAP)


@dataclass
class MlflowState:
    """`runs`: night -> {run_id, experiment_id, tracking_uri}; `pending`: night -> the record
    of a night MLflow has not taken yet (`order` keeps them in the order they ran)."""

    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)


def _problem(value: dict[str, Any]) -> str | None:
    for night, run in value.get("runs", {}).items():
        if not _NIGHT.fullmatch(night):
            return f"runs has a key {night[:40]!r} that is not a run's fingerprint"
        if not (_RUN_ID.fullmatch(run["run_id"]) and _RUN_ID.fullmatch(run["experiment_id"])):
            return f"runs.{night} holds an id that is not an MLflow id"
    for night, record in value.get("pending", {}).items():
        if not _NIGHT.fullmatch(night):
            return f"pending has a key {night[:40]!r} that is not a run's fingerprint"
        names = record.get("artifacts", [])
        if any(name not in _ARTIFACTS for name in names):
            return f"pending.{night}.artifacts names a file that is not a summary file"
    return None


# the files a night's record may name: the summary files, kept by name in its pending folder
_ARTIFACTS = {path.name for path in layout.summary_files(Path("."))}


def read_mlflow(outdir: OutPath) -> MlflowState:
    """The folder's MLflow state (empty when there is none); StateDamagedError when damaged."""
    value = statefile.read_json(outdir, layout.mlflow_state(outdir), MLFLOW_STATE, _FIX)
    if value is None:
        return MlflowState()
    if (problem := _problem(value)) is not None:
        raise statefile.damaged(layout.mlflow_state(outdir), problem, _FIX)
    return MlflowState(dict(value.get("runs", {})), dict(value.get("pending", {})))


def write_mlflow(outdir: OutPath, state: MlflowState) -> None:
    body = {"runs": state.runs, "pending": state.pending}
    atomic_write_text(layout.mlflow_state(outdir), json.dumps(body, indent=2, sort_keys=True))


def keep_pending(outdir: OutPath, night: str, files: list[OutPath]) -> list[str]:
    """Copy a night's summary files into its pending folder (before MLflow is asked, so that
    nothing is lost if it never answers); the names copied."""
    if not _NIGHT.fullmatch(night):
        raise ValueError(night)
    kept = []
    for source in files:
        if source.name in _ARTIFACTS and source.is_file():
            data = statefile.read_bytes(outdir, source, statefile.RUN_INFO_CAP, _FIX)
            if data is not None:
                atomic_write_bytes(layout.mlflow_pending(outdir, night) / source.name, data)
                kept.append(source.name)
    return kept


def pending_files(outdir: OutPath, night: str, names: list[str]) -> list[OutPath]:
    """The kept copies of a night's summary files (checked names: `read_mlflow`)."""
    folder = layout.mlflow_pending(outdir, night)
    return [confine.check_inside(outdir, folder / name) for name in names if name in _ARTIFACTS]


def drop_pending(outdir: OutPath, night: str) -> None:
    """Remove a night's copies once MLflow has them: only the summary files ctxprec copied
    there, and the folder when that leaves it empty."""
    if not _NIGHT.fullmatch(night):
        raise ValueError(night)
    folder = layout.mlflow_pending(outdir, night)
    for name in sorted(_ARTIFACTS):
        confine.unlink(outdir, folder / name)
    try:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    except OSError:
        pass  # not empty, or already gone: a leftover folder holds nothing of the user's


def start_exported(outdir: OutPath, committed: list[str]) -> None:
    """The first run with --otel on a folder: the parts committed before it are not sent (their
    rows were scored by runs that did not ask for events); a folder that has the state keeps it."""
    if read_exported(outdir) is None:
        write_exported(outdir, set(committed))


def read_exported(outdir: OutPath) -> set[str] | None:
    """The part keys whose rows were sent as events; None before the first run with --otel."""
    value = statefile.read_json(outdir, layout.otel_state(outdir), OTEL_STATE, _FIX)
    if value is None:
        return None
    return {key for key in value["exported"] if layout.is_part_key(key)}


def write_exported(outdir: OutPath, keys: set[str]) -> None:
    atomic_write_text(layout.otel_state(outdir), json.dumps({"exported": sorted(keys)}))
