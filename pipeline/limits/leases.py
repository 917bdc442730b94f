"""Cluster-wide RPM/TPM: one `LeaseCoordinator` sets the start time of every request of every
worker; each task's `LeasedThrottle` leases start times in blocks and waits for them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from ctxprec.limits.limiter import AnyioClock, Clock, RateThrottle, ThrottleStats

if TYPE_CHECKING:
    from ctxprec.connectors.judges.base import Throttle

__all__ = ["Grant", "LeaseCoordinator", "LeaseFn", "LeasedThrottle", "Report"]

MIN_LINGER_S = 0.005  # a lease waits this long for more requests to join it ...
MAX_LINGER_S = 0.5  # ... and up to this long while the cluster is at its limit
MAX_BLOCK = 1000  # start times asked for in one lease
HORIZON_S = 2.0  # starts are granted this far ahead at most: a 429 pause acts within it
_ANY = 1_000_000  # "calls in flight" of the coordinator: it only schedules, it holds no call

Report = tuple[float | None, int | None]  # one 429: (Retry-After, epoch of its admission)
# (token estimates of the requests, token debt, 429 reports) -> their start times
LeaseFn = Callable[[list[int], int, list[Report]], Awaitable["Grant"]]
_EPOCH: ContextVar[int | None] = ContextVar("ctxprec_lease_epoch", default=None)


@dataclass(frozen=True, slots=True)
class Grant:
    """Start times of one lease, in seconds after the reply, for the first requests asked for
    (none when the schedule is full up to the horizon); `ahead`: the delay of the next free one."""

    offsets: tuple[float, ...]
    epoch: int
    ahead: float = 0.0


class _ScheduleClock:
    """Time that never waits: `sleep` moves a cursor forward and `now` is the later of the real
    time and the cursor, so each admission lands at the earliest start the limits allow."""

    def __init__(self, real: Clock) -> None:
        self.real = real
        self._cursor = -math.inf

    def now(self) -> float:
        return max(self.real.now(), self._cursor)

    async def sleep(self, seconds: float) -> None:
        self._cursor = self.now() + max(seconds, 0.0)


class LeaseCoordinator:
    """Paces a whole cluster: a `RateThrottle` on a clock that does not wait. An admission returns
    the time it would have started, and that time is the permit; RPM spacing, the TPM budget,
    429 pauses and the adaptive slow-down are exactly those of the local engine's throttle. Starts
    are granted up to `horizon_s` ahead: the other requests ask again later."""

    def __init__(
        self,
        rpm: float | None,
        tpm: float | None,
        *,
        adaptive: bool = True,
        clock: Clock | None = None,
        horizon_s: float = HORIZON_S,
    ) -> None:
        self._clock = _ScheduleClock(clock or AnyioClock())
        self._horizon = horizon_s
        self._throttle = RateThrottle(_ANY, rpm, tpm, adaptive=adaptive, clock=self._clock)
        self.leases = 0
        self.permits = 0

    async def lease(
        self, ests: Sequence[int], debt: int = 0, reports: Sequence[Report] = ()
    ) -> Grant:
        for retry_after, epoch in reports:
            self._throttle.rate_limited(retry_after, epoch=-1 if epoch is None else epoch)
        if debt:
            self._throttle.used_tokens(0, debt)
        epoch = self._throttle.epoch
        asked = self._clock.real.now()
        starts: list[float] = []
        for est in ests:
            if self._clock.now() - asked >= self._horizon:
                break
            async with self._throttle.slot(est):
                starts.append(self._clock.now() - asked)
        self.leases += 1
        self.permits += len(starts)
        return Grant(tuple(starts), epoch, max(self._clock.now() - asked, 0.0))

    def stats(self) -> ThrottleStats:
        return self._throttle.stats()


@dataclass(eq=False)
class _Want:
    est: int
    done: anyio.Event = field(default_factory=anyio.Event)
    start: float = 0.0
    epoch: int = 0
    error: BaseException | None = None


class LeasedThrottle:
    """A task's throttle under cluster-wide limits. Calls in flight are held here; each start waits
    for a start time from the coordinator. One leaser task asks for the starts of all waiting
    requests at once; while the cluster is at its limit (starts come back in the future) it
    first waits half that delay, so blocks grow and lease calls stay few. A 429 goes to the
    coordinator with the next lease, sent without waiting (within one wait at most); starts
    already leased still go, like calls a local throttle has admitted.
    Use `async with throttle.running():` around the work."""

    def __init__(
        self,
        lease: LeaseFn,
        max_in_flight: int,
        *,
        clock: Clock | None = None,
        min_linger_s: float = MIN_LINGER_S,
        max_linger_s: float = MAX_LINGER_S,
    ) -> None:
        self._lease = lease
        self._clock: Clock = clock or AnyioClock()
        self._in_flight = anyio.CapacityLimiter(max_in_flight)
        self._linger = (min_linger_s, max_linger_s)
        self._wants: list[_Want] = []
        self._reports: list[Report] = []
        self._debt = 0
        self._wake = anyio.Event()
        self._backlog = 0.0  # delay of the next free start at the last lease: > 0 if rate-bound
        self.leases = 0
        self._admitted = 0
        self._rate_limited = 0

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[LeasedThrottle]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._serve)
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

    @contextlib.asynccontextmanager
    async def slot(self, est_tokens: int) -> AsyncIterator[None]:
        """Hold one call-in-flight place, after waiting for a leased start time."""
        async with self._in_flight:
            await self._wait_for_start(max(est_tokens, 0))
            yield

    def rate_limited(self, retry_after: float | None) -> None:
        self._rate_limited += 1
        self._reports.append((retry_after, _EPOCH.get()))
        self._wake.set()

    def used_tokens(self, estimated: int, actual: int) -> None:
        self._debt += actual - estimated  # sent with the next lease

    def stats(self) -> ThrottleStats:
        """This task's view; pauses, waits and rates are the coordinator's to tell."""
        return ThrottleStats(admitted=self._admitted, rate_limited=self._rate_limited)

    async def _wait_for_start(self, est: int) -> None:
        want = _Want(est)
        self._wants.append(want)
        self._wake.set()
        await want.done.wait()
        if want.error is not None:
            raise RuntimeError(f"no start time from the rate coordinator: {want.error}")
        await self._clock.sleep(want.start - self._clock.now())
        self._admitted += 1
        _EPOCH.set(want.epoch)

    async def _serve(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            if not self._reports:  # a 429 report goes without lingering
                low, high = self._linger
                await self._clock.sleep(min(high, max(low, self._backlog / 2)))
            wants, self._wants = self._wants[:MAX_BLOCK], self._wants[MAX_BLOCK:]
            reports, self._reports = self._reports, []
            debt, self._debt = self._debt, 0
            if self._wants:
                self._wake.set()
            if wants or reports:
                await self._lease_for(wants, debt, reports)
            else:
                self._debt += debt

    async def _lease_for(self, wants: list[_Want], debt: int, reports: list[Report]) -> None:
        try:
            grant = await self._lease([w.est for w in wants], debt, reports)
        except Exception as exc:  # the coordinator is gone: the waiting requests fail
            for want in wants:
                want.error = exc
                want.done.set()
            return
        self.leases += 1
        received = self._clock.now()
        granted = len(grant.offsets)
        for want, offset in zip(wants, grant.offsets, strict=False):
            want.start, want.epoch = received + offset, grant.epoch
            want.done.set()
        if granted < len(wants):  # beyond the horizon: ask again, first in line
            self._wants[:0] = wants[granted:]
            self._wake.set()
        self._backlog = grant.ahead


if TYPE_CHECKING:

    def _is_a_throttle(throttle: LeasedThrottle) -> Throttle:
        return throttle
