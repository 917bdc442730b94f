"""Which engine runs a score: the one place it is decided, for the CLI (`ctxprec score`) and the
Python API (`pipeline.score`). The local engine (`local.score_local`), the Dask engine
(`dask.score_dask`) or the provider's batch API (`ctxprec.batchapi.run.score_batch`), and the
combinations that cannot run, refused before anything is read or paid for.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from ctxprec.batchapi.run import check_batch_provider, score_batch
from ctxprec.config import AUDIT_OPTIONS, Config, with_audit
from ctxprec.engines.dask import score_dask
from ctxprec.engines.local import score_local
from ctxprec.run.driver import RunOptions, RunResult
from ctxprec.storage.core.errors import UserError
from ctxprec.storage.core.options import BatchOptions

__all__ = ["Engine", "Runner", "choose", "score"]

Runner = Callable[[str | Path, str | Path, Config, RunOptions], RunResult]


@dataclasses.dataclass(frozen=True)
class Engine:
    """Where a run executes, as the user asked: `--engine`, `--scheduler`, `--workers`, and the
    `--batch-wait` / `--batch-fallback` options of a `--batch-api` run (None: not given)."""

    name: Literal["local", "dask"] = "local"
    scheduler: str | None = None
    workers: int | None = None
    batch: BatchOptions | None = None


def choose(cfg: Config, engine: Engine = Engine()) -> Runner:
    """The runner for `cfg` and `engine`; a UserError naming the flag to drop or add when the
    combination cannot run (checked before any input is read)."""
    dask = engine.name == "dask"
    if not dask and (engine.scheduler or engine.workers):
        raise UserError("--scheduler and --workers are for --engine dask; add it")
    if cfg.judge.batch_api:
        check_batch_provider(cfg)
        if dask:
            raise UserError("--batch-api runs on the local engine; drop --engine dask")
    elif engine.batch is not None:
        raise UserError("--batch-wait and --batch-fallback are for --batch-api; add it")
    if cfg.run.recheck > 0 and (dask or cfg.judge.batch_api):
        drop = "--engine dask" if dask else "--batch-api"
        raise UserError(f"--recheck runs on the local engine with online calls; drop {drop}")
    if cfg.judge.batch_api:
        return functools.partial(score_batch, batch=engine.batch)
    if dask:
        return functools.partial(score_dask, scheduler=engine.scheduler, workers=engine.workers)
    return score_local


def score(
    input: str | Path,
    outdir: str | Path,
    config: Config | None = None,
    options: RunOptions | None = None,
    **kw: Any,
) -> RunResult:
    """Synchronous batch entry point (`pipeline.score`; `ctxprec score` runs the same through
    `choose`). `options` (or its fields as keywords: overwrite=, incremental=, progress=,
    wait_lock=) say how the run treats OUTDIR; `config.judge.batch_api` sends the calls through
    the provider's batch API; audit_model=, audit_fraction=, audit_seed=, audit_base_url= set
    the audit judge (the [judge] settings of the same names). User-facing errors raised inside
    the task group come out as themselves, not wrapped in an ExceptionGroup."""
    audit = {k: kw.pop(k) for k in AUDIT_OPTIONS if k in kw}
    cfg = with_audit(config or Config(), **audit)
    return choose(cfg)(input, outdir, cfg, dataclasses.replace(options or RunOptions(), **kw))
