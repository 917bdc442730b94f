"""The stage every engine runs: read -> rows -> fan out -> judge -> reduce -> partition -> commit,
in one task group.

Record batches stream from the source; a few batches are open at once, their items go to a bounded
job stream served by `concurrency` workers; each finished batch is reduced in Polars and committed
as a part file. Finished parts are skipped when a run is resumed; `--incremental` skips ids the
output folder already holds. `run_stage` does this for all files or an engine's share of them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from ctxprec.config import Config
from ctxprec.connectors.judges import Judge, JudgeStats, Throttle, audit_settings, create_judge
from ctxprec.connectors.judges.base import SyncDecider
from ctxprec.connectors.judges.prompts import prompt_version_for
from ctxprec.connectors.sources import INPUT_ERROR, SourceChunk
from ctxprec.flow.audit import AuditSide, AuditVerdicts
from ctxprec.flow.dispatch import Dispatcher, RunCounters
from ctxprec.flow.extractor import Extractor, load_extractor
from ctxprec.flow.fanout import resolve_items
from ctxprec.flow.llm_reason import write_llm_reasons
from ctxprec.flow.planning import ChunkPlanner, PlannedChunk, open_memo
from ctxprec.flow.reduce import add_tokens, scored_table
from ctxprec.flow.rows import ChunkJob
from ctxprec.limits.limiter import RateThrottle, ThrottleStats
from ctxprec.run.driver import AuditCounts, RunPlan, StageResult
from ctxprec.run.notices import record_memo
from ctxprec.run.partition import partition_tables
from ctxprec.run.progress import Progress
from ctxprec.storage.core.constants import STATUS_FAILED
from ctxprec.storage.core.errors import ConfigError, UserError
from ctxprec.storage.files import layout
from ctxprec.storage.memo.journal import Journal, open_journal, replay_journals
from ctxprec.storage.memo.store import Memo, MemoStore, judge_prefix
from ctxprec.storage.outdir.commit import commit_part, committed
from ctxprec.storage.outdir.verdicts import SharedMemo, open_shared
from ctxprec.storage.report.rows import RunTexts

__all__ = ["MeteredThrottle", "run_stage", "shared_memo"]


class MeteredThrottle(Throttle, Protocol):
    """A throttle that reports what it did: `RateThrottle`, or an engine's cluster-wide throttle."""

    def stats(self) -> ThrottleStats: ...


@dataclass
class _Stage:
    plan: RunPlan
    dispatcher: Dispatcher
    memo: MemoStore | None
    prefix: bytes
    extractor: Extractor | None
    counters: RunCounters
    skip: frozenset[str]
    planner: ChunkPlanner
    audit: AuditSide | None = None  # --audit-model: the second judge on a sample of rows
    texts: RunTexts | None = None  # the texts summary.html may open, kept as rows are scored


async def run_stage(
    plan: RunPlan,
    *,
    files: Collection[int] | None = None,
    skip: Collection[str] = (),
    throttle: MeteredThrottle | None = None,
    open_memo: Callable[[], MemoStore | None] | None = None,
    counters: RunCounters | None = None,
    progress: str = "off",
    judge_factory: Callable[[Throttle, JudgeStats], Judge] | None = None,
    audit_factory: Callable[[Throttle, JudgeStats], Judge] | None = None,
    audit_throttle: MeteredThrottle | None = None,
    open_audit_memo: Callable[[], MemoStore | None] | None = None,
    keep_texts: bool = False,
    paid_keys: Callable[[], Container[str]] | None = None,
) -> StageResult:
    """Score `files` (indexes into plan.info.files; None: all) but the parts in `skip`, those the
    plan skips and those an earlier attempt of this stage committed. Every engine runs this.
    The audit judge (`--audit-model`) gets a throttle of its own (`audit_throttle`, else one with
    the run's limits) and the stage's memo, or `open_audit_memo`'s when the stage's memo is not a
    memo of every judge (a keyed reduce's answers are the first judge's only). `paid_keys`
    (called once the memo is open) names the verdicts this run paid for that reach the stage
    through its memo (a keyed reduce's fresh answers, a batch run's collected ones): the rows
    that carry them count them as paid."""
    cfg = plan.cfg
    stats = JudgeStats()
    throttle = throttle or RateThrottle(
        cfg.limits.concurrency, cfg.limits.rpm, cfg.limits.tpm, adaptive=cfg.limits.adaptive
    )
    if judge_factory is not None:  # e.g. a batch-API run's judge that reads batch results
        judge = judge_factory(throttle, stats)
    else:
        judge = create_judge(cfg.judge, throttle=throttle, stats=stats, seams=plan.seams)
    if judge.identity() != plan.identity:
        raise ConfigError(
            f"the judge here is {judge.identity()}, the driver's {plan.identity}: give every "
            "machine of the run the same judge settings and environment"
        )
    counters = counters or RunCounters()
    extractor = load_extractor(cfg.columns.extractor) if cfg.columns.extractor else None
    audit_judge = _audit_judge(plan, audit_factory, audit_throttle)
    try:
        others = plan.skip_parts | frozenset(skip)
        done = await _done_by_earlier_attempt(plan, files, others, counters)
        memo = await anyio.to_thread.run_sync(open_memo or (lambda: _open_memo(cfg)))
        audit_memo = memo
        if audit_judge is not None and open_audit_memo is not None:
            audit_memo = await anyio.to_thread.run_sync(open_audit_memo)
        paid = judge  # the journal is for a paid judge's verdicts: the audit judge's too
        if audit_judge is not None and isinstance(judge, SyncDecider):
            paid = audit_judge.judge
        journal = await anyio.to_thread.run_sync(_open_journal, memo, paid, counters)
        dispatcher = Dispatcher(
            judge, memo, counters, cfg.limits.concurrency, journal, memo_wait=plan.seams.memo_wait
        )
        if paid_keys is not None:
            dispatcher.paid_elsewhere = paid_keys()
        skipped = others | done
        prefix = judge_prefix(plan.identity)
        planner = ChunkPlanner(
            cfg,
            prefix,
            per_row=plan.spec.per_row,
            memo=memo,
            skip_ids=plan.skip_ids,
            extractor=extractor,
        )
        stage = _Stage(plan, dispatcher, memo, prefix, extractor, counters, skipped, planner)
        if audit_judge is not None:
            own = journal if audit_memo is memo else None
            stage.audit = _audit_side(plan, audit_judge, audit_memo, own)
        if keep_texts:
            stage.texts = RunTexts(INPUT_ERROR)
        finished = False
        try:
            await _execute(stage, files, stats, progress)
            finished = True  # every verdict is in the memo: the journal goes
        finally:
            if memo is not None:
                await anyio.to_thread.run_sync(memo.close)
                record_memo(memo, counters)
            if audit_memo is not None and audit_memo is not memo:
                await anyio.to_thread.run_sync(audit_memo.close)
                record_memo(audit_memo, counters)
            if journal is not None:
                journal.close(done=finished)
    finally:
        with anyio.CancelScope(shield=True):
            await judge.aclose()
            if audit_judge is not None:
                await audit_judge.judge.aclose()
    result = StageResult(counters, stats, throttle.stats(), texts=stage.texts)
    if audit_judge is not None:
        result.audit = AuditCounts(audit_judge.counters, audit_judge.stats, audit_judge.rows)
    return result


@dataclass
class _AuditJudge:
    """The audit judge of a stage, with what it did (kept after the stage has ended)."""

    judge: Judge
    stats: JudgeStats
    counters: RunCounters
    rows: int = 0


def _audit_judge(
    plan: RunPlan,
    factory: Callable[[Throttle, JudgeStats], Judge] | None,
    throttle: MeteredThrottle | None = None,
) -> _AuditJudge | None:
    """The audit judge (`--audit-model`), behind a throttle of its own (it may be another
    provider's, with its own limits): None without one."""
    settings = audit_settings(plan.cfg.judge)
    if settings is None or plan.audit_identity is None:
        return None
    lim = plan.cfg.limits
    throttle = throttle or RateThrottle(lim.concurrency, lim.rpm, lim.tpm, adaptive=lim.adaptive)
    stats = JudgeStats()
    if factory is not None:
        judge = factory(throttle, stats)
    else:
        judge = create_judge(settings, throttle=throttle, stats=stats, seams=plan.seams)
    if judge.identity() != plan.audit_identity:
        raise ConfigError(
            f"the audit judge here is {judge.identity()}, the driver's {plan.audit_identity}: "
            "give every machine of the run the same judge settings and environment"
        )
    return _AuditJudge(judge, stats, RunCounters())


def _audit_side(
    plan: RunPlan, audit: _AuditJudge, memo: MemoStore | None, journal: Journal | None
) -> AuditSide:
    cfg = plan.cfg
    assert plan.audit_identity is not None
    dispatcher = Dispatcher(
        audit.judge, memo, audit.counters, cfg.limits.concurrency, journal,
        memo_wait=plan.seams.memo_wait,
    )  # fmt: skip
    return AuditSide(
        dispatcher,
        judge_prefix(plan.audit_identity),
        cfg.judge.audit_fraction,
        cfg.judge.audit_seed,
        plan.spec.per_row,
        cfg.judge.verdict_only,
        memo,
        on_rows=audit,
    )


async def _done_by_earlier_attempt(
    plan: RunPlan, files: Collection[int] | None, others: frozenset[str], counters: RunCounters
) -> frozenset[str]:
    """Parts of this run that an earlier attempt of the same stage committed (an engine retried
    it after its worker died): read past, and counted as done in this run."""
    tag = plan.run_tag
    prefixes = [tag] if files is None else [f"{tag}{i:05d}-" for i in files]
    done: set[str] = set()
    for prefix in prefixes:
        records = await anyio.to_thread.run_sync(committed, plan.runlog.outdir, prefix)
        for key, record in records.items():
            batch_key = key.removeprefix(tag)
            if record.failed == 0 and batch_key not in others:
                done.add(batch_key)
                counters.rows_done += record.rows
    return frozenset(done)


def _open_memo(cfg: Config) -> MemoStore | None:
    return open_memo(cfg)


def _open_journal(memo: MemoStore | None, judge: Judge, counters: RunCounters) -> Journal | None:
    """Replay the journals killed runs left in the memo folder, then (for a paid judge: the
    offline judge's verdicts cost nothing to redo) open this run's
    (`ctxprec.storage.memo.journal`)."""
    local = memo.local if isinstance(memo, SharedMemo) else memo
    if memo is None or not isinstance(local, Memo):
        return None  # no memo, or an engine's own (it keeps verdicts its own way)
    if local.read_only:
        return None  # nothing replayed into it, nothing journaled: it keeps no verdict
    skipped = replay_journals(local.directory, memo).skipped
    if skipped:
        counters.memo_notes.append(
            f"memo {local.directory}: {skipped:,} line(s) of journals left by killed runs were "
            "not verdicts; skipped"
        )
    return None if isinstance(judge, SyncDecider) else open_journal(local.directory)


def shared_memo(plan: RunPlan) -> MemoStore | None:
    """The memo backed by OUTDIR's verdict store (an object-store OUTDIR keeps verdicts for a
    resume on another machine)."""
    return open_shared(_open_memo(plan.cfg), plan.runlog.outdir, plan.input)


async def _execute(
    run: _Stage, files: Collection[int] | None, stats: JudgeStats, progress_mode: str
) -> None:
    progress = Progress(run.plan.info.total_rows, run.counters, stats, mode=progress_mode)
    dispatchers = [run.dispatcher] + ([run.audit.dispatcher] if run.audit else [])
    try:
        async with anyio.create_task_group() as tg:
            for d in dispatchers:  # workers and memo writer end once their streams close
                d.start(tg)
            async with anyio.create_task_group() as ticker:
                ticker.start_soon(progress.run)
                try:
                    await _feed(run, files)
                finally:
                    for d in dispatchers:
                        await d.close()
                        await d.finish_memo()
                    ticker.cancel_scope.cancel()
    finally:  # every task has ended: a verdict that finished during shutdown is kept
        for d in dispatchers:
            await d.write_late()


# Batches planned at once: while one planning thread waits on its memo read (SQLite runs
# without the GIL) the other reads, checks and hashes the next batch, or reads the memo too (the
# memo keeps two read connections, one per planner: `ctxprec.storage.memo.store.Memo._take_reader`).
_PLANNERS = 2


async def _feed(run: _Stage, files: Collection[int] | None) -> None:
    """Plan batches in worker threads (`ctxprec.flow.planning`: the row checks, the memo keys and
    the memo lookup), `_PLANNERS` at a time, reading them one at a time in input order, and
    process up to `in_flight` at once."""
    cfg = run.plan.cfg
    batches: Iterator[SourceChunk] = run.planner.batches(
        run.plan.info, skip=run.skip, only_files=files
    )
    in_flight = anyio.Semaphore(_batches_in_flight(cfg))
    reading = anyio.Lock()
    failures: list[UserError] = []

    async def plan_batches(tg: TaskGroup) -> None:
        while not failures:
            await in_flight.acquire()
            planned: PlannedChunk | None = None
            try:
                async with reading:
                    batch = await anyio.to_thread.run_sync(next, batches, None)
                if batch is not None:
                    planned = await anyio.to_thread.run_sync(run.planner.plan, batch)
            except UserError as exc:  # unreadable data: finish the batches in flight first
                failures.append(exc)
                planned = None
            if planned is None:
                in_flight.release()
                return
            tg.start_soon(_process_then_release, run, planned, in_flight)

    async with anyio.create_task_group() as tg:
        for _ in range(_PLANNERS):
            tg.start_soon(plan_batches, tg)
    if failures:
        raise failures[0]


async def _llm_reasons(run: _Stage, table: Any, plans: list[Any]) -> Any:
    table, calls = await write_llm_reasons(
        table,
        [p.query for p in plans],
        [p.expected for p in plans],
        judge=run.dispatcher.judge,
        memo=run.memo,
        prefix=run.prefix,
        concurrency=run.plan.cfg.limits.concurrency,
    )
    run.counters.reason_calls += calls
    return table


def _batches_in_flight(cfg: Config) -> int:
    # enough open batches that the workers never wait on a batch boundary, and that every
    # planner plans its next batch while two planned ones are judged or reduced and committed
    per_batch = max(cfg.run.batch_rows * 5, 1)
    return max(_PLANNERS + 2, min(16, -(-cfg.limits.concurrency * 8 // per_batch) + 1))


async def _with_audit(run: _Stage, side: AuditSide, planned: PlannedChunk) -> list[AuditVerdicts]:
    """Resolve the batch with the first judge and its audit sample with the audit judge."""
    plans = planned.rows
    picked = side.plan(planned.frame.get_column("id").to_list(), plans)
    out: list[AuditVerdicts] = []

    async def audit() -> None:
        out.extend(await side.resolve(len(plans), picked))

    async with anyio.create_task_group() as tg:
        tg.start_soon(audit)
        await resolve_items(plans, planned.found, run.dispatcher, run.plan.spec.per_row)
    return out


def _scored(run: _Stage, job: ChunkJob) -> Any:
    """The chunk's output table (a worker thread); its texts kept for the report."""
    table = scored_table(job, run.plan.spec)
    add_tokens(run.counters, table)
    if run.texts is not None:
        # as Python values: a Polars Series made from Arrow imports pyarrow.compute (~25 ms)
        scores, statuses = (table.column(c).to_pylist() for c in ("score", "status"))
        # an extractor's items are in the plans (the frame holds the source row instead)
        items = None if run.extractor is None else [p.items or None for p in job.rows]
        run.texts.add(job.frame, scores, statuses, items)
    return table


async def _process_then_release(run: _Stage, planned: PlannedChunk, slot: anyio.Semaphore) -> None:
    try:
        await _process(run, planned)
    finally:
        slot.release()


async def _process(run: _Stage, planned: PlannedChunk) -> None:
    plan = run.plan
    batch, frame, plans = planned.batch, planned.frame, planned.rows
    if planned.dropped:
        run.counters.rows_done += planned.dropped
        run.counters.rows_skipped += planned.dropped
    if run.planner.skip_ids is not None and frame.is_empty():
        return
    audit = None
    if run.audit is None:
        await resolve_items(plans, planned.found, run.dispatcher, plan.spec.per_row)
    else:  # the audit judge's sample of the batch, side by side with the first judge
        audit = await _with_audit(run, run.audit, planned)
    job = ChunkJob(batch.key, frame, plans, audit)
    table = await anyio.to_thread.run_sync(_scored, run, job)
    if plan.cfg.scoring.reason == "llm":
        table = await _llm_reasons(run, table, plans)
    failed = sum(1 for p in plans if p.status == STATUS_FAILED)
    key = f"{plan.run_tag}{batch.key}"
    tables = partition_tables(table, plan.cfg.output.partition_by, layout.part_name(key))

    def commit() -> None:
        plan.seams.at("commit", key)
        outdir = plan.runlog.outdir
        commit_part(outdir, key, tables, rows=table.num_rows, failed=failed, seams=plan.seams)

    await anyio.to_thread.run_sync(commit)
    run.counters.rows_done += table.num_rows
    run.counters.rows_failed += failed
    _count_prompts(run.counters, plan, [p.expected for p in plans].count(None), len(plans))


def _count_prompts(counters: RunCounters, plan: RunPlan, query_only: int, rows: int) -> None:
    """The prompt versions of the rows written (a row without an expected output is judged
    against its query alone, with that prompt), as the output's prompt_version column has them."""
    spec = plan.spec
    for expected, n in (("", rows - query_only), (None, query_only)):
        if n:
            version = prompt_version_for(expected, spec.per_row, spec.verdict_only)
            counters.rows_by_prompt[version] = counters.rows_by_prompt.get(version, 0) + n
