"""The driver's part of a run, around the stages: before the first judge call, check everything
and open (or resume) the output folder (`prepare_run`); after the last, publish to sinks and write
the summary, run.json and `_SUCCESS` (`finish_run`). Every engine runs these two on its client.

A run driven from this process (the local engine, the batch-API run) runs in `local_run`'s frame:
prepared (which takes the output folder's lock), its stages run by the caller, finished, and the
lock given back however it ends. `run_blocking` is the synchronous way in, for them and for the
Dask engine's driver and tasks.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
import polars as pl

from ctxprec.analysis.quality_gate import GateVerdict, judge_gate
from ctxprec.config import Config
from ctxprec.connectors.judges import JudgeStats, audit_settings, create_judge
from ctxprec.connectors.judges.prompts import prompt_version_for
from ctxprec.connectors.sources import SourceInfo, input_texts, inspect_input, read_ids
from ctxprec.flow.dispatch import RunCounters, add_counts
from ctxprec.flow.extractor import load_extractor
from ctxprec.flow.planning import check_memo
from ctxprec.flow.reduce import TableSpec
from ctxprec.limits.limiter import ThrottleStats
from ctxprec.run.estimate import estimate
from ctxprec.run.interrupt import stoppable
from ctxprec.run.notices import memo_notices, run_notices, skipped_formats_line
from ctxprec.run.publish import check_sinks, publish
from ctxprec.run.tracking import check_tracking, start_tracking, track_run
from ctxprec.storage.core.constants import STATUS_FAILED
from ctxprec.storage.core.errors import ConfigError, InputError, UserError, first_meaningful
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.core.settings import Price
from ctxprec.storage.files import layout
from ctxprec.storage.files.objpath import OutPath
from ctxprec.storage.outdir.commit import commit_part, committed
from ctxprec.storage.outdir.dataset import drop_ids, scored_ids
from ctxprec.storage.outdir.lock import OutdirLock
from ctxprec.storage.outdir.ownership import (
    check_claimable,
    drop_incomplete,
    incomplete_parts,
    missing_rows_line,
    warn_foreign,
)
from ctxprec.storage.outdir.runlog import RunLog, fingerprint_of
from ctxprec.storage.outdir.schema import SCHEMA_VERSION, output_schema
from ctxprec.storage.report.charts import CHARTS_INSTALL, charts_available, preload
from ctxprec.storage.report.rows import RunTexts
from ctxprec.storage.report.summary import build_summary, write_summary

__all__ = [
    "AUTO_ESTIMATE_ROWS",
    "AuditCounts",
    "LocalRun",
    "RunOptions",
    "RunPlan",
    "RunResult",
    "StageResult",
    "finish_run",
    "local_run",
    "prepare_run",
    "release_outdir",
    "run_blocking",
]

AUTO_ESTIMATE_ROWS = 200_000  # inputs up to this size are estimated before they are scored


@dataclass
class RunResult:
    """What a run did. Tokens and cost come twice: `paid_*`, what this run paid (the judge's
    reported usage of its calls, re-asks and failed calls included; a memo hit pays nothing),
    and `verdict_*`, what the verdicts of the rows it wrote cost when they were first paid
    (each call once, memo hits included). The output's figures over all its rows and runs are
    in `summary["tokens"]` and `summary["cost_usd"]`."""

    outdir: OutPath
    rows: int
    failed: int
    summary: dict[str, Any]
    counters: RunCounters
    stats: JudgeStats
    sink_errors: tuple[str, ...] = ()
    gate: GateVerdict | None = None  # [gate] fail_under: the input's rows judged
    tracking: dict[str, Any] = field(default_factory=dict)  # --mlflow, --otel: what was done

    @property
    def exit_code(self) -> int:
        """The rows' exit code: 1 when rows (or a sink) failed; the gate's is the CLI's."""
        return 1 if self.failed or self.sink_errors else 0

    @property
    def paid_input_tokens(self) -> int:
        """Input tokens this run's judge calls were billed for (a memo hit: none)."""
        return self.stats.input_tokens

    @property
    def paid_output_tokens(self) -> int:
        return self.stats.output_tokens

    @property
    def verdict_input_tokens(self) -> int:
        """Input tokens the verdicts of the rows this run wrote cost when they were first paid,
        by this run or an earlier one (memo hits count here)."""
        return self.counters.verdict_input_tokens

    @property
    def verdict_output_tokens(self) -> int:
        return self.counters.verdict_output_tokens

    @property
    def paid_cost_usd(self) -> float | None:
        """What this run paid in USD at `[prices]` (None when the model has no price)."""
        return self._cost("paid")

    @property
    def verdict_cost_usd(self) -> float | None:
        """What the verdicts of the rows this run wrote cost when first paid, in USD."""
        return self._cost("verdicts")

    def _cost(self, which: str) -> float | None:
        value = ((self.summary.get("run") or {}).get("cost_usd") or {}).get(which)
        return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How one run treats its output folder and shows itself (--overwrite, --incremental,
    --progress, --wait-lock): every engine's entry point takes these as one object. What is
    scored, and how, is the `Config`."""

    overwrite: bool = False  # replace what the folder holds
    incremental: bool = False  # add the rows the folder does not hold yet
    progress: str = "auto"  # "auto" | "on" | "off"
    wait_lock: float = 0.0  # seconds to wait for another run's lock
    # what a test may replace (retry clock, transport, keys, sizes, fault hook): DEFAULT is real
    seams: Seams = DEFAULT


@dataclass
class RunPlan:
    """What the driver settled before any judge call; picklable, so an engine can ship it."""

    input: str
    cfg: Config
    info: SourceInfo
    runlog: RunLog
    spec: TableSpec
    identity: dict[str, object]
    skip_parts: frozenset[str] = frozenset()  # parts an earlier run finished
    rows_skipped: int = 0  # and their rows
    skip_ids: pl.Series | None = None
    run_tag: str = ""
    lock: OutdirLock | None = None  # held by the driver from open to finish; copies hold nothing
    seams: Seams = DEFAULT  # RunOptions.seams, for every judge and stage of the run
    audit_identity: dict[str, object] | None = None  # --audit-model: the audit judge's identity


@dataclass
class StageResult:
    """What stages did, summed: counters, judge statistics and throttle statistics."""

    counters: RunCounters
    stats: JudgeStats
    throttle: ThrottleStats
    extra: dict[str, Any] = field(default_factory=dict)  # an engine's own figures
    recheck: dict[str, Any] | None = None  # --recheck: the judge's self-agreement
    audit: AuditCounts | None = None  # --audit-model: what the audit judge did
    texts: RunTexts | None = None  # the report's texts kept by a stage run in this process


@dataclass
class AuditCounts:
    """What the audit judge did in a run (its calls are not the first judge's: each judge's
    calls, tokens and cost are reported side by side)."""

    counters: RunCounters
    stats: JudgeStats
    rows: int = 0  # rows of this run in the audit sample

    def add(self, other: AuditCounts) -> None:
        add_counts(self.counters, other.counters)
        add_counts(self.stats, other.stats)
        self.rows += other.rows


async def prepare_run(
    input: str,
    outdir: OutPath,
    cfg: Config,
    options: RunOptions = RunOptions(),
) -> RunPlan:
    """Everything before the first judge call: check the output path, input, judge, output
    columns and sinks; lock and open (or resume) the folder; decide what a resumed or
    incremental run skips. On any error the lock is given back. `outdir` was converted once,
    where it came in (`ctxprec.storage.files.objpath.out_path`: the CLI's parser, the Python API's
    entry)."""
    cfg, kept = _keep_group_column(cfg)
    info = await anyio.to_thread.run_sync(_inspect, input, cfg, kept)
    if kept and kept not in info.partition_columns:
        print(
            f"ctxprec: note: --group-by {kept} keeps the input column `{kept}` in the output "
            f"(as --passthrough {kept} would)",
            file=sys.stderr,
        )
    if cfg.columns.extractor:
        load_extractor(cfg.columns.extractor)  # a bad one fails before the folder is touched
    judge = create_judge(cfg.judge, seams=options.seams)
    identity = judge.identity()
    await judge.aclose()
    audit_identity = await _audit_identity(cfg, options)
    config_part = _config_identity(cfg, identity, audit_identity)
    describe = {**config_part, **_input_identity(input, info, cfg)}
    runlog = RunLog(outdir, fingerprint_of(describe), describe, fingerprint_of(config_part))
    spec = _table_spec(info, cfg, judge.model)
    _check_output_columns(cfg, spec)
    await anyio.to_thread.run_sync(check_sinks, cfg.output.sinks, spec.schema)
    check_tracking(cfg)  # --mlflow, --otel: their extra is installed
    if cfg.output.charts and not charts_available():
        raise ConfigError(
            "--charts draws PNG charts with matplotlib, which is not installed here: "
            f"{CHARTS_INSTALL} (summary.md and summary.json need nothing more)"
        )
    await anyio.to_thread.run_sync(check_memo, cfg)  # a memo folder refused changes nothing
    await anyio.to_thread.run_sync(check_claimable, outdir)  # before the lock creates anything
    lock = OutdirLock(outdir, settle_s=options.seams.lock_settle_s)
    lock.acquire(
        options.wait_lock
    )  # in this thread, nothing else runs yet: Ctrl-C ends a long wait
    run = RunPlan(
        input,
        cfg,
        info,
        runlog,
        spec,
        identity,
        lock=lock,
        seams=options.seams,
        audit_identity=audit_identity,
    )
    try:
        await _open(run, overwrite=options.overwrite, incremental=options.incremental)
    except BaseException:
        release_outdir(run)
        raise
    return run


def release_outdir(plan: RunPlan) -> None:
    """Give back the output folder's lock (engines call it when the run ends, however)."""
    if plan.lock is not None:
        plan.lock.release()


async def _open(run: RunPlan, *, overwrite: bool, incremental: bool) -> None:
    runlog, cfg, outdir, input = run.runlog, run.cfg, run.runlog.outdir, run.input
    # every committed part checked against its record before anything changes (read once)
    incomplete = {} if overwrite else await anyio.to_thread.run_sync(incomplete_parts, outdir)
    await anyio.to_thread.run_sync(
        lambda: runlog.open(overwrite=overwrite, incremental=incremental)
    )
    await anyio.to_thread.run_sync(start_tracking, cfg, outdir)
    warning = await anyio.to_thread.run_sync(warn_foreign, outdir)
    if warning:
        print(warning, file=sys.stderr)
    if cfg.output.charts:
        preload()  # matplotlib loads while the judge works, not after it
    await anyio.to_thread.run_sync(_drop_incomplete, outdir, incomplete, incremental)
    if incremental:
        run.run_tag = layout.incremental_tag(datetime.now(UTC))
        run.skip_ids = await anyio.to_thread.run_sync(_incremental_skip, outdir, run.info, cfg)
    elif (
        run.info.total_rows <= AUTO_ESTIMATE_ROWS
        and not run.spec.judge_model.startswith("offline")
        and runlog.load_estimate() is None
    ):
        # a small input for a paid judge: price it first, so the summary can show estimate vs
        # actual (the offline judge costs nothing: no pass over the input for it)
        try:
            est = await anyio.to_thread.run_sync(lambda: estimate(input, cfg, info=run.info))
        except UserError:
            pass  # e.g. a corrupt page: the run itself scores what it can read, then says so
        else:
            runlog.save_json(layout.estimate(outdir), est)
    await anyio.to_thread.run_sync(_plan_resume, run)


def _drop_incomplete(
    outdir: OutPath, incomplete: dict[str, list[tuple[str, str]]], incremental: bool
) -> None:
    """Parts whose files are gone or damaged (not what their record says: `incomplete_parts`)
    are scored again (their records and remaining files go first)."""
    if incomplete:
        line = missing_rows_line(outdir, incomplete)
        drop_incomplete(outdir, incomplete)
        again = "they are scored again"
        if incremental:
            again = "their ids are scored again where this input holds them"
        print(f"ctxprec: note: {line}; {again}", file=sys.stderr)


def _plan_resume(plan: RunPlan) -> None:
    """A resumed run skips the parts committed without failures; torn files are removed."""
    records = committed(plan.runlog.outdir)
    if not plan.run_tag:  # incremental runs commit under a new tag: nothing of theirs is done
        done = {k: r for k, r in records.items() if r.failed == 0}
        plan.skip_parts = frozenset(done)
        plan.rows_skipped = sum(r.rows for r in done.values())
    plan.runlog.remove_stale()


def _check_output_columns(cfg: Config, spec: TableSpec) -> None:
    """--partition-by and --group-by name output columns: checked before any judge call."""
    names = spec.schema.names
    wanted = [("--partition-by", c) for c in cfg.output.partition_by]
    if cfg.output.group_by:
        wanted.append(("--group-by", cfg.output.group_by))
    for flag, col in wanted:
        if col not in names:
            raise ConfigError(
                f"{flag} {col}: `{col}` is not an output column; copy it from the input with "
                f"--passthrough {col} (output columns: {', '.join(names)})"
            )


def _keep_group_column(cfg: Config) -> tuple[Config, str | None]:
    """--group-by naming no output column groups by the input column of that name: it is
    passed through (the output keeps what the summary groups by). The config as the run uses
    it, and the column added (None: nothing to add)."""
    group = cfg.output.group_by
    if not group:
        return cfg, None
    columns = cfg.column_map
    fixed = output_schema(ks=cfg.scoring.ks, labels=columns.labels is not None, audit=True).names
    passed = {columns.output_name(name) for name in columns.passthrough}
    if group in fixed or group in passed or group in columns.passthrough:
        return cfg, None
    kept = dataclasses.replace(cfg.columns, passthrough=(*cfg.columns.passthrough, group))
    return dataclasses.replace(cfg, columns=kept), group


def _inspect(input: str, cfg: Config, kept: str | None = None) -> SourceInfo:
    try:
        info = inspect_input(input, cfg.columns, cfg.storage)
    except InputError as exc:
        missing = f"column `{kept}` is missing in "
        if kept and str(exc).startswith(missing):  # the one column missing is the group's
            where = str(exc).removeprefix(missing).split("; fix the name")[0]
            raise ConfigError(
                f"--group-by {kept}: `{kept}` is neither an output column nor a column of {where}"
            ) from exc
        raise
    line = skipped_formats_line(info)
    if line:
        print(line, file=sys.stderr, flush=True)
    return info


async def _audit_identity(cfg: Config, options: RunOptions) -> dict[str, object] | None:
    """The audit judge's identity (its memo keys), checked like the first judge's: a missing key
    or an unknown model fails here, before any call."""
    settings = audit_settings(cfg.judge)
    if settings is None:
        return None
    judge = create_judge(settings, seams=options.seams)
    identity = judge.identity()
    await judge.aclose()
    return identity


def _config_identity(
    cfg: Config, identity: dict[str, object], audit: dict[str, object] | None = None
) -> dict[str, Any]:
    """Everything that changes a row's scored output (not which rows there are)."""
    c = cfg.column_map
    audited = {"judge": audit, "fraction": cfg.judge.audit_fraction, "seed": cfg.judge.audit_seed}
    return ({"audit": audited} if audit is not None else {}) | {
        "columns": [c.id, c.query, c.expected, c.context, c.labels, list(c.passthrough)]
        + ([[list(r) for r in c.renames]] if c.renames else []),
        "extractor": cfg.columns.extractor,
        "judge": identity,
        "judge_model": cfg.judge.model,
        "mode": cfg.judge.mode,
        **({"verdict_only": True} if cfg.judge.verdict_only else {}),  # the reasons differ
        "scale": cfg.scoring.scale,
        "ks": list(cfg.scoring.ks),
        "max_item_chars": cfg.run.max_item_chars,
        "partition_by": list(cfg.output.partition_by),
        "schema_version": SCHEMA_VERSION,
    }


def _input_identity(input: str, info: SourceInfo, cfg: Config) -> dict[str, Any]:
    files = []
    for f in info.files:
        files.append([f.absolute(), f.size, f.mtime_ns])
    policy = cfg.columns.duplicate_ids  # which of an id's rows are scored (refuse: one only)
    return {"input": input, "files": files, "batch_rows": cfg.run.batch_rows} | (
        {"duplicate_ids": policy} if policy != "refuse" else {}
    )


def _table_spec(info: SourceInfo, cfg: Config, model: str) -> TableSpec:
    labels = cfg.column_map.labels is not None
    audit = bool(cfg.judge.audit_model)
    schema = output_schema(
        info.id_type, info.passthrough_fields, cfg.scoring.ks, labels=labels, audit=audit
    )
    return TableSpec(
        schema, model, cfg.scoring.scale, cfg.scoring.ks, cfg.judge.mode == "row", labels,
        cfg.judge.verdict_only, audit,
    )  # fmt: skip


def _incremental_skip(outdir: OutPath, info: SourceInfo, cfg: Config) -> pl.Series:
    """Ids already scored (ok or empty_context) are skipped; failed rows of ids in this input
    are dropped from the folder first, so that this run can score them again."""
    have = scored_ids(outdir)
    failed = have.filter(pl.col("status") == STATUS_FAILED).get_column("id")
    if failed.len():
        incoming = read_ids(info, cfg.column_map.id)
        retry = incoming.filter(incoming.is_in(failed.implode()))
        drop_ids(outdir, retry.to_list())
    return have.filter(pl.col("status") != STATUS_FAILED).get_column("id")


def finish_run(
    plan: RunPlan, result: StageResult, started_at: datetime, wall: float, engine: dict[str, Any]
) -> RunResult:
    """Sinks, summary, run.json and `_SUCCESS` once every stage is done, then MLflow and
    OpenTelemetry when asked (blocking I/O)."""
    run_info = _run_info(plan, result, started_at, wall, engine)
    outdir = plan.runlog.outdir
    plan.seams.at("finish", outdir)
    summary, sink_errors, gate = _finish(plan, run_info, result.texts, started_at)
    rows = summary.get("rows", {})
    return RunResult(
        outdir,
        int(rows.get("total", 0)),
        int(rows.get("failed", 0)),
        summary,
        result.counters,
        result.stats,
        tuple(sink_errors),
        gate,
        track_run(outdir, plan.cfg, plan.runlog.fingerprint, summary),
    )


def _gate(plan: RunPlan, started_at: datetime) -> GateVerdict | None:
    """`[gate] fail_under` over the input's rows as the output holds them: an incremental
    run's input ids (scored now or by an earlier run), a plain run's whole output."""
    gate = plan.cfg.gate
    if gate.fail_under is None:
        return None
    ids = read_ids(plan.info, plan.cfg.column_map.id) if plan.run_tag else None
    return judge_gate(
        plan.runlog.outdir, gate.fail_under, ids=ids, since=started_at, pass_empty=gate.pass_empty
    )


def _prompts_used(run: RunPlan, rows_by_prompt: dict[str, int]) -> str:
    """The prompt versions this run judged its rows with, most rows first; a run that wrote no
    row names the ones its input allows (without an expected column: the query-only one)."""
    if rows_by_prompt:
        return " / ".join(sorted(rows_by_prompt, key=lambda v: (-rows_by_prompt[v], v)))
    expected = ("expected", None) if run.info.has_expected else (None,)
    return " / ".join(
        prompt_version_for(e, run.spec.per_row, run.spec.verdict_only) for e in expected
    )


def _run_info(
    run: RunPlan, result: StageResult, started_at: datetime, wall: float, engine: dict[str, Any]
) -> dict[str, Any]:
    c, stats = result.counters, result.stats
    model = run.spec.judge_model
    price = run.cfg.price_for(model)
    return (
        {
            "started_at": started_at.isoformat(),
            "finished_at": datetime.now(UTC).isoformat(),
            "wall_s": wall,
            "input": run.input,
            "judge_model": model,
            "prompt_version": _prompts_used(run, c.rows_by_prompt),
            "incremental": bool(run.run_tag),
            "rows_this_run": c.rows_done - c.rows_skipped,
            "rows_skipped": c.rows_skipped,
            "items_this_run": c.items,
            "judge_calls": c.judge_calls,
            "calls_failed": c.calls_failed,
            "memo_hits": c.memo_hits,
            "dedup_hits": c.dedup_hits,
            "reason_calls": c.reason_calls,
            "judge": stats.as_dict(),
            **_tokens_info(c, stats, price),
            "throttle": result.throttle.as_dict(),
            "price": None
            if price is None
            else {"input_per_mtok": price.input_per_mtok, "output_per_mtok": price.output_per_mtok}
            | (
                {}
                if price.cached_input_per_mtok is None
                else {"cached_input_per_mtok": price.cached_input_per_mtok}
            ),
            "concurrency": run.cfg.limits.concurrency,
            "rpm": run.cfg.limits.rpm,
            "tpm": run.cfg.limits.tpm,
            "engine": {**engine, **result.extra},
            "notices": run_notices(run.input, run.info, run.cfg) + memo_notices(c),
            "duplicate_ids": None if run.info.duplicates is None else run.info.duplicates.as_dict(),
            "memo_unreadable": c.memo_unreadable,
            "group_by": run.cfg.output.group_by,
        }
        | ({"recheck": result.recheck} if result.recheck is not None else {})
        | _audit_info(run, result)
    )


def _tokens_info(c: RunCounters, stats: JudgeStats, price: Price | None) -> dict[str, Any]:
    """run.json's `tokens` and `cost_usd`: what this run paid (the judge's reported usage)
    and what the verdicts of the rows it wrote cost when first paid (their `verdict_*`
    columns), the cost at `[prices]` (full precision; null without a price)."""
    tokens = {
        "paid_input_tokens": stats.input_tokens,
        "paid_output_tokens": stats.output_tokens,
        "verdict_input_tokens": c.verdict_input_tokens,
        "verdict_output_tokens": c.verdict_output_tokens,
    }
    cost = None
    if price is not None:
        cost = {
            "paid": price.usd(stats.input_tokens, stats.output_tokens, stats.cached_input_tokens),
            "verdicts": price.usd(c.verdict_input_tokens, c.verdict_output_tokens),
        }
    return {"tokens": tokens, "cost_usd": cost}


def _audit_info(run: RunPlan, result: StageResult) -> dict[str, Any]:
    """run.json's `audit`: the audit judge's model, sample and what it did this run."""
    j = run.cfg.judge
    if not j.audit_model:
        return {}
    counts = result.audit or AuditCounts(RunCounters(), JudgeStats())
    c, stats = counts.counters, counts.stats
    price = run.cfg.price_for(j.audit_model)
    return {"audit": {
        "model": j.audit_model,
        "fraction": j.audit_fraction,
        "seed": j.audit_seed,
        "rows_this_run": counts.rows,
        "items_this_run": c.items,
        "judge_calls": c.judge_calls,
        "calls_failed": c.calls_failed,
        "memo_hits": c.memo_hits,
        "dedup_hits": c.dedup_hits,
        "judge": stats.as_dict(),
        "price": None if price is None else {
            "input_per_mtok": price.input_per_mtok, "output_per_mtok": price.output_per_mtok
        },
    }}  # fmt: skip


def _finish(
    run: RunPlan, run_info: dict[str, Any], kept: RunTexts | None, started_at: datetime
) -> tuple[dict[str, Any], list[str], GateVerdict | None]:
    outdir = run.runlog.outdir
    # a worker killed while writing (its task done again elsewhere) left a temp file or a part
    # that no commit names: gone before readers of OUTDIR/*.parquet see the run as finished
    run.runlog.remove_stale()
    if not committed(outdir) and not run.cfg.output.partition_by:
        # an input with no rows still gives a readable (empty) dataset in the documented schema
        empty = {f"{layout.part_name('empty')}.parquet": run.spec.schema.empty_table()}
        commit_part(outdir, "empty", empty, rows=0, failed=0)
    loaded, errors = publish(
        run.cfg.output.sinks, run.runlog, run.spec.schema, run.cfg.output.partition_by
    )
    run_info["sinks"] = loaded
    run_info["sink_errors"] = errors
    gate = _gate(run, started_at)
    if gate is not None:
        run_info["quality_gate"] = gate.as_dict()
    estimate = run.runlog.load_estimate()
    if estimate is not None:
        run_info["estimate"] = estimate
    run_info["history"] = run.runlog.history(run_info)  # every run of this output, this one last
    summary = build_summary(
        outdir,
        run_info,
        scale=run.cfg.scoring.scale,
        group_by=run.cfg.output.group_by,
        ks=run.cfg.scoring.ks,
    )
    texts = input_texts(run.runlog.describe)  # the item texts summary.html shows
    if kept is not None:  # those this run kept as it scored, the input read back for the rest
        texts = kept.lookup(texts)
    write_summary(outdir, summary, charts=run.cfg.output.charts, texts=texts)
    run.runlog.save_json(layout.run_info(outdir), run_info)
    run.runlog.finish()
    return summary, errors, gate


# -- a run driven from this process ------------------------------------------------------
T = TypeVar("T")


def run_blocking(fn: Callable[[], Awaitable[T]]) -> T:
    """Run `fn` on a new event loop. User-facing errors raised inside a task group come out as
    themselves, not wrapped in an ExceptionGroup; a stop signal cancels it and comes out as
    KeyboardInterrupt once its shutdown has run (`ctxprec.run.interrupt`)."""
    try:
        return anyio.run(stoppable, fn)
    except BaseExceptionGroup as group:
        raise first_meaningful(group) from None


@dataclass(frozen=True, slots=True)
class LocalRun:
    """A prepared run whose stages execute in this process, which holds the folder's lock."""

    plan: RunPlan
    started: float  # time.monotonic() before prepare
    started_at: datetime

    async def finish(self, result: StageResult) -> RunResult:
        """Sinks, summary, run.json and `_SUCCESS`, once every stage is done."""
        wall = time.monotonic() - self.started
        engine = {"name": "local", "workers": 1, "tasks": 1}
        return await anyio.to_thread.run_sync(
            finish_run, self.plan, result, self.started_at, wall, engine
        )


@asynccontextmanager
async def local_run(
    input: str,
    outdir: OutPath,
    cfg: Config,
    options: RunOptions,
) -> AsyncIterator[LocalRun]:
    """Prepare the run; the lock is held from open to finish, whatever happens in between."""
    started, started_at = time.monotonic(), datetime.now(UTC)
    plan = await prepare_run(input, outdir, cfg, options)
    try:
        yield LocalRun(plan, started, started_at)
    finally:
        release_outdir(plan)
