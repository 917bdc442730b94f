"""Virtual time for tests: a `ctxprec.limits.limiter.Clock` whose `sleep` never waits on the
wall clock, and `window_max` to measure a schedule on it; `instant_retries`, the retry clock a
test passes to the judges and batch clients it builds.

Test-only: it reads asyncio's private ready queue (`loop._ready`) to tell when no task is
runnable, which product code must not depend on.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel

from ctxprec.connectors.judges.retry import RetryClock

__all__ = ["FakeClock", "instant_retries", "window_max"]

_MAX_SPINS = 10_000


@dataclass(eq=False)
class _Sleeper:
    until: float
    seq: int
    wake: anyio.Event = field(default_factory=anyio.Event)
    due: bool = False
    gone: bool = False

    def __lt__(self, other: _Sleeper) -> bool:
        return (self.until, self.seq) < (other.until, other.seq)


class FakeClock:
    """Virtual time (asyncio only): `sleep` never waits on the wall clock.

    Time moves only when no task is runnable (asyncio's ready queue is empty): then `now` jumps to
    the earliest wake-up time and that one sleeper resumes (ties in call order), so sleepers
    resume in wake-up order exactly as on a real clock. One of the sleepers drives this; no
    setup is needed.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._heap: list[_Sleeper] = []
        self._seq = itertools.count()
        self._driving = False

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        me = _Sleeper(self._now + seconds, next(self._seq))
        heapq.heappush(self._heap, me)
        driving = not self._driving
        self._driving = True
        try:
            if not driving:
                await me.wake.wait()  # woken when due, or when handed the driver's role
                driving = not me.due
            while not me.due:
                await _settle()
                self._wake_earliest()
        finally:
            me.gone = not me.due
            if driving or (me.wake.is_set() and me.gone):
                self._driving = False
                self._hand_over()

    def _wake_earliest(self) -> None:
        entry = heapq.heappop(self._heap)
        while entry.gone:
            entry = heapq.heappop(self._heap)
        self._now = max(self._now, entry.until)
        entry.due = True
        entry.wake.set()

    def _hand_over(self) -> None:
        while self._heap and self._heap[0].gone:
            heapq.heappop(self._heap)
        if self._heap:
            self._driving = True
            self._heap[0].wake.set()


async def _settle() -> None:
    """Yield until no other task is runnable (the loop's ready queue is empty)."""
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    await anyio.lowlevel.checkpoint()
    for _ in range(_MAX_SPINS):
        if ready is not None and not ready:
            return
        await anyio.lowlevel.checkpoint()


def instant_retries(on_sleep: Callable[[float], None] | None = None) -> RetryClock:
    """Retry waits that are instant and recorded (`.waits`), jitter drawing 0 so they are exact."""
    return RetryClock(instant=True, rand=lambda: 0.0, on_sleep=on_sleep)


def window_max(times: list[float], weights: list[int] | None = None, width: float = 60.0) -> int:
    """The largest total (count, or sum of weights) in any half-open window [t, t + width)."""
    times_sorted = sorted(range(len(times)), key=times.__getitem__)
    ts = [times[i] for i in times_sorted]
    ws = [1 if weights is None else weights[i] for i in times_sorted]
    prefix = [0]
    for w in ws:
        prefix.append(prefix[-1] + w)
    best = 0
    for i, t in enumerate(ts):
        j = bisect.bisect_left(ts, t + width)
        best = max(best, prefix[j] - prefix[i])
    return best
