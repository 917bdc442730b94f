"""A fixed pool of workers over a sequence: `each(items, work, workers)` runs `work(item)` for
every item with at most `workers` at once, and returns when all are done. The one pattern for
the side jobs that make judge calls outside the row flow: `--recheck` (the judge against
itself), `--reason llm` (one reason per row) and the Python API's `run_evals`.

`workers` tasks read one shared stream, so memory holds `workers` items in progress, not one
task per item (a recheck of 1 % of a million rows is 10,000 calls). The row flow's own pool is
`ctxprec.flow.dispatch.Dispatcher`, which adds what those calls need and these do not: the
memo, one call per distinct key, the kill-safe journal and the progress counters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

__all__ = ["each"]

T = TypeVar("T")


async def each(items: Iterable[T], work: Callable[[T], Awaitable[None]], workers: int) -> None:
    """`await work(item)` for each item, `workers` (at least 1) at a time. An exception from
    `work` cancels the others and comes out of the task group, as anyio's do."""
    send, recv = anyio.create_memory_object_stream[T](max(1, workers))

    async def worker(queue: MemoryObjectReceiveStream[T]) -> None:
        async with queue:
            async for item in queue:
                await work(item)

    async with anyio.create_task_group() as tg:
        for _ in range(max(1, workers)):
            tg.start_soon(worker, recv.clone())
        recv.close()
        async with send:
            for item in items:
                await send.send(item)
