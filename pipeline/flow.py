"""The batch entry point: read -> fan out -> judge -> reduce -> write, in one task group.

Record batches stream from the source; at most `batches_in_flight` batches are open at once, their
items go to a bounded job stream served by `concurrency` workers; each finished batch is reduced
in Polars and committed as a part file. Finished parts are skipped when a run is resumed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from connectors.judges import JudgeStats, create_judge
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
from pipeline.limits import RateGate
from pipeline.progress import Progress
from pipeline.writer import partition_tables
from storage.memo import Memo, default_cache_dir, judge_prefix
from storage.report import build_summary, write_summary
from storage.runlog import RunLog, fingerprint_of
from storage.schema import SCHEMA_VERSION, STATUS_FAILED, output_schema

__all__ = ["RunResult", "run_score", "score"]


@dataclass
class RunResult:
    outdir: Path
    rows: int
    failed: int
    summary: dict[str, Any]
    counters: RunCounters
    stats: JudgeStats

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


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
    skip: set[str]
    counters: RunCounters
    run_tag: str = ""
    failed_keys: set[str] = field(default_factory=set)


def score(
    input: str | Path, outdir: str | Path, config: Config | None = None, **kw: Any
) -> RunResult:
    """Synchronous batch entry point (what `ctxprec score` runs)."""
    return anyio.run(lambda: run_score(str(input), Path(outdir), config or Config(), **kw))


async def run_score(
    input: str,
    outdir: Path,
    cfg: Config,
    *,
    overwrite: bool = False,
    incremental: bool = False,
    progress: str = "auto",
) -> RunResult:
    started = time.monotonic()
    started_at = datetime.now(UTC)
    info = await anyio.to_thread.run_sync(_inspect, input, cfg)
    extractor = load_extractor(cfg.extractor) if cfg.extractor else None
    stats = JudgeStats()
    gate = RateGate(cfg.concurrency, cfg.rpm, cfg.tpm, adaptive=cfg.adaptive)
    judge = create_judge(cfg.judge, gate=gate, stats=stats)
    try:
        identity = judge.identity()
        describe = _describe(input, info, cfg, identity)
        runlog = RunLog(outdir, fingerprint_of(describe), describe)
        await anyio.to_thread.run_sync(
            lambda: runlog.open(overwrite=overwrite, incremental=incremental)
        )
        memo = await anyio.to_thread.run_sync(_open_memo, cfg)
        counters = RunCounters()
        run = _Run(
            cfg=cfg,
            info=info,
            runlog=runlog,
            dispatcher=Dispatcher(judge, memo, counters, cfg.concurrency),
            memo=memo,
            prefix=judge_prefix(identity),
            spec=_table_spec(info, cfg, judge.model),
            extractor=extractor,
            skip=set(),
            counters=counters,
        )
        try:
            await _execute(run, stats, progress)
        finally:
            if memo is not None:
                await anyio.to_thread.run_sync(memo.close)
    finally:
        with anyio.CancelScope(shield=True):
            await judge.aclose()
    wall = time.monotonic() - started
    run_info = _run_info(run, stats, gate, started_at, wall, input, judge.model)
    summary = await anyio.to_thread.run_sync(_finish, run, run_info)
    failed = int(summary.get("rows", {}).get("failed", 0))
    total = int(summary.get("rows", {}).get("total", 0))
    return RunResult(outdir, total, failed, summary, counters, stats)


def _inspect(input: str, cfg: Config) -> SourceInfo:
    return inspect_source(
        input,
        cfg.columns,
        use_extractor=cfg.extractor is not None,
        expected_explicit=cfg.expected_explicit,
    )


def _open_memo(cfg: Config) -> Memo | None:
    return Memo(cfg.cache_dir or default_cache_dir()) if cfg.memo else None


def _describe(
    input: str, info: SourceInfo, cfg: Config, identity: dict[str, object]
) -> dict[str, Any]:
    files = []
    for f in info.files:
        st = f.stat()
        files.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    return {
        "input": input,
        "files": files,
        "columns": [
            cfg.columns.id,
            cfg.columns.query,
            cfg.columns.expected,
            cfg.columns.context,
            cfg.columns.labels,
            list(cfg.columns.passthrough),
        ],
        "extractor": cfg.extractor,
        "judge": identity,
        "judge_model": cfg.judge.model,
        "mode": cfg.mode,
        "scale": cfg.scale,
        "ks": list(cfg.ks),
        "batch_rows": cfg.batch_rows,
        "max_item_chars": cfg.max_item_chars,
        "partition_by": list(cfg.partition_by),
        "schema_version": SCHEMA_VERSION,
    }


def _table_spec(info: SourceInfo, cfg: Config, model: str) -> TableSpec:
    schema = output_schema(
        info.id_type, info.passthrough_fields, cfg.ks, labels=cfg.columns.labels is not None
    )
    return TableSpec(
        schema, model, cfg.scale, cfg.ks, cfg.mode == "row", cfg.columns.labels is not None
    )


async def _execute(run: _Run, stats: JudgeStats, progress_mode: str) -> None:
    records = await anyio.to_thread.run_sync(run.runlog.committed)
    done = {k: r for k, r in records.items() if r.failed == 0}
    run.skip = set(done)
    keep = {f for r in records.values() for f in r.files}
    await anyio.to_thread.run_sync(run.runlog.remove_stale, keep)
    run.counters.rows_done = run.counters.rows_skipped = sum(r.rows for r in done.values())
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
        run.info, run.cfg.columns, batch_rows=run.cfg.batch_rows, skip=run.skip
    )
    in_flight = anyio.Semaphore(_batches_in_flight(run.cfg))
    async with anyio.create_task_group() as tg:
        while True:
            await in_flight.acquire()
            batch = await anyio.to_thread.run_sync(next, batches, None)
            if batch is None:
                in_flight.release()
                break
            tg.start_soon(_process_then_release, run, batch, in_flight)


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
    plans = plan_rows(batch.frame, run.extractor, run.cfg.max_item_chars)
    keys = attach_keys(plans, run.prefix, run.spec.per_row)
    found = {}
    if run.memo is not None and keys:
        found = await anyio.to_thread.run_sync(run.memo.get_many, keys)
    await resolve_items(plans, found, run.dispatcher, run.spec.per_row)
    table = scored_table(BatchJob(batch.key, batch.frame, plans), run.spec)
    failed = sum(1 for p in plans if p.status == STATUS_FAILED)
    tables = partition_tables(table, run.cfg.partition_by, f"part-{run.run_tag}{batch.key}")
    await anyio.to_thread.run_sync(
        lambda: run.runlog.commit_part(batch.key, tables, rows=table.num_rows, failed=failed)
    )
    run.counters.rows_done += table.num_rows
    run.counters.rows_failed += failed


def _run_info(
    run: _Run,
    stats: JudgeStats,
    gate: RateGate,
    started_at: datetime,
    wall: float,
    input: str,
    model: str,
) -> dict[str, Any]:
    c = run.counters
    price = run.cfg.price_for(model)
    return {
        "started_at": started_at.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "wall_s": wall,
        "input": input,
        "judge_model": model,
        "rows_this_run": c.rows_done - c.rows_skipped,
        "rows_resumed": c.rows_skipped,
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


def _finish(run: _Run, run_info: dict[str, Any]) -> dict[str, Any]:
    summary = build_summary(
        run.runlog.outdir, run_info, scale=run.cfg.scale, group_by=run.cfg.group_by, ks=run.cfg.ks
    )
    write_summary(run.runlog.outdir, summary)
    run.runlog.save_json("run.json", run_info)
    run.runlog.finish()
    return summary
