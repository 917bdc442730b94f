"""The run's entry point: `score` runs the local engine (`run_score`: one stage over the whole
input, in this process) or, with `batch_api`, the provider's batch API (`pipeline.batchapi.run`).
The stage itself is `pipeline.run.stage`; the frame around it (prepare, lock, finish) is
`pipeline.run.driver`.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import Any

from pipeline.analysis.recheck import recheck_run
from pipeline.batchapi.run import score_batch
from pipeline.config import Config
from pipeline.flow.dispatch import RunCounters
from pipeline.run.driver import RunOptions, RunResult, local_run, run_blocking
from pipeline.run.stage import run_stage, shared_memo
from storage.objpath import ObjPath, OutPath, out_path

__all__ = ["run_score", "score"]


def score(
    input: str | Path,
    outdir: str | Path,
    config: Config | None = None,
    options: RunOptions | None = None,
    **kw: Any,
) -> RunResult:
    """Synchronous batch entry point (what `ctxprec score` runs). `options` (or its fields as
    keywords: overwrite=, incremental=, progress=, wait_lock=) say how the run treats OUTDIR.
    User-facing errors raised inside the task group come out as themselves, not wrapped in an
    ExceptionGroup."""
    opts = dataclasses.replace(options or RunOptions(), **kw)
    if config is not None and config.judge.batch_api:  # through the provider's batch API
        return score_batch(input, outdir, config, opts)
    return run_blocking(lambda: run_score(str(input), out_path(outdir), config or Config(), opts))


async def run_score(
    input: str, outdir: OutPath, cfg: Config, options: RunOptions | None = None, **kw: Any
) -> RunResult:
    """The local engine: prepare, one stage over the whole input, finish; in this process,
    which holds the output folder's lock throughout. `options` as for `score`."""
    options = dataclasses.replace(options or RunOptions(), **kw)
    async with local_run(input, outdir, cfg, options) as run:
        plan = run.plan
        counters = RunCounters(rows_done=plan.rows_skipped, rows_skipped=plan.rows_skipped)
        memo = None  # an object-store OUTDIR keeps verdicts for a resume on another machine
        if isinstance(plan.runlog.outdir, ObjPath):
            memo = partial(shared_memo, plan)
        result = await run_stage(plan, counters=counters, progress=options.progress, open_memo=memo)
        if cfg.run.recheck > 0:  # --recheck: the judge against itself, once the stage is done
            result.recheck = await recheck_run(
                cfg,
                plan.info,
                plan.identity,
                plan.spec.per_row,
                plan.runlog.outdir,
                result.stats,
                retry_clock=options.retry_clock,
            )
        return await run.finish(result)
