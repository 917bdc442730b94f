"""The run manifest of one output folder (which run it holds, opened, resumed or refused), its
run figures and the success marker: `_SUCCESS` (and a "complete" manifest) marks a finished run.
Parts are committed by `ctxprec.storage.outdir.commit`; which files are ctxprec's is
`ctxprec.storage.outdir.ownership`'s answer.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ctxprec.storage.core.errors import OutputError, StateDamagedError
from ctxprec.storage.core.redact import without_url_secrets
from ctxprec.storage.files import confine, layout
from ctxprec.storage.files.atomic import atomic_write_text
from ctxprec.storage.files.layout import COMMITTED, PENDING
from ctxprec.storage.files.objpath import OutPath
from ctxprec.storage.outdir import ownership, statefile
from ctxprec.storage.outdir.batches import BatchStore
from ctxprec.storage.outdir.lock import command_line
from ctxprec.storage.outdir.mismatch import added_columns, describe_differences
from ctxprec.storage.outdir.ownership import has_manifest

__all__ = ["RunLog", "fingerprint_of", "history_entry"]

# what each run adds to the output's history (run.json "history"), read by the summary
_HISTORY_KEYS = (
    "started_at", "finished_at", "wall_s", "incremental", "rows_this_run", "rows_skipped",
    "judge_calls", "memo_hits", "reason_calls", "price",
)  # fmt: skip


_FIX = "remove it to start over, or use --overwrite"


def history_entry(run: Mapping[str, Any]) -> dict[str, Any]:
    """One run's line of the output's history: when, rows, calls, tokens, price, wall time."""
    judge = run.get("judge") or {}
    return {
        **{k: run.get(k) for k in _HISTORY_KEYS},
        "input_tokens": judge.get("input_tokens"),
        "output_tokens": judge.get("output_tokens"),
        "cached_input_tokens": judge.get("cached_input_tokens"),
        "engine": (run.get("engine") or {}).get("name"),
    }


def fingerprint_of(parts: Mapping[str, Any]) -> str:
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


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
        self.fingerprint = fingerprint  # input + configuration: one run
        self.config_fingerprint = config_fingerprint  # configuration only: incremental runs
        self.describe = dict(describe)
        self._incremental = False  # how the folder was opened (the manifest says so)

    # -- opening -------------------------------------------------------------------------
    def open(self, *, overwrite: bool = False, incremental: bool = False) -> None:
        """Create or resume; refuse a folder that holds something else."""
        ownership.check_claimable(self.outdir)
        manifest = None if overwrite else ownership.read_manifest(self.outdir)
        self.check_state(overwrite=overwrite)  # all read and checked before anything changes
        if overwrite:
            ownership.remove_owned(self.outdir)
        elif incremental and self._other_config(manifest) and self._added(manifest):
            added = ", ".join(f"`{c}`" for c in self._added(manifest) or [])
            print(
                f"ctxprec: note: --incremental adds the column(s) {added} to {self.outdir}: the "
                "rows earlier runs wrote read them back as null (as a Delta or Iceberg table "
                "adds a column)",
                file=sys.stderr,
            )
        elif incremental and self._other_config(manifest):
            raise OutputError(
                f"output folder {self.outdir} was scored with another judge configuration "
                f"({describe_differences((manifest or {}).get('describe', {}), self.describe)}); "
                "--incremental adds rows only "
                "under the same configuration: use a new folder for this one, or --overwrite "
                "instead of --incremental to replace what it holds"
            )
        elif self._other_run(manifest) and not incremental:
            described = (manifest or {}).get("describe", {})
            # only what will work: --incremental is refused when the configuration differs
            fixes = (
                "use a new folder, or --overwrite to replace it (--incremental adds rows only "
                "under the same configuration, or with passthrough columns added)"
                if self._other_config(manifest) and not self._added(manifest)
                else "use a new folder, --overwrite to replace it, or --incremental to add to it"
            )
            raise OutputError(
                f"output folder {self.outdir} holds another run "
                f"({describe_differences(described, self.describe)}); {fixes}"
            )
        elif not incremental and self._holds_additions(manifest):
            raise OutputError(
                f"output folder {self.outdir} holds rows that --incremental runs added; a run "
                "without --incremental would score their ids a second time: run the same "
                "command with --incremental added (it scores only the ids the folder lacks), "
                "or with --overwrite to replace what it holds by this input alone"
            )
        self._incremental = incremental
        try:
            layout.parts_dir(self.outdir).mkdir(parents=True, exist_ok=True)
            layout.success(self.outdir).unlink(missing_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot write into {self.outdir}: {exc.strerror}") from exc
        self._write_manifest("running")

    def check_state(self, *, overwrite: bool) -> None:
        """Every state file a run reads back, read and checked (a damaged one is an OutputError
        naming it): --overwrite replaces the run's own, so only what it keeps is read then."""
        outdir = self.outdir
        if overwrite:
            place = confine.dangerous_outdir(outdir)
            if place is not None and has_manifest(outdir):
                raise OutputError(
                    f"output folder {outdir} is {place}; --overwrite never replaces it, "
                    "whatever files it holds: pass a folder of its own below it"
                )
        else:
            for suffix in (COMMITTED, PENDING):
                ownership.records(outdir, suffix=suffix)
            self.load_json(layout.run_info(outdir), statefile.RUN_INFO)
            for path in layout.sink_records(outdir):
                self.load_json(path, statefile.SINK_RECORD)
        if isinstance(outdir, Path):  # batch runs write local folders only
            BatchStore.load(outdir)  # the batch state stays through --overwrite
            BatchStore.load(outdir, audit=True)  # and the audit judge's
        if not overwrite and self.load_estimate() is None:
            confine.unlink(outdir, layout.estimate(outdir))  # damaged: a cache, made again

    def _other_config(self, manifest: dict[str, Any] | None) -> bool:
        return manifest is not None and manifest.get("config_fingerprint") != (
            self.config_fingerprint
        )

    def _added(self, manifest: dict[str, Any] | None) -> list[str] | None:
        """The passthrough columns this run adds to the folder's, when that is all that differs
        in the configuration."""
        return added_columns((manifest or {}).get("describe", {}), self.describe)

    def _holds_additions(self, manifest: dict[str, Any] | None) -> bool:
        """Rows of an --incremental run are committed here, or one wrote the manifest last
        (its parts may not be committed yet) while parts of another run are: a plain run's
        resume skips parts by key only, so it must not open such a folder."""
        keys = ownership.records(self.outdir).keys() if manifest is not None else ()
        if any(layout.is_incremental_key(k) for k in keys):
            return True
        return bool(keys) and (manifest or {}).get("incremental") is True

    def _other_run(self, manifest: dict[str, Any] | None) -> bool:
        return manifest is not None and manifest.get("fingerprint") != self.fingerprint

    def _write_manifest(self, status: str) -> None:
        body = {
            "fingerprint": self.fingerprint,
            "config_fingerprint": self.config_fingerprint,
            "status": status,
            "incremental": self._incremental,
            "command": command_line(),
            "describe": self.describe,
        }
        text = without_url_secrets(json.dumps(body, indent=2, default=str))
        atomic_write_text(layout.manifest(self.outdir), text)

    # -- parts (their commit is `ctxprec.storage.outdir.commit`) --------------------------------
    def remove_stale(self) -> None:
        """Drop what a killed run, or a worker killed during this one, left half-done: files of
        parts never committed, pending records, temp files."""
        ownership.remove_torn(self.outdir)

    def save_json(self, path: OutPath, payload: Mapping[str, Any]) -> None:
        """Save one of the state files `ctxprec.storage.files.layout` names (e.g.
        `layout.run_info(outdir)`)."""
        atomic_write_text(path, json.dumps(payload, indent=2, default=str))

    def load_json(self, path: OutPath, spec: statefile.Spec) -> dict[str, Any] | None:
        """One state file of this folder, checked against `spec` (None when there is none)."""
        data: dict[str, Any] | None = statefile.read_json(self.outdir, path, spec, _FIX)
        return data

    def load_estimate(self) -> dict[str, Any] | None:
        """The saved estimate; a damaged one is only a lost cache: a note, and None."""
        try:
            return self.load_json(layout.estimate(self.outdir), statefile.ESTIMATE)
        except StateDamagedError as exc:
            print(f"ctxprec: note: {str(exc).split('; nothing was changed')[0]}; ignored "
                  "(it is only a saved estimate)", file=sys.stderr)  # fmt: skip
            return None

    def history(self, run: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The runs that wrote this output, oldest first, this one (`run`) last: the previous
        run.json's history (a run.json from before histories counts as one run) plus this run.
        --overwrite removes run.json, so a replaced output starts a new history."""
        before = self.load_json(layout.run_info(self.outdir), statefile.RUN_INFO)
        past: list[dict[str, Any]] = []
        if before is not None:
            past = list(before.get("history") or [history_entry(before)])
        return [*past, history_entry(run)]

    def finish(self) -> None:
        self._write_manifest("complete")
        atomic_write_text(layout.success(self.outdir), "")
