"""Admission control for judge HTTP attempts: calls in flight, requests/min, tokens/min.

`RateThrottle` implements the judges' `Throttle`; it runs on a `Clock` (`AnyioClock` by default;
tests pass a virtual one).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import anyio

from ctxprec.storage.core.errors import ConfigError

if TYPE_CHECKING:
    from ctxprec.connectors.judges.base import Throttle

__all__ = ["AnyioClock", "Clock", "RateThrottle", "ThrottleStats"]

WINDOW_S = 60.0  # the minute of "per minute"
DEFAULT_PAUSE_S = 1.0  # pause after a 429 without Retry-After; doubles while 429s keep coming
MAX_PAUSE_S = 8.0  # cap of that doubling (a Retry-After is followed as given)
DECREASE = 0.7  # multiplicative decrease on a 429
MIN_RPM = 1.0
FAST_SLOPE = 2.0  # growth below TARGET x ceiling, in ceilings per minute of rate-bound sending
SLOW_SLOPE = 0.03  # growth above it: a probe that doubles each minute without a 429
TARGET = 0.95
SIGNIFICANT_SHARE = 0.1  # 429s below this share of the last minute's requests are noise
SIGNIFICANT_COUNT = 3  # ... and so are fewer than this many
LONG_RETRY_AFTER_S = 10.0  # a Retry-After this long means the budget is used up, not noise
_SPACING = 1.0 + 1e-9  # keeps float rounding from fitting R + 1 requests into 60 s

Reason = Literal["pause", "rpm", "tpm"]
# The (throttle, epoch) of the current task's latest admission: tells a fresh 429 from a stale one.
_ADMISSION: ContextVar[tuple[object, int] | None] = ContextVar("ctxprec_admission", default=None)


class Clock(Protocol):
    """Monotonic seconds and a sleep on the same time line."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class AnyioClock:
    """The event loop's clock (`anyio.current_time`, `anyio.sleep`)."""

    def now(self) -> float:
        try:  # what anyio.current_time() returns on asyncio, without its backend lookup
            return asyncio.get_running_loop().time()
        except RuntimeError:  # another backend (trio)
            return anyio.current_time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(seconds, 0.0))


@dataclass(frozen=True, slots=True)
class ThrottleStats:
    """What the throttle did during a run, for the run summary."""

    admitted: int = 0
    rate_limited: int = 0  # 429s reported
    pauses: int = 0  # distinct pauses (fresh 429s: the first from each admission epoch)
    waited_rpm_s: float = 0.0  # time admissions were held for each reason
    waited_tpm_s: float = 0.0
    waited_pause_s: float = 0.0
    current_rpm: float | None = None  # None: unbounded
    ceiling_rpm: float | None = None  # accepted rate measured at the last fresh 429

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class RateThrottle:
    """Admission control for one event loop: a FIFO count of places in flight, then one
    FIFO queue. Only its head sleeps, until the 429 pause, the RPM spacing and the TPM budget
    all allow a start; it then admits itself (no await in between) and wakes the next.

    RPM is GCRA with burst 1: starts at least 60/rate s apart, so a server counting R per sliding
    60 s never sees more than R from us at rate R (a token bucket of capacity C would let C + R
    through in the first minute). TPM is GCRA on estimated tokens: a start waits until the
    tokens of earlier starts have drained at tpm/60 a second, so any minute holds at most tpm
    plus one request; `used_tokens` moves that schedule by the estimate's error (debt or credit).
    Both are O(1) per call. Every fresh 429 pauses all admissions (Retry-After, else 1 s doubling
    to 8 s while 429s keep coming). Adaptive mode is AIMD on the rate, and only on significant
    pushback: at least 3 429s that are at least 10 % of the last minute's admissions, or a
    Retry-After of 10 s or more. Then rate = min(rate, 0.7 x accepted rate over the last minute)
    and that accepted rate is remembered as the ceiling; a burst of 429s cuts once (a burst's
    later 429s may make it significant). Each rate-bound admission then adds back, fast up to
    0.95 x ceiling, then a slow probe that doubles each calm minute. Random 429s below that
    share are retried after their pause without slowing the run.
    """

    def __init__(
        self,
        max_in_flight: int,
        rpm: float | None,
        tpm: float | None,
        *,
        adaptive: bool = True,
        clock: Clock | None = None,
    ) -> None:
        _check_limits(max_in_flight, rpm, tpm)
        self._clock: Clock = clock or AnyioClock()
        self.max_in_flight = max_in_flight
        self.limits = (max_in_flight, rpm, tpm, adaptive)  # as given: what a run reports
        self._free = max_in_flight  # places in flight not taken
        self._flight_queue: deque[_Turn] = deque()  # tasks waiting for a place, in order
        self._adaptive = adaptive
        self._limit = math.inf if rpm is None else float(rpm)
        self._rate = self._limit
        self._ceiling: float | None = None
        self._sec_per_token = 0.0 if tpm is None else WINDOW_S / tpm
        self._queue: deque[anyio.Event] = deque()
        self._last_admit = -math.inf
        self._token_tat = -math.inf  # GCRA theoretical arrival time of the token budget
        self._pause_until = -math.inf
        self._epoch = 0
        self._cut_epoch = -1  # the last epoch whose 429s cut the rate
        self._last_fresh = -math.inf
        self._streak = 0
        self._first_admit: float | None = None
        self._admits: deque[float] = deque()  # admission times in the last minute
        self._rejects: deque[float] = deque()  # 429 report times in the last minute
        self._waited: dict[Reason, float] = {"pause": 0.0, "rpm": 0.0, "tpm": 0.0}
        self._counts = {"admitted": 0, "rate_limited": 0, "pauses": 0}

    def slot(self, est_tokens: int) -> _Slot:
        """Hold one call-in-flight place, after waiting for RPM and TPM budget."""
        return _Slot(self, est_tokens)

    async def _enter(self, est_tokens: int) -> None:
        """Take a place in flight (free: at once, no task switch; else in FIFO order), then
        admission. A place handed to a task cancelled meanwhile goes to the next in line."""
        if self._free and not self._flight_queue:
            self._free -= 1
        else:
            turn = _Turn()
            self._flight_queue.append(turn)
            try:
                await turn.event.wait()
            except BaseException:
                if turn.granted:
                    self._exit()
                else:
                    self._flight_queue.remove(turn)
                raise
        try:
            await self._admit(max(est_tokens, 0))
        except BaseException:
            self._exit()
            raise

    def _exit(self) -> None:
        """Give the place back: to the first task waiting for one, else to the pool."""
        if self._flight_queue:
            turn = self._flight_queue.popleft()
            turn.granted = True
            turn.event.set()
        else:
            self._free += 1

    @property
    def epoch(self) -> int:
        """Admissions since the last fresh 429 share this number (see `rate_limited`)."""
        return self._epoch

    def rate_limited(self, retry_after: float | None, *, epoch: int | None = None) -> None:
        """The server said 429: pause all admissions; in adaptive mode, when the pushback is
        significant (`_significant`), slow down to 0.7 x the last minute's accepted rate.

        Only a 429 for an attempt admitted since the last fresh one starts a new pause and slows
        the rate; 429s of older attempts only extend the pause to their Retry-After. `epoch`
        says when the attempt was admitted, for a 429 reported from another task or process.
        """
        now = self._clock.now()
        self._counts["rate_limited"] += 1
        self._rejects.append(now)
        _prune(self._rejects, now - WINDOW_S)
        if not self._is_fresh(epoch):
            if retry_after is not None:
                self._pause_until = max(self._pause_until, now + retry_after)
            # a burst's later 429s can make it significant: cut once for the burst
            if self._adaptive and self._cut_epoch < self._epoch and self._significant(retry_after):
                self._cut_epoch = self._epoch
                self._decrease(now)
            return
        self._epoch += 1
        significant = self._significant(retry_after)
        recent = now - self._last_fresh < WINDOW_S
        self._streak = self._streak + 1 if recent and significant else 0
        self._last_fresh = now
        backoff = min(DEFAULT_PAUSE_S * 2**self._streak, MAX_PAUSE_S)
        pause = backoff if retry_after is None else max(retry_after, 0.0)
        self._pause_until = max(self._pause_until, now + pause)
        self._counts["pauses"] += 1
        if self._adaptive and significant:
            self._cut_epoch = self._epoch
            self._decrease(now)

    def _significant(self, retry_after: float | None = None) -> bool:
        """Is the server really pushing back? A few 429s among many accepted requests (a
        provider's random blips) are retried after their pause but do not cut the rate:
        cutting on noise would spiral the rate down for nothing. A long Retry-After is a
        window that is used up: always significant."""
        if retry_after is not None and retry_after >= LONG_RETRY_AFTER_S:
            return True
        rejects = len(self._rejects)
        return rejects >= SIGNIFICANT_COUNT and rejects >= SIGNIFICANT_SHARE * len(self._admits)

    def used_tokens(self, estimated: int, actual: int) -> None:
        """Correct the TPM budget: extra tokens become debt, unused ones come back."""
        self._token_tat += (actual - estimated) * self._sec_per_token

    def stats(self) -> ThrottleStats:
        """A snapshot of the counters, the current rate and the measured ceiling."""
        return ThrottleStats(
            **self._counts,
            waited_rpm_s=self._waited["rpm"],
            waited_tpm_s=self._waited["tpm"],
            waited_pause_s=self._waited["pause"],
            current_rpm=None if math.isinf(self._rate) else self._rate,
            ceiling_rpm=self._ceiling,
        )

    async def _admit(self, est_tokens: int) -> None:
        if not self._queue:
            now = self._clock.now()
            if self._open_at(now):
                # nobody waiting and every limit allows a start now: what the queue below
                # does in that case, without an Event and a queue entry
                self._commit(est_tokens, False, now)
                return
        turn = anyio.Event()
        self._queue.append(turn)
        try:
            if self._queue[0] is not turn:
                await turn.wait()  # set by the previous head when it leaves
            rpm_bound = await self._wait_for_budget()
            self._commit(est_tokens, rpm_bound)
        finally:
            self._leave(turn)

    def _leave(self, turn: anyio.Event) -> None:
        if self._queue[0] is turn:
            self._queue.popleft()
            if self._queue:
                self._queue[0].set()
        else:
            self._queue.remove(turn)  # cancelled while waiting: rare, O(queue) is fine

    async def _wait_for_budget(self) -> bool:
        """Sleep (head of the queue only) until every limit allows a start; True if RPM bound."""
        rpm_bound = False
        while True:
            now = self._clock.now()
            reason, start = self._next_start()
            if start <= now:
                return rpm_bound
            await self._clock.sleep(start - now)
            self._waited[reason] += self._clock.now() - now
            rpm_bound = rpm_bound or reason == "rpm"

    def _next_start(self) -> tuple[Reason, float]:
        interval = WINDOW_S / self._rate * _SPACING
        starts: list[tuple[float, Reason]] = [
            (self._pause_until, "pause"),
            (self._last_admit + interval, "rpm"),
            (self._token_tat, "tpm"),
        ]
        start, reason = max(starts)
        return reason, start

    def _open_at(self, now: float) -> bool:
        """Every limit allows a start at `now` (`_next_start` <= now): no 429 pause, the TPM
        budget and the RPM spacing."""
        return (
            self._pause_until <= now
            and self._token_tat <= now
            and self._last_admit + WINDOW_S / self._rate * _SPACING <= now
        )

    def _commit(self, est_tokens: int, rpm_bound: bool, now: float | None = None) -> None:
        now = self._clock.now() if now is None else now
        self._last_admit = now
        if self._sec_per_token:
            self._token_tat = max(self._token_tat, now) + est_tokens * self._sec_per_token
        if self._first_admit is None:
            self._first_admit = now
        admits = self._admits
        admits.append(now)
        if admits[0] <= now - WINDOW_S:
            _prune(admits, now - WINDOW_S)
        self._counts["admitted"] += 1
        _ADMISSION.set((self, self._epoch))
        if rpm_bound and self._adaptive:
            self._grow(now)

    def _is_fresh(self, epoch: int | None = None) -> bool:
        if epoch is not None:
            return epoch == self._epoch
        tag = _ADMISSION.get()
        return tag is None or tag[0] is not self or tag[1] == self._epoch

    def _observed_rpm(self, now: float) -> float:
        """Accepted requests per minute over the last minute (or since the first admission)."""
        _prune(self._admits, now - WINDOW_S)
        _prune(self._rejects, now - WINDOW_S)
        accepted = max(len(self._admits) - len(self._rejects), 1)
        first = now if self._first_admit is None else self._first_admit
        span = min(WINDOW_S, max(now - first, 1.0))
        return accepted * WINDOW_S / span

    def _decrease(self, now: float) -> None:
        observed = min(self._observed_rpm(now), self._limit)
        self._ceiling = observed
        self._rate = max(MIN_RPM, min(self._rate, DECREASE * observed))

    def _grow(self, now: float) -> None:
        """Additive increase per rate-bound admission: slope x ceiling per minute of sending."""
        ceiling = self._ceiling
        if ceiling is None or self._rate >= self._limit:
            return
        calm_minutes = min((now - self._last_fresh) / WINDOW_S, 10.0)
        probe = SLOW_SLOPE * 2.0**calm_minutes
        slope = FAST_SLOPE if self._rate < TARGET * ceiling else probe
        self._rate = min(self._limit, self._rate + slope * ceiling / self._rate)


class _Turn:
    """A task's wait for a place in flight; `granted` once a leaving call handed it one."""

    __slots__ = ("event", "granted")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.granted = False


class _Slot:
    """`RateThrottle.slot`: a plain async context manager (a generator-based one costs a
    generator, its frames and a task switch per call)."""

    __slots__ = ("_throttle", "_tokens")

    def __init__(self, throttle: RateThrottle, est_tokens: int) -> None:
        self._throttle, self._tokens = throttle, est_tokens

    async def __aenter__(self) -> None:
        throttle = self._throttle
        if throttle._free and not throttle._flight_queue and not throttle._queue:
            # a free place, nobody waiting, every limit allows a start now: what `_enter` and
            # `_admit` do then, without their two coroutines
            now = throttle._clock.now()
            if throttle._open_at(now):
                throttle._commit(max(self._tokens, 0), False, now)
                throttle._free -= 1
                return
        await throttle._enter(self._tokens)

    async def __aexit__(self, *exc: object) -> None:
        self._throttle._exit()


def _prune(times: deque[float], before: float) -> None:
    while times and times[0] <= before:
        times.popleft()


def _check_limits(max_in_flight: int, rpm: float | None, tpm: float | None) -> None:
    if max_in_flight < 1:
        raise ConfigError(f"max_in_flight is {max_in_flight}; set it to 1 or more")
    for name, value in (("rpm", rpm), ("tpm", tpm)):
        if value is not None and not value > 0:
            raise ConfigError(f"{name} is {value}; set a positive limit, or leave it unset")


if TYPE_CHECKING:

    def _is_a_throttle(throttle: RateThrottle) -> Throttle:
        return throttle
