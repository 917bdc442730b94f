"""Quality gates for schedulers: `score --fail-under X` (the mean score of the input's rows below
X) and the exit codes that tell a failed gate (5) and a gate with nothing to judge (7) from
failed rows (1, which wins: failed rows are never hidden behind a gate).

The gate judges the rows the command is about: the input's ids as the output holds them,
whether this run scored them or an earlier one did. The same command therefore gives the same
verdict however often it runs (a retried night that finds nothing new to score fails as the
first attempt did), and a gate with no scored row to judge says so instead of passing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from ctxprec.storage.core.constants import STATUS_EMPTY, STATUS_FAILED, STATUS_OK
from ctxprec.storage.core.figures import counted, round_figure
from ctxprec.storage.files.objpath import OutPath, local_copies
from ctxprec.storage.outdir.ownership import part_files
from ctxprec.storage.stats.paired import TIE_EPS

__all__ = [
    "EMPTY_GATE_EXIT",
    "GATE_EXIT",
    "GateVerdict",
    "below",
    "empty_gate_message",
    "gate_exit",
    "gate_failed",
    "gate_line",
    "judge_gate",
    "run_mean",
    "shortfall",
    "under_gate",
]

GATE_EXIT = 5
EMPTY_GATE_EXIT = 7  # a gate found no scored row to judge (--pass-empty lets it pass)
_SCORED = (STATUS_OK, STATUS_EMPTY)
_COLUMNS = {"id": None, "status": pl.String, "score": pl.Float64, "scored_at": None}


@dataclass(frozen=True, slots=True)
class GateVerdict:
    """What a gate found: the rows it judged, their mean, and its outcome (`passed`, `failed`
    or `empty`: no scored row to judge). `message` is the line a failed or empty gate prints."""

    gate: str  # "--fail-under 0.9"
    threshold: float
    outcome: str
    rows: int  # scored rows (ok, empty_context) judged
    mean: float | None
    rows_this_run: int  # of `rows`, scored by this run (the rest by earlier runs)
    failed: int  # the input's rows that failed: not judged (the rows' exit code says so)
    pass_empty: bool = False
    message: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The gate in `--quiet` JSON, run.json and summary.json."""
        return {
            "gate": self.gate,
            "threshold": self.threshold,
            "outcome": self.outcome,
            "passed": self.outcome == "passed" or (self.outcome == "empty" and self.pass_empty),
            "rows": self.rows,
            "mean": None if self.mean is None else round_figure(self.mean),
            "rows_this_run": self.rows_this_run,
            "rows_before": self.rows - self.rows_this_run,
            "failed_rows": self.failed,
            "pass_empty": self.pass_empty,
            "message": self.message,
        }


def _rows(outdir: OutPath) -> pl.DataFrame:
    files = part_files(outdir)
    if not files:
        return pl.DataFrame(schema={k: v or pl.String for k, v in _COLUMNS.items()})
    with local_copies(files, outdir) as local:  # object stores: a temp copy
        scans = [pl.scan_parquet(f, hive_partitioning=False).select(*_COLUMNS) for f in local]
        return pl.concat(scans, how="vertical_relaxed").collect()


def _of_input(rows: pl.DataFrame, ids: pl.Series | None) -> pl.DataFrame:
    """The output's rows whose id is one of the input's (all of them when `ids` is None: a
    plain run's output is its input)."""
    if ids is None:
        return rows
    wanted = pl.DataFrame({"id": ids}).unique()
    kind = rows.schema["id"]
    if wanted.schema["id"] != kind:
        wanted = wanted.with_columns(pl.col("id").cast(kind, strict=False))
    return rows.join(wanted, on="id", how="semi")


def judge_gate(
    outdir: OutPath,
    threshold: float,
    *,
    ids: pl.Series | None = None,
    since: datetime | None = None,
    pass_empty: bool = False,
) -> GateVerdict:
    """`--fail-under threshold` over the output's rows of the input (`ids`; None: every row),
    the `ok` and `empty_context` ones. `since`: when this run started (rows scored at or after
    it are this run's)."""
    rows = _of_input(_rows(outdir), ids)
    failed = int((rows.get_column("status") == STATUS_FAILED).sum())
    scored = rows.filter(pl.col("status").is_in(_SCORED) & pl.col("score").is_not_null())
    now = 0
    if since is not None and scored.height:
        now = int((scored.get_column("scored_at") >= since).sum())
    mean: float | None = None
    if scored.height:
        mean = float(scored.get_column("score").cast(pl.Float64).mean())  # type: ignore[arg-type]
    gate = f"--fail-under {threshold:g}"
    if mean is None:
        total = rows.height if ids is None else ids.len()
        why = _nothing(total, failed, ids is not None)
        message: str | None = empty_gate_message(gate, why, pass_empty)
        outcome = "empty"
    else:
        message = under_gate(mean, scored.height, threshold, now)
        outcome = "passed" if message is None else "failed"
    return GateVerdict(
        gate, threshold, outcome, scored.height, mean, now, failed, pass_empty, message
    )


def _nothing(total: int, failed: int, incremental: bool) -> str:
    """Why a gate had no scored row: an empty input, or every row of it failed."""
    if not total:
        return "the input has no rows"
    where = "the input's" if incremental else "the output's"
    return f"none of {where} {counted(total, 'row')} is scored ({failed:,} failed)"


def empty_gate_message(
    gate: str, why: str, pass_empty: bool, flag: str = "--pass-empty (or [gate] pass_empty = true)"
) -> str:
    """The line of a gate that had nothing to judge (`--fail-under`, `--fail-drop`)."""
    if pass_empty:
        return f"{gate} had nothing to judge ({why}); it passes (--pass-empty)"
    return (
        f"{gate} had nothing to judge ({why}); a gate with no scored row neither passes nor "
        f"fails: add {flag} to let such a night pass"
    )


def below(mean: float | None, threshold: float) -> bool:
    """The gate's rule: the mean is below `threshold` (a mean equal to it, within float noise,
    passes). The Python API's thresholds (`ctxprec.analysis.verdict`) use it too."""
    return mean is not None and mean < threshold - TIE_EPS


def shortfall(mean: float, threshold: float) -> str:
    """ "0.6917, 0.0083 below the threshold": the mean as summary.md and --quiet show it, and a
    gap that adds up to it."""
    shown = round_figure(mean)
    return f"{shown:.4f}, {round_figure(threshold - shown):.4f} below the threshold"


def run_mean(outdir: OutPath) -> tuple[float | None, int]:
    """(mean score, rows) over every ok and empty_context row of the output, as the gate takes
    them (`score_frame`'s verdict: its output holds exactly its input)."""
    verdict = judge_gate(outdir, 0.0)
    return verdict.mean, verdict.rows


def under_gate(mean: float | None, rows: int, threshold: float, this_run: int = 0) -> str | None:
    """The failure message when the mean is below `threshold` (a mean equal to it passes)."""
    if mean is None or not below(mean, threshold):
        return None
    earlier = rows - this_run
    who = (
        "all scored by this run"
        if not earlier
        else "all scored by earlier runs"
        if not this_run
        else f"{this_run:,} scored by this run, {earlier:,} by earlier runs"
    )
    return (
        f"--fail-under {threshold:g} failed: the mean score of the input's "
        f"{counted(rows, 'scored row')} ({who}) is {shortfall(mean, threshold)}"
    )


def gate_line(verdict: GateVerdict) -> str:
    """The gate in one line for the CLI: passed (with its figure), failed or empty."""
    if verdict.outcome == "passed":
        assert verdict.mean is not None
        earlier = verdict.rows - verdict.rows_this_run
        return (
            f"{verdict.gate} passed: the mean score of the input's "
            f"{counted(verdict.rows, 'scored row')} is {round_figure(verdict.mean):.4f}"
            + (f" ({earlier:,} of them scored by earlier runs)" if earlier else "")
        )
    return verdict.message or ""


def gate_exit(rows_exit: int, verdict: GateVerdict | None) -> int:
    """Print a failed (or empty) gate's line; exit 5 for a failed gate, 7 for one with nothing
    to judge (0 with --pass-empty), or keep 1 when rows failed too."""
    if verdict is None or verdict.message is None:
        return rows_exit
    if verdict.outcome == "empty":
        if verdict.pass_empty:
            print(f"ctxprec: note: {verdict.message}", file=sys.stderr)
            return rows_exit
        code = EMPTY_GATE_EXIT
    else:
        code = GATE_EXIT
    return gate_failed(rows_exit, verdict.message, code)


def gate_failed(rows_exit: int, message: str, code: int = GATE_EXIT) -> int:
    """Print a gate's failure line; its exit code, or the rows' when they failed too."""
    what = "gate failed" if code == GATE_EXIT else "no gate verdict"
    if rows_exit == 1:
        print(f"ctxprec: {what} (and rows failed, exit 1): {message}", file=sys.stderr)
        return 1
    print(f"ctxprec: {what} (exit {code}): {message}", file=sys.stderr)
    return code if rows_exit == 0 else rows_exit
