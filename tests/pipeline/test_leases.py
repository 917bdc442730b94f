"""Cluster-wide limits on virtual time: the coordinator's start times, several task throttles
sharing one coordinator (spacing, blocks), TPM, and a 429 that pauses every task. No wall-clock
asserts."""

from __future__ import annotations

import anyio
import pytest

from ctxprec.limits.leases import Grant, LeaseCoordinator, LeasedThrottle, LeaseFn, Report
from tests.fakes.clock import FakeClock, window_max

RTT_S = 0.002  # one lease call's round trip


def lease_fn(coordinator: LeaseCoordinator, clock: FakeClock, calls: list[int]) -> LeaseFn:
    async def lease(ests: list[int], debt: int, reports: list[Report]) -> Grant:
        calls.append(len(ests))
        await clock.sleep(RTT_S / 2)
        grant = await coordinator.lease(ests, debt, reports)
        await clock.sleep(RTT_S / 2)
        return grant

    return lease


async def test_coordinator_spaces_starts_across_leases() -> None:
    clock = FakeClock()
    coordinator = LeaseCoordinator(600, None, adaptive=False, clock=clock)  # one per 0.1 s
    first = await coordinator.lease([1] * 5)
    second = await coordinator.lease([1] * 3)
    assert first.offsets == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert second.offsets == pytest.approx([0.5, 0.6, 0.7])
    assert coordinator.leases == 2
    assert coordinator.permits == 8


async def test_starts_are_granted_up_to_the_horizon() -> None:
    clock = FakeClock()
    coordinator = LeaseCoordinator(600, None, adaptive=False, clock=clock, horizon_s=1.0)
    grant = await coordinator.lease([1] * 30)
    assert grant.offsets == pytest.approx([i / 10 for i in range(11)])  # up to 1 s ahead
    assert grant.ahead == pytest.approx(1.0)
    full = await coordinator.lease([1] * 5)
    assert full.offsets == ()
    assert full.ahead == pytest.approx(1.0)
    await clock.sleep(0.55)
    assert len((await coordinator.lease([1] * 30)).offsets) == 6


async def test_coordinator_tpm_budget() -> None:
    clock = FakeClock()
    coordinator = LeaseCoordinator(None, 6000, adaptive=False, clock=clock, horizon_s=5.0)
    grant = await coordinator.lease([100, 100, 50, 100])
    assert grant.offsets == pytest.approx([0.0, 1.0, 2.0, 2.5])


async def run_tasks(
    clock: FakeClock, throttles: list[LeasedThrottle], requests: int, latency: float
) -> list[float]:
    starts: list[float] = []

    async def task(throttle: LeasedThrottle) -> None:
        async with throttle.running(), anyio.create_task_group() as tg:
            for _ in range(requests):
                tg.start_soon(one, throttle)

    async def one(throttle: LeasedThrottle) -> None:
        async with throttle.slot(10):
            starts.append(clock.now())
            await clock.sleep(latency)

    async with anyio.create_task_group() as tg:
        for throttle in throttles:
            tg.start_soon(task, throttle)
    return starts


async def test_tasks_sharing_a_coordinator_keep_one_rate_and_lease_in_blocks() -> None:
    clock = FakeClock()
    coordinator = LeaseCoordinator(1200, None, adaptive=False, clock=clock)  # 20 a second
    calls: list[int] = []
    throttles = [
        LeasedThrottle(lease_fn(coordinator, clock, calls), 8, clock=clock) for _ in range(3)
    ]
    starts = await run_tasks(clock, throttles, requests=120, latency=0.05)
    assert len(starts) == 360
    assert window_max(starts, width=1.0) <= 21  # 20/s for the three tasks together
    assert window_max(starts, width=60.0) <= 1200
    gaps = [b - a for a, b in zip(sorted(starts), sorted(starts)[1:], strict=False)]
    assert min(gaps) >= 0.05 - 1e-6  # never two starts closer than 1/rate
    assert len(calls) < 360 / 4  # start times come in blocks, not one call per request
    assert coordinator.permits == 360


async def test_a_429_pauses_every_task() -> None:
    clock = FakeClock()
    coordinator = LeaseCoordinator(6000, None, adaptive=False, clock=clock)
    calls: list[int] = []
    throttles = [
        LeasedThrottle(lease_fn(coordinator, clock, calls), 4, clock=clock) for _ in range(2)
    ]
    starts: list[tuple[int, float]] = []
    told = anyio.Event()

    async def one(index: int, throttle: LeasedThrottle) -> None:
        async with throttle.slot(1):
            starts.append((index, clock.now()))
            if index == 0 and len(starts) == 10:
                throttle.rate_limited(3.0)  # the server said: come back in 3 s
                told.set()
            await clock.sleep(0.05)

    async def task(index: int, throttle: LeasedThrottle) -> None:
        async with throttle.running(), anyio.create_task_group() as tg:
            for _ in range(30):
                tg.start_soon(one, index, throttle)

    async with anyio.create_task_group() as tg:
        for i, throttle in enumerate(throttles):
            tg.start_soon(task, i, throttle)
    assert told.is_set()
    t429 = starts[9][1]
    early = [t for _, t in starts[10:] if t < t429 + 3.0]
    assert len(early) <= 8  # only starts leased before the 429 (at most the calls in flight)
    assert {i for i, t in starts if t >= t429 + 3.0} == {0, 1}
    assert coordinator.stats().pauses == 1
    assert throttles[0].stats().rate_limited == 1
