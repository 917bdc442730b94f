"""Run manifest, per-part commit records and the success marker of one output folder.

A part's files are named in a pending record before they are written (each by temp file and
rename, or in an object store by one PUT under its final name), and count as done only once its
commit record exists: no rename is needed, so the same protocol holds on S3, GCS and Azure.
`_SUCCESS` (and a "complete" manifest) marks a finished run. Which files are ctxprec's is
`storage.ownership`'s answer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from storage import ownership
from storage.atomic import atomic_write, atomic_write_text
from storage.core.constants import STATE_DIR
from storage.core.errors import OutputError
from storage.lock import command_line
from storage.mismatch import describe_differences
from storage.objpath import OutPath
from storage.ownership import COMMITTED, PARTS, PENDING, SUCCESS

__all__ = ["STATE_DIR", "PartRecord", "RunLog", "atomic_write_text", "fingerprint_of"]


def fingerprint_of(parts: Mapping[str, Any]) -> str:
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def _write_parquet(table: pa.Table, path: Path) -> None:
    pq.write_table(table, path, compression="zstd")


@dataclass(frozen=True, slots=True)
class PartRecord:
    key: str
    files: tuple[str, ...]
    rows: int
    failed: int


class RunLog:
    """The state of one output folder. Methods do blocking I/O: call them from a thread."""

    def __init__(
        self,
        outdir: OutPath,
        fingerprint: str,
        describe: Mapping[str, Any],
        config_fingerprint: str,
    ):
        self.outdir = outdir
        self.state = outdir / STATE_DIR
        self.fingerprint = fingerprint  # input + configuration: one run
        self.config_fingerprint = config_fingerprint  # configuration only: incremental runs
        self.describe = dict(describe)

    # -- opening -------------------------------------------------------------------------
    def open(self, *, overwrite: bool = False, incremental: bool = False) -> None:
        """Create or resume; refuse a folder that holds something else."""
        ownership.check_claimable(self.outdir)
        manifest = None if overwrite else ownership.read_manifest(self.outdir)
        if overwrite:
            ownership.remove_owned(self.outdir)
        elif incremental and self._other_config(manifest):
            raise OutputError(
                f"output folder {self.outdir} was scored with another judge configuration "
                f"({describe_differences((manifest or {}).get('describe', {}), self.describe)}); "
                "--incremental adds rows only "
                "under the same configuration: use a new folder for this one"
            )
        elif self._other_run(manifest) and not incremental:
            described = (manifest or {}).get("describe", {})
            raise OutputError(
                f"output folder {self.outdir} holds another run "
                f"({describe_differences(described, self.describe)}); "
                "use a new folder, --overwrite to replace it, or --incremental to add to it"
            )
        try:
            (self.state / PARTS).mkdir(parents=True, exist_ok=True)
            (self.outdir / SUCCESS).unlink(missing_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot write into {self.outdir}: {exc.strerror}") from exc
        self._write_manifest("running")

    def _other_config(self, manifest: dict[str, Any] | None) -> bool:
        return manifest is not None and manifest.get("config_fingerprint") != (
            self.config_fingerprint
        )

    def _other_run(self, manifest: dict[str, Any] | None) -> bool:
        return manifest is not None and manifest.get("fingerprint") != self.fingerprint

    def _write_manifest(self, status: str) -> None:
        body = {
            "fingerprint": self.fingerprint,
            "config_fingerprint": self.config_fingerprint,
            "status": status,
            "command": command_line(),
            "describe": self.describe,
        }
        atomic_write_text(self.state / "manifest.json", json.dumps(body, indent=2, default=str))

    # -- parts ---------------------------------------------------------------------------
    def committed(self, prefix: str = "") -> dict[str, PartRecord]:
        """The commit records (of the parts whose key starts with `prefix`)."""
        return {
            key: PartRecord(key, tuple(raw["files"]), int(raw["rows"]), int(raw["failed"]))
            for key, raw in ownership.records(self.outdir, prefix).items()
        }

    def commit_part(
        self, key: str, tables: Mapping[str, pa.Table], *, rows: int, failed: int
    ) -> PartRecord:
        """Name the files in a pending record, write each atomically, then the commit record.
        A file already at a target path that no record of this part names is never replaced."""
        files = sorted(tables)
        self._refuse_foreign_targets(key, files)
        pending = self.state / PARTS / f"{key}{PENDING}"
        atomic_write_text(pending, json.dumps({"key": key, "files": files}))
        for rel, table in tables.items():
            atomic_write(self.outdir / rel, partial(_write_parquet, table))
        record = PartRecord(key, tuple(files), rows, failed)
        body = {"key": key, "files": files, "rows": rows, "failed": failed}
        atomic_write_text(self.state / PARTS / f"{key}{COMMITTED}", json.dumps(body))
        pending.unlink(missing_ok=True)
        return record

    def _refuse_foreign_targets(self, key: str, files: list[str]) -> None:
        taken = [rel for rel in files if (self.outdir / rel).exists()]
        if not taken:
            return
        named: set[str] = set()
        for suffix in (COMMITTED, PENDING):
            raw = ownership.records(self.outdir, key, suffix).get(key)
            named.update(raw["files"] if raw else ())
        foreign = [rel for rel in taken if rel not in named]
        if foreign:
            raise OutputError(
                f"{self.outdir / foreign[0]} exists and ctxprec did not write it; it is left as "
                "it is: move it out of the output folder and run the same command again"
            )

    def remove_stale(self) -> None:
        """Drop what a killed run left half-done: files of parts never committed, temp files."""
        ownership.remove_torn(self.outdir)

    def save_json(self, name: str, payload: Mapping[str, Any]) -> None:
        atomic_write_text(self.state / name, json.dumps(payload, indent=2, default=str))

    def load_json(self, name: str) -> dict[str, Any] | None:
        path = self.state / name
        if not path.is_file():
            return None
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data

    def finish(self) -> None:
        self._write_manifest("complete")
        atomic_write_text(self.outdir / SUCCESS, "")
