"""`ctxprec.limits.pool.each`: every item once, never more than `workers` at once, memory for
`workers` items (not a task per item), and a failure that stops the rest."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from ctxprec.limits.pool import each


@pytest.mark.parametrize("workers", [0, 1, 3, 50])
async def test_every_item_once_and_at_most_workers_at_once(workers: int) -> None:
    done: list[int] = []
    running, peak = 0, 0

    async def work(i: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.lowlevel.checkpoint()  # let the others start: the pool, not luck, bounds them
        await anyio.lowlevel.checkpoint()
        running -= 1
        done.append(i)

    await each(range(20), work, workers)
    assert sorted(done) == list(range(20))
    assert 1 <= peak <= min(max(1, workers), 20)


async def test_the_workers_do_run_side_by_side() -> None:
    """Three calls that each wait for the other two finish only if three run at once."""
    arrived = 0
    all_in = anyio.Event()

    async def work(_: int) -> None:
        nonlocal arrived
        arrived += 1
        if arrived == 3:
            all_in.set()
        with anyio.fail_after(5):
            await all_in.wait()

    await each(range(3), work, 3)
    assert arrived == 3


async def test_items_are_pulled_as_workers_free_up() -> None:
    """A generator is consumed lazily: no more than `workers` (+ the stream's buffer) ahead."""
    pulled, finished = 0, 0

    def items():  # type: ignore[no-untyped-def]
        nonlocal pulled
        for i in range(100):
            pulled += 1
            assert pulled - finished <= 2 * 4 + 1  # 4 working, 4 buffered, 1 in hand
            yield i

    async def work(_: int) -> None:
        nonlocal finished
        await anyio.lowlevel.checkpoint()
        finished += 1

    await each(items(), work, 4)
    assert finished == 100


async def test_a_failure_stops_the_rest() -> None:
    seen: list[int] = []

    async def work(i: int) -> None:
        seen.append(i)
        if i == 3:
            raise ValueError("boom")
        await anyio.sleep(0.01)

    with pytest.raises(ExceptionGroup) as caught:
        await each(range(1000), work, 2)
    assert caught.group_contains(ValueError, match="boom")
    assert len(seen) < 20
