"""Run manifest, per-part commit records and the success marker of one output folder.

Part files are written to a dot-named temp file and renamed into place; a part counts as done only
once its commit record exists. `_SUCCESS` (and a "complete" manifest) marks a finished run.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import OutputError
from storage.mismatch import describe_differences

__all__ = ["STATE_DIR", "PartRecord", "RunLog", "atomic_write_text", "fingerprint_of"]

STATE_DIR = "_ctxprec"
SUCCESS = "_SUCCESS"
_OUR_FILES = {"summary.json", "summary.md", "charts", STATE_DIR, SUCCESS}


def fingerprint_of(parts: Mapping[str, Any]) -> str:
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class PartRecord:
    key: str
    files: tuple[str, ...]
    rows: int
    failed: int


class RunLog:
    """The state of one output folder. Methods do blocking I/O: call them from a thread."""

    def __init__(
        self, outdir: Path, fingerprint: str, describe: Mapping[str, Any], config_fingerprint: str
    ):
        self.outdir = outdir
        self.state = outdir / STATE_DIR
        self.fingerprint = fingerprint  # input + configuration: one run
        self.config_fingerprint = config_fingerprint  # configuration only: incremental runs
        self.describe = dict(describe)

    # -- opening -------------------------------------------------------------------------
    def open(self, *, overwrite: bool = False, incremental: bool = False) -> None:
        """Create or resume; refuse a folder that holds something else."""
        if self.outdir.exists() and not self.outdir.is_dir():
            raise OutputError(f"output {self.outdir} is a file, not a folder; pass a folder path")
        manifest = self._read_manifest()
        foreign = self._foreign_files()
        if foreign:
            raise OutputError(
                f"output folder {self.outdir} holds files ctxprec did not write "
                f"({', '.join(foreign[:3])}); choose a new or empty folder"
            )
        if overwrite and self.outdir.exists():
            self._clear()
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
        (self.state / "parts").mkdir(parents=True, exist_ok=True)
        (self.outdir / SUCCESS).unlink(missing_ok=True)
        self._write_manifest("running")

    def _other_config(self, manifest: dict[str, Any] | None) -> bool:
        return manifest is not None and manifest.get("config_fingerprint") != (
            self.config_fingerprint
        )

    def _other_run(self, manifest: dict[str, Any] | None) -> bool:
        return manifest is not None and manifest.get("fingerprint") != self.fingerprint

    def _ours(self, path: Path) -> bool:
        name = path.name
        if name.startswith(".") or name in _OUR_FILES:
            return True
        if path.is_dir():
            return "=" in name  # a Hive partition folder
        return name.endswith(".parquet") and name.startswith("part-")

    def _foreign_files(self) -> list[str]:
        if not self.outdir.is_dir():
            return []
        return sorted(p.name for p in self.outdir.iterdir() if not self._ours(p))

    def _clear(self) -> None:
        """Remove only what ctxprec writes (checked by `_foreign_files` before)."""
        for child in self.outdir.iterdir():
            if child.name.startswith(".") and ".tmp" not in child.name:
                continue  # hidden entries that are not our temp files (.git, .DS_Store) stay
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()

    def _read_manifest(self) -> dict[str, Any] | None:
        path = self.state / "manifest.json"
        if not path.is_file():
            return None
        try:
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise OutputError(
                f"{path} is unreadable; the folder is damaged: use a new one or --overwrite"
            ) from None
        return data

    def _write_manifest(self, status: str) -> None:
        body = {
            "fingerprint": self.fingerprint,
            "config_fingerprint": self.config_fingerprint,
            "status": status,
            "describe": self.describe,
        }
        atomic_write_text(self.state / "manifest.json", json.dumps(body, indent=2, default=str))

    # -- parts ---------------------------------------------------------------------------
    def committed(self, prefix: str = "") -> dict[str, PartRecord]:
        """The commit records (of the parts whose key starts with `prefix`)."""
        records: dict[str, PartRecord] = {}
        for path in sorted((self.state / "parts").glob(f"{glob.escape(prefix)}*.json")):
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # a torn record is no record: the part is redone
            records[raw["key"]] = PartRecord(
                raw["key"], tuple(raw["files"]), int(raw["rows"]), int(raw["failed"])
            )
        return records

    def commit_part(
        self, key: str, tables: Mapping[str, pa.Table], *, rows: int, failed: int
    ) -> PartRecord:
        """Write each table to its relative path atomically, then the commit record."""
        for rel, table in tables.items():
            target = self.outdir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            pq.write_table(table, tmp, compression="zstd")
            os.replace(tmp, target)
        record = PartRecord(key, tuple(sorted(tables)), rows, failed)
        body = {"key": key, "files": list(record.files), "rows": rows, "failed": failed}
        atomic_write_text(self.state / "parts" / f"{key}.json", json.dumps(body))
        return record

    def remove_stale(self, keep: set[str]) -> None:
        """Drop part files of this folder that no commit record lists (torn earlier runs)."""
        for path in self.outdir.rglob("*.parquet"):
            rel = path.relative_to(self.outdir).as_posix()
            if rel.startswith(STATE_DIR) or rel in keep:
                continue
            path.unlink()
        for tmp in self.outdir.rglob(".*.tmp*"):
            tmp.unlink(missing_ok=True)

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
