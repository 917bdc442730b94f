"""The frame of a run driven from this process: prepare it (which takes the output folder's
lock), let the caller run its stages, finish it (sinks, summary, run.json, `_SUCCESS`), and give
the lock back however it ends. The local engine and the batch-API run both run in this frame.
`run_blocking` is the synchronous way in, for them and for the Dask engine's driver and tasks.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

import anyio

from pipeline.config import Config
from pipeline.driver import (
    RunPlan,
    RunResult,
    StageResult,
    finish_run,
    prepare_run,
    release_outdir,
)
from storage.core.errors import first_meaningful
from storage.objpath import OutPath

__all__ = ["LocalRun", "local_run", "run_blocking"]

T = TypeVar("T")


def run_blocking(fn: Callable[[], Awaitable[T]]) -> T:
    """Run `fn` on a new event loop. User-facing errors raised inside a task group come out as
    themselves, not wrapped in an ExceptionGroup."""
    try:
        return anyio.run(fn)
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
    *,
    overwrite: bool = False,
    incremental: bool = False,
    wait_lock: float = 0.0,
) -> AsyncIterator[LocalRun]:
    """Prepare the run; the lock is held from open to finish, whatever happens in between."""
    started, started_at = time.monotonic(), datetime.now(UTC)
    plan = await prepare_run(
        input, outdir, cfg, overwrite=overwrite, incremental=incremental, wait_lock=wait_lock
    )
    try:
        yield LocalRun(plan, started, started_at)
    finally:
        release_outdir(plan)
