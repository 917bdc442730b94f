"""RateThrottle on virtual time: in-flight cap, sliding-window RPM, TPM with corrections, 429
pauses, AIMD against a simulated rate-limited server, FIFO order. No wall-clock timing asserts."""

from __future__ import annotations

import bisect
import itertools
import random
from collections import deque
from collections.abc import Awaitable, Callable

import anyio
import pytest

from ctxprec.connectors.judges.base import Throttle
from ctxprec.limits.limiter import AnyioClock, RateThrottle, ThrottleStats
from ctxprec.storage.core.errors import ConfigError
from tests.fakes.clock import FakeClock, window_max


def count_between(times: list[float], start: float, end: float) -> int:
    ts = sorted(times)
    return bisect.bisect_left(ts, end) - bisect.bisect_left(ts, start)


async def run_workers(n: int, work: Callable[[int], Awaitable[None]]) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(work, i)


class SlidingWindowServer:
    """Accepts at most `limit` requests in any sliding 60 s; 429s are not counted."""

    def __init__(self, clock: FakeClock, limit: int, *, retry_after: bool) -> None:
        self.clock, self.limit, self.retry_after = clock, limit, retry_after
        self.window: deque[float] = deque()
        self.accepted: list[float] = []
        self.rejected: list[float] = []

    def call(self) -> tuple[bool, float | None]:
        now = self.clock.now()
        while self.window and self.window[0] <= now - 60.0:
            self.window.popleft()
        if len(self.window) >= self.limit:
            self.rejected.append(now)
            return False, (self.window[0] + 60.0 - now) if self.retry_after else None
        self.window.append(now)
        self.accepted.append(now)
        return True, None


# --- the fake clock ---------------------------------------------------------------------------


async def test_fake_clock_wakes_sleepers_in_time_order() -> None:
    clock = FakeClock()
    woke: list[tuple[str, float]] = []

    async def nap(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))
        if name == "a":
            await clock.sleep(0.5)  # a sleep that starts later but ends before "c"
            woke.append(("a2", clock.now()))

    async with anyio.create_task_group() as tg:
        for name, seconds in (("c", 3.0), ("a", 1.0), ("b", 2.0), ("b2", 2.0)):
            tg.start_soon(nap, name, seconds)
    assert woke == [("a", 1.0), ("a2", 1.5), ("b", 2.0), ("b2", 2.0), ("c", 3.0)]


async def test_fake_clock_survives_cancelled_sleepers() -> None:
    clock = FakeClock()
    woke: list[float] = []
    b_woke = anyio.Event()

    async def sleeper(seconds: float, done: anyio.Event | None = None) -> None:
        await clock.sleep(seconds)
        woke.append(clock.now())
        if done is not None:
            done.set()

    async with anyio.create_task_group() as tg, anyio.create_task_group() as doomed:
        doomed.start_soon(sleeper, 10.0)  # sleeps first, so it drives the clock
        doomed.start_soon(sleeper, 20.0)  # a plain waiter
        tg.start_soon(sleeper, 2.0, b_woke)
        tg.start_soon(sleeper, 5.0)
        await b_woke.wait()
        doomed.cancel_scope.cancel()  # the driver and a waiter go; the clock goes on
    assert woke == [2.0, 5.0]
    assert clock.now() == 5.0


# --- calls in flight --------------------------------------------------------------------------


async def test_max_in_flight_never_exceeded_with_200_tasks() -> None:
    clock = FakeClock()
    throttle = RateThrottle(7, None, None, clock=clock)
    rng = random.Random(3)
    in_flight, peak, done = 0, 0, 0

    async def call(_: int) -> None:
        nonlocal in_flight, peak, done
        async with throttle.slot(10):
            in_flight += 1
            peak = max(peak, in_flight)
            await clock.sleep(rng.uniform(0.1, 2.0))
            in_flight -= 1
        done += 1

    await run_workers(200, call)
    assert (peak, done, in_flight) == (7, 200, 0)
    assert throttle.stats().admitted == 200


async def test_places_in_flight_go_to_waiters_in_arrival_order() -> None:
    clock = FakeClock()
    throttle = RateThrottle(2, None, None, clock=clock)
    started: list[int] = []

    async def call(i: int) -> None:
        await clock.sleep(i * 0.01)  # arrive in order 0, 1, 2, ...
        async with throttle.slot(1):
            started.append(i)
            await clock.sleep(1.0 + (i % 3) * 0.37)

    await run_workers(9, call)
    assert started == list(range(9))


async def test_a_waiter_cancelled_before_or_after_its_turn_gives_the_place_on() -> None:
    clock = FakeClock()
    throttle = RateThrottle(1, None, None, clock=clock)
    entered: list[str] = []
    release = anyio.Event()

    async def holder() -> None:
        async with throttle.slot(1):
            entered.append("holder")
            await release.wait()

    async def waiter(name: str) -> None:
        async with throttle.slot(1):
            entered.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await clock.sleep(0.1)
        async with anyio.create_task_group() as doomed:
            doomed.start_soon(waiter, "cancelled while waiting")
            await clock.sleep(0.1)
            doomed.cancel_scope.cancel()
        async with anyio.create_task_group() as late:
            late.start_soon(waiter, "granted, then cancelled")
            await clock.sleep(0.1)
            release.set()  # the place is handed to the waiter ...
            late.cancel_scope.cancel()  # ... which is cancelled before it runs
        tg.start_soon(waiter, "last")
    assert entered == ["holder", "last"]
    async with throttle.slot(1):  # nothing leaked: the one place is free again
        entered.append("again")
    assert entered[-1] == "again"


# --- requests per minute ----------------------------------------------------------------------


@pytest.mark.parametrize("rpm", [7, 120, 600])
async def test_rpm_never_exceeded_in_any_sliding_minute(rpm: int) -> None:
    clock = FakeClock()
    throttle = RateThrottle(32, rpm, None, clock=clock)
    rng = random.Random(rpm)
    admitted: list[float] = []

    async def worker(_: int) -> None:
        while clock.now() < 180.0:
            async with throttle.slot(10):
                admitted.append(clock.now())
                await clock.sleep(rng.uniform(0.05, 3.0))

    await run_workers(32, worker)
    first_three_minutes = [t for t in admitted if t < 180.0]
    assert window_max(admitted) <= rpm
    assert len(first_three_minutes) >= 0.95 * 3 * rpm
    assert throttle.stats().waited_rpm_s > 0


# --- tokens per minute ------------------------------------------------------------------------


async def test_tpm_respected_with_exact_estimates() -> None:
    clock, tpm = FakeClock(), 20_000
    throttle = RateThrottle(16, None, tpm, clock=clock)
    rng = random.Random(5)
    times: list[float] = []
    tokens: list[int] = []

    async def worker(_: int) -> None:
        while clock.now() < 180.0:
            est = rng.randint(200, 1500)
            async with throttle.slot(est):
                times.append(clock.now())
                tokens.append(est)
                await clock.sleep(rng.uniform(0.2, 2.0))
            throttle.used_tokens(est, est)

    await run_workers(16, worker)
    assert window_max(times, tokens) <= tpm + 1500  # burst of one request, no more
    spent = sum(n for t, n in zip(times, tokens, strict=True) if t < 180.0)
    assert spent >= 0.9 * 3 * tpm
    assert throttle.stats().waited_tpm_s > 0


@pytest.mark.parametrize(("estimated", "actual"), [(100, 300), (300, 100)])
async def test_tpm_corrections_charge_debt_and_return_credit(estimated: int, actual: int) -> None:
    clock, tpm = FakeClock(), 6_000
    throttle = RateThrottle(1, None, tpm, clock=clock)
    times: list[float] = []

    async def worker(_: int) -> None:
        while clock.now() < 180.0:
            async with throttle.slot(estimated):
                times.append(clock.now())
                await clock.sleep(0.1)
            throttle.used_tokens(estimated, actual)

    await run_workers(1, worker)
    used = [actual] * len(times)
    assert window_max(times, used) <= tpm + max(estimated, actual)
    spent = actual * count_between(times, 0.0, 180.0)
    assert spent >= 0.95 * 3 * tpm  # debt slowed us, credit sped us up: real usage ~ tpm


# --- 429 pauses and AIMD ----------------------------------------------------------------------


@pytest.mark.parametrize(("retry_after", "pause"), [(2.0, 2.0), (None, 1.0)])
async def test_rate_limited_pauses_all_admissions(retry_after: float | None, pause: float) -> None:
    clock = FakeClock()
    throttle = RateThrottle(8, None, None, adaptive=False, clock=clock)
    admitted: list[float] = []
    async with throttle.slot(1):
        await clock.sleep(0.25)
        throttle.rate_limited(retry_after)

    async def call(_: int) -> None:
        async with throttle.slot(1):
            admitted.append(clock.now())

    await run_workers(5, call)
    assert admitted == [0.25 + pause] * 5
    stats = throttle.stats()
    assert (stats.pauses, stats.rate_limited, stats.admitted) == (1, 1, 6)
    assert stats.waited_pause_s == pytest.approx(pause)
    assert stats.current_rpm is None  # not adaptive: the rate is left alone


async def test_adaptive_429_multiplies_rate_by_0_7_once_per_epoch() -> None:
    clock = FakeClock()
    throttle = RateThrottle(4, 60, None, clock=clock)
    for _ in range(60):  # one minute at exactly 60/min
        async with throttle.slot(1):
            pass
    async with throttle.slot(1):  # the 1st 429: below the significant share, no cut
        throttle.rate_limited(0.0)
    assert throttle.stats().current_rpm == 60
    for _ in range(9):  # the server keeps pushing back: 10 of 70 is a significant share
        async with throttle.slot(1):
            throttle.rate_limited(0.0)
    stats = throttle.stats()
    rate = stats.current_rpm
    assert rate is not None
    assert stats.pauses == 10
    assert 1.0 <= rate <= 0.7 * 60
    throttle.rate_limited(0.0)  # the same attempt's epoch again: stale, no further cut
    stats = throttle.stats()
    assert (stats.current_rpm, stats.pauses, stats.rate_limited) == (rate, 10, 11)


async def test_a_few_random_429s_pause_but_do_not_cut_the_rate() -> None:
    clock = FakeClock()
    throttle = RateThrottle(4, 600, None, clock=clock)
    for i in range(300):
        async with throttle.slot(1):
            if i % 50 == 49:  # 2 % of calls: provider noise, not a limit
                throttle.rate_limited(0.5)
    stats = throttle.stats()
    assert stats.rate_limited == stats.pauses == 6
    assert stats.current_rpm == 600  # never cut
    assert stats.waited_pause_s == pytest.approx(5 * 0.5, abs=0.2)  # the 6th is not waited


@pytest.mark.parametrize("retry_after", [True, False])
async def test_adaptive_converges_to_unknown_server_limit(retry_after: bool) -> None:
    clock, limit, workers = FakeClock(), 600, 64
    throttle = RateThrottle(workers, None, None, clock=clock)
    server = SlidingWindowServer(clock, limit, retry_after=retry_after)
    rng = random.Random(11)

    async def worker(_: int) -> None:
        while clock.now() < 180.0:
            async with throttle.slot(100):
                ok, wait = server.call()
                await clock.sleep(rng.uniform(0.5, 1.5) if ok else 0.05)
                if not ok:
                    throttle.rate_limited(wait)

    await run_workers(workers, worker)
    after_first_minute = count_between(server.accepted, 60.0, 180.0) / 2
    assert after_first_minute >= 0.9 * limit
    # 429s below a 10 % share are treated as noise (retried, no cut): after the first contact
    # the throttle probes up to the limit and lives with a small share of 429s there
    assert count_between(server.rejected, 60.0, 180.0) <= 0.1 * after_first_minute * 2
    assert len(server.rejected) <= workers * 2 + 0.1 * limit * 3
    assert throttle.stats().ceiling_rpm is not None
    # it really slowed down: the rate was cut near the limit
    current = throttle.stats().current_rpm
    assert current is not None
    assert current <= 1.2 * limit
    late = sorted(t for t in server.accepted if t >= 60.0)
    assert max(b - a for a, b in itertools.pairwise(late)) < 60.0  # at most one window idle


async def test_adaptive_at_the_configured_limit_never_sees_a_429() -> None:
    clock, limit = FakeClock(), 300
    throttle = RateThrottle(64, limit, None, clock=clock)
    server = SlidingWindowServer(clock, limit, retry_after=True)

    async def worker(_: int) -> None:
        while clock.now() < 180.0:
            async with throttle.slot(100):
                ok, wait = server.call()
                if not ok:
                    throttle.rate_limited(wait)
                await clock.sleep(1.0)

    await run_workers(64, worker)
    assert server.rejected == []
    assert count_between(server.accepted, 0.0, 180.0) >= 0.95 * 3 * limit


# --- fairness ---------------------------------------------------------------------------------


async def test_admissions_are_fifo_and_nobody_starves() -> None:
    clock = FakeClock()
    throttle = RateThrottle(64, 120, 6_000, clock=clock)
    arrivals: list[int] = []
    admissions: list[int] = []

    async def call(i: int) -> None:
        await clock.sleep(0.01 * (i + 1))  # distinct arrival times, in index order
        arrivals.append(i)
        async with throttle.slot(1_000 if i % 5 == 0 else 20):  # big requests among small ones
            admissions.append(i)

    await run_workers(60, call)
    assert admissions == arrivals == list(range(60))


@pytest.mark.parametrize("doomed_position", ["head", "queued"])
async def test_cancelled_waiter_does_not_block_the_queue(doomed_position: str) -> None:
    clock = FakeClock()
    throttle = RateThrottle(8, 60, None, clock=clock)  # one admission a second
    admitted: list[tuple[int, float]] = []

    async def call(i: int) -> None:
        async with throttle.slot(1):
            admitted.append((i, round(clock.now(), 6)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, 0)  # admitted at 0
        if doomed_position == "queued":
            tg.start_soon(call, 1)  # head: sleeps until 1
        async with anyio.create_task_group() as doomed:
            doomed.start_soon(call, 99)
            await clock.sleep(0.5)
            doomed.cancel_scope.cancel()
        for i in range(2, 4):
            tg.start_soon(call, i)
    later = [(2, 1.0), (3, 2.0)] if doomed_position == "head" else [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert admitted == [(0, 0.0), *later]


# --- construction and the real clock ----------------------------------------------------------


@pytest.mark.parametrize(
    ("max_in_flight", "rpm", "tpm"), [(0, None, None), (1, 0, None), (1, None, -5)]
)
def test_bad_limits_raise_config_error(
    max_in_flight: int, rpm: float | None, tpm: float | None
) -> None:
    with pytest.raises(ConfigError, match="set"):
        RateThrottle(max_in_flight, rpm, tpm)


async def test_real_clock_gate_is_a_gate_and_reports_stats() -> None:
    throttle: Throttle = RateThrottle(2, None, None)
    for _ in range(3):
        async with throttle.slot(5):
            pass
    throttle.used_tokens(5, 7)
    assert isinstance(throttle, RateThrottle)
    stats = throttle.stats()
    assert isinstance(stats, ThrottleStats)
    assert stats.admitted == 3
    assert set(stats.as_dict()) >= {"admitted", "rate_limited", "pauses", "current_rpm"}
    clock = AnyioClock()
    before = clock.now()
    await clock.sleep(0)
    assert clock.now() >= before
