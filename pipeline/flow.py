"""The batch entry point: read -> fan out -> judge -> reduce -> write, in one task group.

Record batches stream from the source; a few batches are open at once, their items go to a bounded
job stream served by `concurrency` workers; each finished batch is reduced in Polars and committed
as a part file. Finished parts are skipped when a run is resumed; `--incremental` skips ids the
output folder already holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import polars as pl

from connectors.judges import Judge, JudgeStats, create_judge
from connectors.judges.prompts import prompt_version_for
from connectors.sources import SourceBatch, SourceInfo, inspect_source, iter_batches
from pipeline.batch import (
    BatchJob,
    Extractor,
    TableSpec,
    attach_keys,
    load_extractor,
    plan_rows,
    resolve_items,
    scored_table,
)
from pipeline.config import Config
from pipeline.dispatch import Dispatcher, RunCounters
from pipeline.errors import ConfigError, CtxprecError
from pipeline.estimate import estimate
from pipeline.limits import RateGate
from pipeline.progress import Progress
from pipeline.publish import check_sinks, publish
from pipeline.writer import partition_tables
from storage.dataset import drop_ids, scored_ids
from storage.memo import Memo, default_cache_dir, judge_prefix
from storage.report import build_summary, write_summary
from storage.runlog import RunLog, fingerprint_of
from storage.schema import SCHEMA_VERSION, STATUS_FAILED, output_schema

__all__ = ["AUTO_ESTIMATE_ROWS", "RunResult", "run_score", "score"]

AUTO_ESTIMATE_ROWS = 200_000  # inputs up to this size are estimated before they are scored


@dataclass
class RunResult:
    outdir: Path
    rows: int
    failed: int
    summary: dict[str, Any]
    counters: RunCounters
    stats: JudgeStats
    sink_errors: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return 1 if self.failed or self.sink_errors else 0


@dataclass
class _Run:
    cfg: Config
    info: SourceInfo
    runlog: RunLog
    dispatcher: Dispatcher
    memo: Memo | None
    prefix: bytes
    spec: TableSpec
    extractor: Extractor | None
    counters: RunCounters
    skip_parts: frozenset[str] = frozenset()
    skip_ids: pl.Series | None = None
    run_tag: str = ""


def score(
    input: str | Path, outdir: str | Path, config: Config | None = None, **kw: Any
) -> RunResult:
    """Synchronous batch entry point (what `ctxprec score` runs). User-facing errors raised
    inside the task group come out as themselves, not wrapped in an ExceptionGroup."""
    try:
        return anyio.run(lambda: run_score(str(input), Path(outdir), config or Config(), **kw))
    except BaseExceptionGroup as group:
        raise _first_meaningful(group) from None


def _first_meaningful(group: BaseExceptionGroup[BaseException]) -> BaseException:
    for kind in (KeyboardInterrupt, CtxprecError):
        match, _ = group.split(kind)
        if match is not None:
            leaf: BaseException = match
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            return leaf
    return group


async def run_score(
    input: str,
    outdir: Path,
    cfg: Config,
    *,
    overwrite: bool = False,
    incremental: bool = False,
    progress: str = "auto",
) -> RunResult:
    started, started_at = time.monotonic(), datetime.now(UTC)
    info = await anyio.to_thread.run_sync(_inspect, input, cfg)
    extractor = load_extractor(cfg.extractor) if cfg.extractor else None
    stats = JudgeStats()
    gate = RateGate(cfg.concurrency, cfg.rpm, cfg.tpm, adaptive=cfg.adaptive)
    judge = create_judge(cfg.judge, gate=gate, stats=stats)
    try:
        run = await _prepare(input, outdir, cfg, info, judge, extractor, overwrite, incremental)
        try:
            await _execute(run, stats, progress)
        finally:
            if run.memo is not None:
                await anyio.to_thread.run_sync(run.memo.close)
    finally:
        with anyio.CancelScope(shield=True):
            await judge.aclose()
    run_info = _run_info(run, stats, gate, started_at, time.monotonic() - started, input)
    summary, sink_errors = await anyio.to_thread.run_sync(_finish, run, run_info)
    rows = summary.get("rows", {})
    return RunResult(
        outdir,
        int(rows.get("total", 0)),
        int(rows.get("failed", 0)),
        summary,
        run.counters,
        stats,
        tuple(sink_errors),
    )


async def _prepare(
    input: str,
    outdir: Path,
    cfg: Config,
    info: SourceInfo,
    judge: Judge,
    extractor: Extractor | None,
    overwrite: bool,
    incremental: bool,
) -> _Run:
    identity = judge.identity()
    config_part = _config_identity(cfg, identity)
    describe = {**config_part, **_input_identity(input, info, cfg)}
    runlog = RunLog(outdir, fingerprint_of(describe), describe, fingerprint_of(config_part))
    spec = _table_spec(info, cfg, judge.model)
    _check_output_columns(cfg, spec)
    await anyio.to_thread.run_sync(check_sinks, cfg.sinks, spec.schema)
    await anyio.to_thread.run_sync(
        lambda: runlog.open(overwrite=overwrite, incremental=incremental)
    )
    counters = RunCounters()
    memo = await anyio.to_thread.run_sync(_open_memo, cfg)
    run = _Run(
        cfg=cfg,
        info=info,
        runlog=runlog,
        dispatcher=Dispatcher(judge, memo, counters, cfg.concurrency),
        memo=memo,
        prefix=judge_prefix(identity),
        spec=spec,
        extractor=extractor,
        counters=counters,
    )
    if incremental:
        run.run_tag = datetime.now(UTC).strftime("r%Y%m%dT%H%M%S%f-")
        run.skip_ids = await anyio.to_thread.run_sync(_incremental_skip, outdir, info, cfg)
    elif info.total_rows <= AUTO_ESTIMATE_ROWS and runlog.load_json("estimate.json") is None:
        # a small input: price it first, so the summary can show estimate vs actual
        try:
            est = await anyio.to_thread.run_sync(lambda: estimate(input, cfg))
        except CtxprecError:
            pass  # e.g. a corrupt page: the run itself scores what it can read, then says so
        else:
            runlog.save_json("estimate.json", est)
    return run


def _check_output_columns(cfg: Config, spec: TableSpec) -> None:
    """--partition-by and --group-by name output columns: checked before any judge call."""
    names = spec.schema.names
    wanted = [("--partition-by", c) for c in cfg.partition_by]
    if cfg.group_by:
        wanted.append(("--group-by", cfg.group_by))
    for flag, col in wanted:
        if col not in names:
            raise ConfigError(
                f"{flag} {col}: `{col}` is not an output column; copy it from the input with "
                f"--passthrough {col} (output columns: {', '.join(names)})"
            )


def _inspect(input: str, cfg: Config) -> SourceInfo:
    return inspect_source(
        input,
        cfg.columns,
        use_extractor=cfg.extractor is not None,
        expected_explicit=cfg.expected_explicit,
    )


def _open_memo(cfg: Config) -> Memo | None:
    return Memo(cfg.cache_dir or default_cache_dir()) if cfg.memo else None


def _config_identity(cfg: Config, identity: dict[str, object]) -> dict[str, Any]:
    """Everything that changes a row's scored output (not which rows there are)."""
    c = cfg.columns
    return {
        "columns": [c.id, c.query, c.expected, c.context, c.labels, list(c.passthrough)],
        "extractor": cfg.extractor,
        "judge": identity,
        "judge_model": cfg.judge.model,
        "mode": cfg.mode,
        "scale": cfg.scale,
        "ks": list(cfg.ks),
        "max_item_chars": cfg.max_item_chars,
        "partition_by": list(cfg.partition_by),
        "schema_version": SCHEMA_VERSION,
    }


def _input_identity(input: str, info: SourceInfo, cfg: Config) -> dict[str, Any]:
    files = []
    for f in info.files:
        st = f.stat()
        files.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    return {"input": input, "files": files, "batch_rows": cfg.batch_rows}


def _table_spec(info: SourceInfo, cfg: Config, model: str) -> TableSpec:
    labels = cfg.columns.labels is not None
    schema = output_schema(info.id_type, info.passthrough_fields, cfg.ks, labels=labels)
    return TableSpec(schema, model, cfg.scale, cfg.ks, cfg.mode == "row", labels)


def _incremental_skip(outdir: Path, info: SourceInfo, cfg: Config) -> pl.Series:
    """Ids already scored (ok or empty_context) are skipped; failed rows of ids in this input
    are dropped from the folder first, so that this run can score them again."""
    have = scored_ids(outdir)
    failed = have.filter(pl.col("status") == STATUS_FAILED).get_column("id")
    if failed.len():
        incoming = pl.concat(
            [pl.scan_parquet(f).select(pl.col(cfg.columns.id).alias("id")) for f in info.files],
            how="vertical_relaxed",
        ).collect()
        retry = incoming.filter(pl.col("id").is_in(failed.implode())).get_column("id")
        drop_ids(outdir, retry.to_list())
    return have.filter(pl.col("status") != STATUS_FAILED).get_column("id")


async def _execute(run: _Run, stats: JudgeStats, progress_mode: str) -> None:
    records = await anyio.to_thread.run_sync(run.runlog.committed)
    if not run.run_tag:  # a resumed run: parts committed without failures are final
        done = {k: r for k, r in records.items() if r.failed == 0}
        run.skip_parts = frozenset(done)
        run.counters.rows_done = run.counters.rows_skipped = sum(r.rows for r in done.values())
    keep = {f for r in records.values() for f in r.files}
    await anyio.to_thread.run_sync(run.runlog.remove_stale, keep)
    progress = Progress(run.info.total_rows, run.counters, stats, mode=progress_mode)
    async with anyio.create_task_group() as tg:
        run.dispatcher.start(tg)  # workers and memo writer end once their streams close
        async with anyio.create_task_group() as ticker:
            ticker.start_soon(progress.run)
            try:
                await _feed(run)
            finally:
                await run.dispatcher.close()
                await run.dispatcher.finish_memo()
                ticker.cancel_scope.cancel()


async def _feed(run: _Run) -> None:
    """Read batches in a thread and process up to `in_flight` of them at once."""
    batches: Iterator[SourceBatch] = iter_batches(
        run.info, run.cfg.columns, batch_rows=run.cfg.batch_rows, skip=run.skip_parts
    )
    in_flight = anyio.Semaphore(_batches_in_flight(run.cfg))
    failure: CtxprecError | None = None
    async with anyio.create_task_group() as tg:
        while True:
            await in_flight.acquire()
            try:
                batch = await anyio.to_thread.run_sync(next, batches, None)
            except CtxprecError as exc:  # unreadable data: finish the batches in flight first
                failure, batch = exc, None
            if batch is None:
                in_flight.release()
                break
            tg.start_soon(_process_then_release, run, batch, in_flight)
    if failure is not None:
        raise failure


def _batches_in_flight(cfg: Config) -> int:
    # enough open batches that the workers never wait on a batch boundary
    per_batch = max(cfg.batch_rows * 5, 1)
    return max(2, min(16, -(-cfg.concurrency * 8 // per_batch) + 1))


async def _process_then_release(run: _Run, batch: SourceBatch, slot: anyio.Semaphore) -> None:
    try:
        await _process(run, batch)
    finally:
        slot.release()


async def _process(run: _Run, batch: SourceBatch) -> None:
    frame = batch.frame
    if run.skip_ids is not None and run.skip_ids.len():
        frame = frame.filter(~pl.col("id").is_in(run.skip_ids.implode()))
        skipped = batch.frame.height - frame.height
        run.counters.rows_done += skipped
        run.counters.rows_skipped += skipped
        if frame.is_empty():
            return
    plans = plan_rows(frame, run.extractor, run.cfg.max_item_chars)
    keys = attach_keys(plans, run.prefix, run.spec.per_row)
    found = {}
    if run.memo is not None and keys:
        found = await anyio.to_thread.run_sync(run.memo.get_many, keys)
    await resolve_items(plans, found, run.dispatcher, run.spec.per_row)
    table = scored_table(BatchJob(batch.key, frame, plans), run.spec)
    failed = sum(1 for p in plans if p.status == STATUS_FAILED)
    key = f"{run.run_tag}{batch.key}"
    tables = partition_tables(table, run.cfg.partition_by, f"part-{key}")
    await anyio.to_thread.run_sync(
        lambda: run.runlog.commit_part(key, tables, rows=table.num_rows, failed=failed)
    )
    run.counters.rows_done += table.num_rows
    run.counters.rows_failed += failed


def _run_info(
    run: _Run, stats: JudgeStats, gate: RateGate, started_at: datetime, wall: float, input: str
) -> dict[str, Any]:
    c = run.counters
    model = run.spec.judge_model
    price = run.cfg.price_for(model)
    return {
        "started_at": started_at.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "wall_s": wall,
        "input": input,
        "judge_model": model,
        "prompt_version": " / ".join(
            prompt_version_for(e, run.spec.per_row) for e in ("expected", None)
        ),
        "incremental": bool(run.run_tag),
        "rows_this_run": c.rows_done - c.rows_skipped,
        "rows_skipped": c.rows_skipped,
        "items_this_run": c.items,
        "judge_calls": c.judge_calls,
        "calls_failed": c.calls_failed,
        "memo_hits": c.memo_hits,
        "dedup_hits": c.dedup_hits,
        "judge": stats.as_dict(),
        "gate": gate.stats().as_dict(),
        "price": None
        if price is None
        else {"input_per_mtok": price.input_per_mtok, "output_per_mtok": price.output_per_mtok},
        "concurrency": run.cfg.concurrency,
        "rpm": run.cfg.rpm,
        "tpm": run.cfg.tpm,
    }


def _finish(run: _Run, run_info: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    outdir = run.runlog.outdir
    if not run.runlog.committed() and not run.cfg.partition_by:
        # an input with no rows still gives a readable (empty) dataset in the documented schema
        empty = {"part-empty.parquet": run.spec.schema.empty_table()}
        run.runlog.commit_part("empty", empty, rows=0, failed=0)
    loaded, errors = publish(run.cfg.sinks, run.runlog, run.spec.schema, run.cfg.partition_by)
    run_info["sinks"] = loaded
    run_info["sink_errors"] = errors
    estimate = run.runlog.load_json("estimate.json")
    if estimate is not None:
        run_info["estimate"] = estimate
    summary = build_summary(
        outdir, run_info, scale=run.cfg.scale, group_by=run.cfg.group_by, ks=run.cfg.ks
    )
    write_summary(outdir, summary)
    run.runlog.save_json("run.json", run_info)
    run.runlog.finish()
    return summary, errors
