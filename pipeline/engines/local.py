"""The local engine: `run_score`, one stage over the whole input in this process, and
`score_local`, its synchronous entry point. Which engine a run uses is decided once, in
`ctxprec.engines.choice`. The stage itself is `ctxprec.run.stage`; the frame around it
(prepare, lock, finish) is `ctxprec.run.driver`.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import Any

from ctxprec.analysis.recheck import recheck_run
from ctxprec.config import AUDIT_OPTIONS, Config, with_audit
from ctxprec.flow.dispatch import RunCounters
from ctxprec.run.driver import RunOptions, RunResult, local_run, run_blocking
from ctxprec.run.stage import run_stage, shared_memo
from ctxprec.storage.files.objpath import ObjPath, OutPath, out_path

__all__ = ["run_score", "score_local"]


def score_local(
    input: str | Path, outdir: str | Path, config: Config, options: RunOptions
) -> RunResult:
    """The local engine, synchronously (`ctxprec.engines.choice` chooses it). User-facing
    errors raised inside the task group come out as themselves, not wrapped in an
    ExceptionGroup."""
    return run_blocking(lambda: run_score(str(input), out_path(outdir), config, options))


async def run_score(
    input: str, outdir: OutPath, cfg: Config, options: RunOptions | None = None, **kw: Any
) -> RunResult:
    """The local engine: prepare, one stage over the whole input, finish; in this process,
    which holds the output folder's lock throughout. `options` as for `score`; the audit judge
    may be given here too (audit_model=, audit_fraction=, audit_seed=, audit_base_url=: the
    [judge] settings of the same names)."""
    cfg = with_audit(cfg, **{k: kw.pop(k) for k in AUDIT_OPTIONS if k in kw})
    options = dataclasses.replace(options or RunOptions(), **kw)
    async with local_run(input, outdir, cfg, options) as run:
        plan = run.plan
        counters = RunCounters(rows_done=plan.rows_skipped, rows_skipped=plan.rows_skipped)
        memo = None  # an object-store OUTDIR keeps verdicts for a resume on another machine
        if isinstance(plan.runlog.outdir, ObjPath):
            memo = partial(shared_memo, plan)
        result = await run_stage(
            plan, counters=counters, progress=options.progress, open_memo=memo, keep_texts=True
        )
        if cfg.run.recheck > 0:  # --recheck: the judge against itself, once the stage is done
            result.recheck = await recheck_run(
                cfg,
                plan.info,
                plan.identity,
                plan.spec.per_row,
                plan.runlog.outdir,
                result.stats,
                seams=options.seams,
            )
        return await run.finish(result)
