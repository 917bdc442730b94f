"""The Dask engine: the driver prepares and finishes a run as the local engine does; each input
file (or slice of a big one) is a task that runs the same stage on a worker, with cluster-wide
limits leased from a coordinator on the scheduler and verdicts shared through OUTDIR.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from ctxprec.config import Config
from ctxprec.connectors.judges import JudgeStats, audit_settings
from ctxprec.engines.keyed import SHARD_ROWS, ReduceHooks, judge_shard, keyed, plan_slice
from ctxprec.flow.dispatch import RunCounters, add_counts
from ctxprec.limits.leases import Grant, LeaseCoordinator, LeasedThrottle, LeaseFn, Report
from ctxprec.limits.limiter import RateThrottle, ThrottleStats
from ctxprec.run.driver import (
    AuditCounts,
    RunOptions,
    RunPlan,
    RunResult,
    StageResult,
    finish_run,
    prepare_run,
    release_outdir,
    run_blocking,
)
from ctxprec.run.stage import MeteredThrottle, run_stage
from ctxprec.storage.core.errors import ConfigError, UserError
from ctxprec.storage.files import layout
from ctxprec.storage.files.objpath import OutPath, out_path
from ctxprec.storage.memo.store import Memo, MemoStore, default_cache_dir
from ctxprec.storage.outdir.keyshards import remove_tree, shard_count, shuffle_dir
from ctxprec.storage.outdir.verdicts import SharedMemo, VerdictStore, verdict_dir

__all__ = [
    "TASK_RETRIES",
    "TASK_ROWS",
    "Task",
    "install_coordinator",
    "plan_tasks",
    "remove_coordinator",
    "scheduler_lease",
    "score_dask",
]

TASK_ROWS = 50_000  # a file with more rows is split into tasks of about this many
TASK_RETRIES = 2  # retries of a task that raised (a dead worker's tasks are rescheduled anyway)
# the coordinator paces 1% under --rpm: the start-time jitter between workers (tens of ms) can
# then never put one request more than the limit into a provider's minute
RPM_GUARD = 0.01
INSTALL_HINT = "pip install 'ctxprec[dask]'"


@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    """Batches [first, stop) of input file `file` (of `batches` in all)."""

    file: int
    first: int
    stop: int
    batches: int

    @property
    def name(self) -> str:
        return f"{self.file:05d}-{self.first:05d}"

    def skip(self) -> frozenset[str]:
        """The file's batch keys that belong to other tasks."""
        others = (b for b in range(self.batches) if not self.first <= b < self.stop)
        return frozenset(f"{self.file:05d}-{b:05d}" for b in others)


def plan_tasks(plan: RunPlan, task_rows: int = TASK_ROWS) -> list[Task]:
    """One task per file; files over `task_rows` rows are cut at batch boundaries."""
    batch_rows = plan.cfg.run.batch_rows
    per_task = max(1, task_rows // batch_rows)
    tasks = []
    for index, rows in enumerate(plan.info.rows):
        batches = max(1, -(-rows // batch_rows))
        for first in range(0, batches, per_task):
            tasks.append(Task(index, first, min(first + per_task, batches), batches))
    return tasks


def score_dask(
    input: str | Path,
    outdir: str | Path,
    cfg: Config,
    options: RunOptions | None = None,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    task_rows: int = TASK_ROWS,
) -> RunResult:
    """`ctxprec score --engine dask`: on the cluster at `scheduler`, or on a local cluster of
    `workers` processes (default: one per core). Output and summary are the local engine's."""
    _require_distributed()
    started, started_at = time.monotonic(), datetime.now(UTC)
    options = options or RunOptions()
    plan = _portable(run_blocking(partial(prepare_run, str(input), out_path(outdir), cfg, options)))
    try:  # the driver (this process) holds the output folder's lock until the end
        progress = options.progress
        options.seams.at("tasks", plan.runlog.outdir)  # (the hook stays here, not in `plan`)
        return _run_on_cluster(plan, scheduler, workers, progress, task_rows, started, started_at)
    finally:
        release_outdir(plan)


def _run_on_cluster(
    plan: RunPlan,
    scheduler: str | None,
    workers: int | None,
    progress: str,
    task_rows: int,
    started: float,
    started_at: datetime,
) -> RunResult:
    cfg = plan.cfg
    tasks = plan_tasks(plan, task_rows)
    limited = cfg.limits.rpm is not None or cfg.limits.tpm is not None
    run_id = uuid.uuid4().hex[:12] if limited else None
    with _client(scheduler, workers) as client:
        n_workers = len(client.scheduler_info().get("workers", {}))
        if run_id is not None:
            lim = cfg.limits
            install_coordinator(client, run_id, lim.rpm, lim.tpm, lim.adaptive)
            if plan.audit_identity is not None:  # the audit judge's calls: a limit of their own
                install_coordinator(client, _audit_run(run_id), lim.rpm, lim.tpm, lim.adaptive)
        shards = shard_count(plan.info.total_rows, SHARD_ROWS, 2 * max(n_workers, 1))
        try:
            if keyed(plan):
                results, errors = _run_keyed(client, plan, tasks, run_id, progress, shards)
            else:  # --mode row: a call judges a whole row; de-duplication stays per task
                results, errors = _run_tasks(client, plan, tasks, run_id, progress)
        finally:
            central = remove_coordinator(client, run_id) if run_id else None
            if run_id and plan.audit_identity is not None:
                remove_coordinator(client, _audit_run(run_id))
    if errors:  # other tasks' parts are committed: the same command resumes with the rest
        raise errors[0]
    result = _merge(plan, results, central)
    engine: dict[str, Any] = {"name": "dask", "workers": n_workers, "tasks": len(tasks)}
    if keyed(plan):
        engine["shards"] = shards
    return finish_run(plan, result, started_at, time.monotonic() - started, engine)


def _audit_run(run_id: str) -> str:
    """The id of the audit judge's coordinator in a rate-limited run."""
    return f"{run_id}-audit"


def _require_distributed() -> None:
    try:
        _distributed()
    except ImportError:
        raise ConfigError(
            f"--engine dask needs dask.distributed, which is not installed: {INSTALL_HINT}"
        ) from None


def _distributed() -> Any:
    """dask.distributed, imported on first use (an optional dependency, and a heavy one)."""
    return importlib.import_module("distributed")


def _portable(plan: RunPlan) -> RunPlan:
    """What a task on another machine needs: absolute paths (object URIs as they are), and the
    judge's base URL as the driver resolved it (API keys stay in each worker's environment)."""
    files = tuple(dataclasses.replace(f, path=f.absolute()) for f in plan.info.files)
    info = dataclasses.replace(plan.info, files=files)
    runlog = plan.runlog
    runlog.outdir = runlog.outdir.resolve()
    cfg = plan.cfg
    base = plan.identity.get("base_url")
    if isinstance(base, str) and not cfg.judge.base_url:
        cfg = dataclasses.replace(cfg, judge=dataclasses.replace(cfg.judge, base_url=base))
    audit = audit_settings(cfg.judge)  # --audit-model: its base URL as the driver resolved it
    audit_base = (plan.audit_identity or {}).get("base_url")
    if audit is not None and audit.base_url is None and isinstance(audit_base, str):
        judge = dataclasses.replace(cfg.judge, audit_base_url=audit_base)
        cfg = dataclasses.replace(cfg, judge=judge)
    # the seams' clock, transport, keys and hook stay in this process (`Seams.for_workers`)
    seams = plan.seams.for_workers()
    return dataclasses.replace(plan, info=info, runlog=runlog, cfg=cfg, seams=seams)


@contextlib.contextmanager
def _client(scheduler: str | None, workers: int | None) -> Iterator[Any]:
    dd = _distributed()
    if scheduler:
        with dd.Client(scheduler) as client:
            yield client
        return
    n = workers or os.cpu_count() or 1
    with (
        dd.LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            # the workers' own warnings (a heartbeat lost while the cluster shuts down, with its
            # traceback) are not the user's business; task failures come back through ctxprec
            silence_logs=logging.ERROR,
        ) as cluster,
        dd.Client(cluster) as client,
    ):
        yield client


def _run_keyed(
    client: Any,
    plan: RunPlan,
    tasks: list[Task],
    run_id: str | None,
    progress: str,
    shards: int,
) -> tuple[list[StageResult], list[BaseException]]:
    """Plan every slice's keys, judge every shard, then reduce every slice (pipeline/engines/
    keyed.py). The scratch folder in OUTDIR goes once the run's parts are all committed."""
    outdir = plan.runlog.outdir
    remove_tree(layout.shuffle_root(outdir))  # an interrupted run's: this driver holds the lock
    name = uuid.uuid4().hex[:12]
    scratch = shuffle_dir(outdir, name)
    # --audit-model: the audit sample's keys go through a shuffle of their own
    audit = shuffle_dir(outdir, f"{name}-audit") if plan.audit_identity is not None else None
    prefix = f"ctxprec-{name}"
    planned = [
        client.submit(
            _plan_task, plan, task, i, scratch, shards, audit, key=f"{prefix}-plan-{task.name}",
            pure=False, retries=TASK_RETRIES,
        )
        for i, task in enumerate(tasks)
    ]  # fmt: skip
    _, errors = _gather(planned, progress, "slices planned")
    if errors:
        return [], errors
    judging = [
        client.submit(
            _judge_task, plan, shard, scratch, shards, run_id, key=f"{prefix}-judge-{shard:05d}",
            pure=False, retries=TASK_RETRIES,
        )
        for shard in range(shards)
    ]  # fmt: skip
    if audit is not None:
        audit_run = _audit_run(run_id) if run_id is not None else None
        judging += [
            client.submit(
                _judge_task, plan, shard, audit, shards, audit_run, True, pure=False,
                key=f"{prefix}-audit-{shard:05d}", retries=TASK_RETRIES,
            )
            for shard in range(shards)
        ]  # fmt: skip
    judged, errors = _gather(judging, progress, "shards judged")
    if errors:
        return judged, errors
    reduced, errors = _run_tasks(client, plan, tasks, run_id, progress, scratch, audit)
    if not errors:
        remove_tree(layout.shuffle_root(outdir))
    return judged + reduced, errors


def _gather(futures: list[Any], progress: str, what: str) -> tuple[list[Any], list[BaseException]]:
    results: list[Any] = []
    errors: list[BaseException] = []
    for future in _distributed().as_completed(futures):
        outcome = future.result() if future.status == "finished" else future.exception()
        (errors if isinstance(outcome, BaseException) else results).append(outcome)
        if progress != "off":
            done = len(results) + len(errors)
            print(f"ctxprec: {done}/{len(futures)} {what}", file=sys.stderr, flush=True)
    return results, errors


def _run_tasks(
    client: Any,
    plan: RunPlan,
    tasks: list[Task],
    run_id: str | None,
    progress: str,
    scratch: OutPath | None = None,
    audit: OutPath | None = None,
) -> tuple[list[StageResult], list[BaseException]]:
    prefix = f"ctxprec-{run_id or uuid.uuid4().hex[:12]}"
    futures = [
        client.submit(
            _run_task, plan, task, run_id, scratch, i, audit, key=f"{prefix}-{task.name}",
            pure=False, retries=TASK_RETRIES,
        )
        for i, task in enumerate(tasks)
    ]  # fmt: skip
    results: list[StageResult] = []
    errors: list[BaseException] = []
    rows = plan.rows_skipped
    for future in _distributed().as_completed(futures):
        outcome = future.result() if future.status == "finished" else future.exception()
        if isinstance(outcome, StageResult):
            results.append(outcome)
            rows += outcome.counters.rows_done
        else:
            errors.append(outcome)
        if progress != "off":
            done = len(results) + len(errors)
            print(
                f"ctxprec: {done}/{len(tasks)} tasks, {rows}/{plan.info.total_rows} rows",
                file=sys.stderr,
                flush=True,
            )
    return results, errors


def _merge(
    plan: RunPlan, results: list[StageResult], central: dict[str, Any] | None
) -> StageResult:
    counters = RunCounters(rows_done=plan.rows_skipped, rows_skipped=plan.rows_skipped)
    stats = JudgeStats()
    throttle = ThrottleStats()
    extra: dict[str, Any] = {}
    audit = AuditCounts(RunCounters(), JudgeStats()) if plan.audit_identity else None
    for result in results:
        if audit is not None and result.audit is not None:
            audit.add(result.audit)
        add_counts(counters, result.counters)
        add_counts(stats, result.stats)
        throttle = _sum_throttle(throttle, result.throttle)
        for key, value in result.extra.items():
            extra[key] = extra.get(key, 0) + value
    counters.dedup_hits = max(counters.dedup_hits, 0)  # a reduce read past its parts (retried)
    if central is not None:  # rates, pauses and waits are the coordinator's
        own = ThrottleStats(**central["throttle"])
        throttle = dataclasses.replace(
            own, admitted=throttle.admitted, rate_limited=throttle.rate_limited
        )
        extra.update(leases=central["leases"], permits=central["permits"])
    return StageResult(counters, stats, throttle, extra, audit=audit)


def _sum_throttle(a: ThrottleStats, b: ThrottleStats) -> ThrottleStats:
    summed = {
        f.name: getattr(a, f.name) + getattr(b, f.name)
        for f in dataclasses.fields(ThrottleStats)
        if f.name not in ("current_rpm", "ceiling_rpm")
    }
    return ThrottleStats(**summed, current_rpm=b.current_rpm, ceiling_rpm=b.ceiling_rpm)


# ---------------------------------------------------------------- on a worker


def _plan_task(
    plan: RunPlan, task: Task, index: int, scratch: OutPath, shards: int, audit: OutPath | None
) -> int:
    return plan_slice(plan, task.file, task.skip(), index, scratch, shards, audit)


def _judge_task(
    plan: RunPlan, shard: int, scratch: OutPath, shards: int, run_id: str | None,
    audit: bool = False,
) -> StageResult | UserError:  # fmt: skip
    """One shard's keys judged, by the audit judge with `audit` (a refused run is returned,
    like a task's user-facing error)."""
    try:
        result: StageResult = run_blocking(
            partial(_judge_main, plan, shard, scratch, shards, run_id, audit)
        )
    except UserError as exc:
        return exc
    return result


async def _judge_main(
    plan: RunPlan, shard: int, scratch: OutPath, shards: int, run_id: str | None, audit: bool
) -> StageResult:
    limits = plan.cfg.limits
    if run_id is None:
        throttle: MeteredThrottle = RateThrottle(
            limits.concurrency, None, None, adaptive=limits.adaptive
        )
        return await judge_shard(plan, shard, scratch, shards, throttle, audit)
    leased = LeasedThrottle(scheduler_lease(run_id), limits.concurrency)
    async with leased.running():
        return await judge_shard(plan, shard, scratch, shards, leased, audit)


def _run_task(
    plan: RunPlan, task: Task, run_id: str | None, scratch: OutPath | None = None, index: int = 0,
    audit: OutPath | None = None,
) -> StageResult | UserError:  # fmt: skip
    """One task: the stage over the task's batches, on its own event loop in this thread. A
    user-facing error (e.g. a corrupt page) is returned, not raised: retrying cannot help.
    With `scratch`, the reduce of a keyed run: its verdicts come from the shards' answers (the
    audit judge's from those of `audit`)."""
    try:
        main = partial(_task_main, plan, task, run_id, scratch, index, audit)
        result: StageResult = run_blocking(main)
    except UserError as exc:
        return exc
    return result


async def _task_main(
    plan: RunPlan,
    task: Task,
    run_id: str | None,
    scratch: OutPath | None,
    index: int,
    audit_scratch: OutPath | None,
) -> StageResult:
    stage = partial(run_stage, plan, files=[task.file], skip=task.skip())
    hooks = ReduceHooks(plan, scratch, index, audit_scratch) if scratch is not None else None
    if hooks is not None:
        stage = partial(stage, open_memo=hooks.open_memo, judge_factory=hooks.judge_factory,
                        paid_keys=hooks.paid_keys)  # fmt: skip
        if audit_scratch is not None:
            stage = partial(
                stage, open_audit_memo=hooks.open_audit_memo, audit_factory=hooks.audit_factory
            )
    elif plan.cfg.run.memo:
        stage = partial(stage, open_memo=partial(_shared_memo, plan, task.file))
    if run_id is None:
        result = await stage()
    else:
        concurrency = plan.cfg.limits.concurrency
        throttle = LeasedThrottle(scheduler_lease(run_id), concurrency)
        async with contextlib.AsyncExitStack() as throttles:
            await throttles.enter_async_context(throttle.running())
            if plan.audit_identity is not None:
                audit = LeasedThrottle(scheduler_lease(_audit_run(run_id)), concurrency)
                await throttles.enter_async_context(audit.running())
                stage = partial(stage, audit_throttle=audit)
            result = await stage(throttle=throttle)
    return hooks.settle(result) if hooks is not None else result


def _shared_memo(plan: RunPlan, file: int) -> MemoStore:
    local = Memo(plan.cfg.run.cache_dir or default_cache_dir())
    store = VerdictStore(verdict_dir(plan.runlog.outdir, plan.info.files[file].absolute()))
    return SharedMemo(local, store)


def scheduler_lease(run_id: str) -> LeaseFn:
    """On a worker: lease calls to the run's coordinator over the worker's scheduler connection."""
    worker = _distributed().get_worker()
    call = getattr(worker.scheduler, _op(run_id))
    loop = worker.loop.asyncio_loop

    async def lease(ests: list[int], debt: int, reports: list[Report]) -> Grant:
        sent = call(ests=ests, debt=debt, reports=[list(r) for r in reports])
        reply = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(sent, loop))
        return Grant(tuple(reply["offsets"]), int(reply["epoch"]), float(reply["ahead"]))

    return lease


# ---------------------------------------------------------------- on the scheduler

_COORDINATORS: dict[str, LeaseCoordinator] = {}  # in the scheduler's process, by run


def install_coordinator(
    client: Any, run_id: str, rpm: float | None, tpm: float | None, adaptive: bool
) -> None:
    """Start the run's `LeaseCoordinator` in the scheduler (a handler on its server)."""
    client.run_on_scheduler(_install, run_id, rpm, tpm, adaptive)


def remove_coordinator(client: Any, run_id: str) -> dict[str, Any]:
    """Stop it; its figures: throttle statistics, lease calls and permits granted."""
    figures: dict[str, Any] = client.run_on_scheduler(_uninstall, run_id)
    return figures


def _op(run_id: str) -> str:
    return f"ctxprec_lease_{run_id}"


def _install(
    run_id: str, rpm: float | None, tpm: float | None, adaptive: bool, dask_scheduler: Any = None
) -> None:
    paced = None if rpm is None else rpm * (1 - RPM_GUARD)
    coordinator = LeaseCoordinator(paced, tpm, adaptive=adaptive)

    async def lease(ests: list[int], debt: int, reports: list[list[Any]]) -> dict[str, Any]:
        told = [(r[0], r[1]) for r in reports]
        grant = await coordinator.lease(ests, debt, told)
        return {"offsets": list(grant.offsets), "epoch": grant.epoch, "ahead": grant.ahead}

    _COORDINATORS[run_id] = coordinator
    dask_scheduler.handlers[_op(run_id)] = lease


def _uninstall(run_id: str, dask_scheduler: Any = None) -> dict[str, Any]:
    dask_scheduler.handlers.pop(_op(run_id), None)
    coordinator = _COORDINATORS.pop(run_id)
    return {
        "throttle": coordinator.stats().as_dict(),
        "leases": coordinator.leases,
        "permits": coordinator.permits,
    }
