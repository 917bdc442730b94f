"""`ctxprec score --batch-api`: the judge's calls go through the provider's batch API (half the
price, answers within 24 h), then the ordinary pipeline scores the rows from the memo. This
module is the run's frame and its phase 3; phase 1 is `batch_scan`, phase 2 `batch_collect`,
the prices and figures `batch_figures`, `ctxprec batches` is `batches_cmd`.

1. Scan: stream the input like a run, build the memo key of every item, and write a batch line
   for every unique call the memo does not hold and no live batch already carries (chunk files in
   OUTDIR/_ctxprec/batches/, within the provider's limits).
2. Submit and wait: record the intent, upload/create, record the batch id; poll with backoff.
   Each batch that ends is collected at once: replies are read by the judge's own reader and the
   tolerant parser and written to the memo; retryable lines (expired, cancelled, 5xx, batches
   failed as a whole) go into a new batch (bounded rounds) or online (`--batch-fallback
   online`); the others fail their items with the provider's cause.
3. Score: the ordinary stage runs with a judge that answers no verdict online (unless the
   fallback says so), so every verdict comes from the memo; parts, summary, sinks and incremental
   runs behave as without batches. With `reason = "llm"` the stage asks the online judge for each
   scored row's reason, as a run without batches does.

With `--audit-model`, the audit judge's calls for its sample of rows go through the batch API
of its own provider too: a collector of its own (its store in OUTDIR/_ctxprec/batches-audit/),
on the same memo and the same `--batch-wait` / `--batch-fallback`, and in phase 3 the stage's
audit judge answers from the memo as the first judge does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import anyio

from ctxprec.batchapi.collect import BatchCollector, BatchOptions, collect_all
from ctxprec.batchapi.figures import batch_estimate, batch_prices
from ctxprec.config import Config
from ctxprec.connectors.judges import (
    ItemRequest,
    Judge,
    JudgeReply,
    JudgeStats,
    audit_settings,
    create_judge,
    prompts,
)
from ctxprec.connectors.judges.base import JudgeWrapper, Throttle
from ctxprec.connectors.judges.batch.api import check_batch_support
from ctxprec.flow.dispatch import RunCounters, add_counts
from ctxprec.run.driver import LocalRun, RunOptions, RunResult, local_run, run_blocking
from ctxprec.run.stage import run_stage
from ctxprec.storage.core.errors import ConfigError, JudgeFatalError
from ctxprec.storage.core.settings import Price
from ctxprec.storage.files import layout
from ctxprec.storage.files.objpath import ObjPath, OutPath, out_path
from ctxprec.storage.memo.store import memo_key

__all__ = ["check_batch_provider", "run_batch_score", "score_batch"]


def score_batch(
    input: str | Path,
    outdir: str | Path,
    config: Config | None = None,
    options: RunOptions | None = None,
    *,
    batch: BatchOptions | None = None,
) -> RunResult:
    """Synchronous entry point of a batch-API run (what `ctxprec score --batch-api` runs)."""
    cfg, how, opts = config or Config(), options or RunOptions(), batch or BatchOptions()
    if isinstance(out_path(outdir), ObjPath):
        raise ConfigError(
            f"--batch-api keeps its request files in OUTDIR on local disk; {outdir} is an "
            "object store: score into a local folder with --batch-api, or drop --batch-api"
        )
    return run_blocking(lambda: run_batch_score(str(input), out_path(outdir), cfg, opts, how))


def check_batch_provider(cfg: Config) -> None:
    check_batch_support(cfg.judge)  # the provider registry says which have a batch API
    audit = audit_settings(cfg.judge)
    if audit is not None:  # --audit-model: its calls go through its provider's batch API
        check_batch_support(audit, "audit judge")


async def run_batch_score(
    input: str,
    outdir: OutPath,
    cfg: Config,
    options: BatchOptions,
    run_options: RunOptions,
) -> RunResult:
    check_batch_provider(cfg)
    async with local_run(input, outdir, cfg, run_options) as run:
        return await _batch_run(run, cfg, options, run_options.progress)


async def _batch_run(run: LocalRun, cfg: Config, options: BatchOptions, progress: str) -> RunResult:
    plan = run.plan
    est = plan.runlog.load_estimate()
    if est is not None and "batch_api" not in est:  # estimate vs actual, both at batch prices
        plan.runlog.save_json(layout.estimate(plan.runlog.outdir), batch_estimate(est, cfg))
    collector = BatchCollector(plan, options, progress)
    collectors = [collector]
    auditor = None  # --audit-model: the audit judge's batches
    if plan.audit_identity is not None:
        auditor = BatchCollector(plan, options, progress, audit=True)
        collectors.append(auditor)
    reports = await collect_all(collectors)
    report = reports[0]
    counters = RunCounters(rows_done=plan.rows_skipped, rows_skipped=plan.rows_skipped)
    add_counts(counters, collector.counters)  # its memo's notes and unreadable entries
    online = options.fallback == "online"
    verdict_only = cfg.judge.verdict_only

    def judge_factory(throttle: Throttle, stats: JudgeStats) -> Judge:
        inner = create_judge(cfg.judge, throttle=throttle, stats=stats, seams=plan.seams)
        return _ResultJudge(inner, dict(collector.store.failed), collector.prefix, online,
                            verdict_only)  # fmt: skip

    def audit_factory(throttle: Throttle, stats: JudgeStats) -> Judge:
        assert auditor is not None
        inner = create_judge(auditor.settings, throttle=throttle, stats=stats, seams=plan.seams)
        return _ResultJudge(inner, dict(auditor.store.failed), auditor.prefix, online,
                            verdict_only)  # fmt: skip

    result = await run_stage(
        plan,
        counters=counters,
        progress=progress,
        judge_factory=judge_factory,
        open_memo=collector.open_memo,
        audit_factory=audit_factory if auditor is not None else None,
        keep_texts=True,
        paid_keys=lambda: collector.collected,  # the answers this run's batches brought
    )
    result.extra["batch_api"] = report
    # the summary prices this run's tokens (the batches' own) at batch prices
    result.stats.input_tokens += int(report["input_tokens"])
    result.stats.output_tokens += int(report["output_tokens"])
    models = [plan.spec.judge_model]
    if auditor is not None:
        report["audit"] = reports[1]
        if result.audit is not None:  # the audit judge's figures: its batches' tokens too
            result.audit.stats.input_tokens += int(reports[1]["input_tokens"])
            result.audit.stats.output_tokens += int(reports[1]["output_tokens"])
        models.append(auditor.model)
    at_batch: dict[str, Price] = {}
    for model in models:
        prices = batch_prices(cfg, model)
        if prices is not None:
            at_batch[model] = prices[1]
    if at_batch:
        plan.cfg = dataclasses.replace(cfg, prices={**cfg.prices, **at_batch})
    finished = await run.finish(result)
    for done in collectors:
        await anyio.to_thread.run_sync(done.finished)
    return finished


# -- phase 3: the stage's judge


class _ResultJudge(JudgeWrapper):
    """The stage's judge: every verdict should be in the memo already. An item the batches
    failed fails with the provider's cause; any other verdict call goes online only with
    `--batch-fallback online`, else it fails (never a silent online call). A row's reason
    (`--reason llm`) needs its verdicts first, so it is asked of the online judge."""

    def __init__(
        self, inner: Judge, failed: dict[str, list[str]], prefix: bytes, online: bool,
        verdict_only: bool,
    ) -> None:  # fmt: skip
        super().__init__(inner)
        self.failed, self.prefix, self.online = failed, prefix, online
        self.verdict_only = verdict_only

    def _check(self, keys: list[str]) -> None:
        for key in keys:
            if key in self.failed:
                cause, message = self.failed[key]
                raise JudgeFatalError(message, cause=cause)
        if not self.online:
            raise JudgeFatalError(
                "no answer from the provider's batch for this item; run the same command again",
                cause="batch_missing",
            )

    async def judge_item(self, request: ItemRequest) -> JudgeReply:
        version = prompts.prompt_version_for(request.expected, False, self.verdict_only)
        key = memo_key(self.prefix, version, request.query, request.expected, request.item)
        self._check([key])
        return await self.inner.judge_item(request)

    async def judge_row(self, query: str, expected: str | None, items: Any) -> list[JudgeReply]:
        version = prompts.prompt_version_for(expected, True, self.verdict_only)
        self._check([memo_key(self.prefix, version, query, expected, it) for it in items])
        return await self.inner.judge_row(query, expected, items)
