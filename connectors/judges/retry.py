"""Failure policy of the HTTP judges, in one place: which statuses and transport errors are
retryable or fatal (`classify`, `classify_exception`), how long the server asks us to wait
(`parse_retry_after`), how long we wait (`backoff`, `RetryClock`), and when we
stop (`RetryPolicy`: max_retries, the retry_budget_s time budget, the run-wide pause ceiling).

Why not stamina (hynek/stamina, 26.1): its `on` hook may return a float or timedelta used as the
next backoff, so a Retry-After can be honoured; it budgets attempts and time, runs async and has
a test mode. It cannot keep four behaviours the judge tests check:
- a wait the server asks for beyond PAUSE_CEILING_S pauses every call of the run and is not
  charged to the retry budget; stamina's `timeout` (tenacity's stop_after_delay) counts all time
  since the first attempt, so the call would give up instead
  (test_strict_providers.test_a_long_retry_after_pauses_the_run_...);
- the budget is checked before sleeping: a wait that would end past retry_budget_s is not slept
  (4 s waits under a 10 s budget: two, then give up; test_http_judges.
  test_retry_budget_stops_long_waits). stop_after_delay only looks at the time already spent, so
  stamina sleeps a third time and makes a fourth attempt;
- a 400 the client adapts to (request shape learning) is sent again at once, up to 8 times,
  neither slept nor counted as a retry; stamina counts every attempt against `attempts`;
- tests run on an instant clock that records each wait and advances a virtual time, so "waits
  what Retry-After says" and the budget are asserted exactly (test_429_waits_what_the_server_says);
  `stamina.set_testing` replaces the stop condition by an attempt cap (no time budget left to
  test), and outside it stamina waits with asyncio.sleep on the real clock.
The loop itself (`client.HttpClient.post_json`) is therefore ours; this module keeps every
decision it takes, so the loop only asks.
"""

from __future__ import annotations

import email.utils
import math
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import aiohttp
import anyio
import anyio.lowlevel

from ctxprec.connectors.judges import jsonfast
from ctxprec.storage.core.errors import JudgeError, JudgeFatalError, JudgeRetryableError
from ctxprec.storage.core.printable import printable
from ctxprec.storage.core.settings import named

__all__ = [
    "MAX_WAIT_S",
    "PAUSE_CEILING_S",
    "RetryClock",
    "RetryPolicy",
    "backoff",
    "classify",
    "classify_exception",
    "error_detail",
    "parse_retry_after",
    "request_id",
    "run_refusal",
]

MAX_WAIT_S = 600.0
PAUSE_CEILING_S = 120.0  # a longer Retry-After pauses the whole run, with a line saying so

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_OPENAI_RESETS = (
    ("x-ratelimit-reset-requests", "x-ratelimit-remaining-requests"),
    ("x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens"),
)
_ANTHROPIC_RESETS = tuple(
    (f"anthropic-ratelimit-{kind}-reset", f"anthropic-ratelimit-{kind}-remaining")
    for kind in ("requests", "tokens", "input-tokens", "output-tokens")
)


def _number(raw: str | None) -> float | None:
    try:
        value = float(raw) if raw is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _duration_s(raw: str) -> float | None:
    """OpenAI's reset form: "1s", "6m0s", "20ms", "1h2m3.5s" (a bare number is seconds)."""
    if re.fullmatch(r"(?:\d+(?:\.\d+)?(?:ms|h|m|s))+", raw):
        return sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION.findall(raw))
    return _number(raw)


def _http_date_s(raw: str, now: float) -> float | None:
    parsed = email.utils.parsedate_tz(raw)
    return None if parsed is None else float(email.utils.mktime_tz(parsed)) - now


def _rfc3339_s(raw: str, now: float) -> float | None:
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return moment.timestamp() - now if moment.tzinfo is not None else None


def _reset_wait(
    h: Mapping[str, str], pairs: Sequence[tuple[str, str]], parse: Callable[[str], float | None]
) -> float | None:
    """The longest reset among exhausted limits (remaining == 0), else the shortest one."""
    found: list[tuple[float, bool]] = []
    for reset_key, remaining_key in pairs:
        wait = parse(h[reset_key]) if reset_key in h else None
        if wait is not None:
            found.append((wait, h.get(remaining_key) == "0"))
    exhausted = [wait for wait, empty in found if empty]
    if exhausted:
        return max(exhausted)
    return min((wait for wait, _ in found), default=None)


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: float | None = None
) -> float | None:
    """Seconds to wait: retry-after-ms, then Retry-After (seconds or HTTP date), then OpenAI's
    x-ratelimit-reset-*, then Anthropic's anthropic-ratelimit-*-reset; clamped to [0, 600]."""
    if not headers:
        return None
    h = {str(k).lower(): str(v).strip() for k, v in headers.items()}
    t = time.time() if now is None else now
    ms = _number(h.get("retry-after-ms"))
    wait = ms / 1000.0 if ms is not None else None
    if wait is None and "retry-after" in h:
        wait = _number(h["retry-after"])
        wait = _http_date_s(h["retry-after"], t) if wait is None else wait
    if wait is None:
        wait = _reset_wait(h, _OPENAI_RESETS, _duration_s)
    if wait is None:
        wait = _reset_wait(h, _ANTHROPIC_RESETS, lambda raw: _rfc3339_s(raw, t))
    return None if wait is None else min(max(wait, 0.0), MAX_WAIT_S)


# ---------------------------------------------------------------- retryable or fatal

_QUOTA = re.compile(
    r"insufficient_quota|quota\W*(?:is\s+)?(?:exhausted|exceeded)|exceeded your current quota"
    r"|check your plan and billing|billing hard limit|credit balance is too low"
    r"|credit_balance_exhausted|no credits remaining|spend_limit_exceeded|usage_limit_exceeded"
    r"|reached your specified api usage limits",
    re.IGNORECASE,
)
_QUOTA_TYPES = frozenset({"insufficient_quota", "billing_error"})
_TOO_LARGE = re.compile(r"request too large", re.IGNORECASE)
_CONTEXT = re.compile(
    r"context_length_exceeded|maximum context length|prompt is too long|exceed_context_size"
    r"|context window",
    re.IGNORECASE,
)
_HINTS = {
    401: "; check the API key in the environment",
    403: "; this key may not use this model or endpoint",
    404: "; check the model name and the base URL",
}


def run_refusal(err: JudgeError, key_env: str, url: str) -> str | None:
    """The message (cause and fix) when `err`'s status alone means no call of this run can
    succeed: out of quota, 401, 403, 404. The one place the retry-or-refuse decision is made by
    status (`classify` above makes those errors fatal; a client refuses the run on them)."""
    status = err.status
    if err.cause == "quota_exhausted":
        return (f"the account is out of quota or credit: {err}. Fix: add credit or raise the "
                f"spend limit of the account behind ${key_env} (or use another key)")  # fmt: skip
    if status == 401:
        return f"the API key was refused ({err}). Fix: put a valid key in ${key_env}"
    if status == 403:
        return (f"this key may not use the model: {err}. Fix: use a key or project with "
                f"access to it, or another {named('judge.model', flag_only=True)}")  # fmt: skip
    if status == 404:
        return (f"unknown model or wrong endpoint: {err}. Fix: check "
                f"{named('judge.model', flag_only=True)} and the base "
                f"URL ({url})")  # fmt: skip
    return None


def _error_object(body: str) -> Any:
    try:
        data = jsonfast.loads(body)
    except ValueError:
        return None
    return data.get("error", data) if isinstance(data, dict) else data


def error_detail(body: str) -> str:
    """The provider's error message if the body is the usual JSON error shape, else the text
    (not redacted: the HTTP layer scrubs keys before any message is shown or logged)."""
    error = _error_object(body)
    if error is None:
        text = body
    else:
        text = str(error.get("message", error)) if isinstance(error, dict) else str(error)
    return printable(" ".join(text.split()), 300) or "(empty body)"


def request_id(body: str, headers: Mapping[str, str] | None) -> str | None:
    """The provider's id for the request (x-request-id, request-id, or the body's request_id)."""
    h = {str(k).lower(): str(v) for k, v in (headers or {}).items()}
    found = h.get("x-request-id") or h.get("request-id")
    if found:
        return found.strip()
    try:
        data = jsonfast.loads(body)
    except ValueError:
        return None
    value = data.get("request_id") if isinstance(data, dict) else None
    return str(value) if isinstance(value, str) and value else None


def _is_quota(status: int, body: str) -> bool:
    error = _error_object(body)
    kind = str(error.get("type", "")).lower() if isinstance(error, dict) else ""
    if status == 402 or kind in _QUOTA_TYPES:
        return True
    return status in (400, 403, 429) and bool(_QUOTA.search(body))


def classify(status: int, body: str, headers: Mapping[str, str] | None = None) -> JudgeError:
    """The one status → error map: 408/409/429/5xx retryable, everything else fatal; out of
    quota and "request too large" (a request over the tokens-per-minute limit) never retried;
    `x-should-retry` overrides the status as the SDKs do. The request id ends the message."""
    err = _classify(status, body, headers)
    rid = request_id(body, headers)
    if rid:
        err.args = (f"{err.args[0]} (request id {rid})",)
    err.body = body
    return err


def _classify(status: int, body: str, headers: Mapping[str, str] | None) -> JudgeError:
    if 300 <= status < 400:  # never followed: prompts and the key go only where base_url says
        lower = {str(k).lower(): str(v) for k, v in (headers or {}).items()}
        where = printable(lower.get("location", ""), 200) or "nowhere (no Location header)"
        return JudgeFatalError(
            f"HTTP {status} redirect to {where}: ctxprec follows no redirect; set base_url to "
            "the address that answers",
            cause="redirect",
            status=status,
        )
    detail = error_detail(body)
    if _is_quota(status, body):
        return JudgeFatalError(
            f"HTTP {status} out of quota: {detail}; check the plan and billing of this API key",
            cause="quota_exhausted",
            status=status,
        )
    if status in (413, 429) and _TOO_LARGE.search(body):
        return JudgeFatalError(
            f"HTTP {status} request too large: {detail}; shorten the items (max_item_chars) or "
            "raise the account's tokens-per-minute limit",
            cause="request_too_large",
            status=status,
        )
    if 400 <= status < 500 and _CONTEXT.search(body):
        return JudgeFatalError(
            f"HTTP {status} context too long: {detail}", cause="context_length", status=status
        )
    should = {str(k).lower(): str(v) for k, v in (headers or {}).items()}.get("x-should-retry")
    retryable = status in (408, 409, 429) or status >= 500
    if should in ("true", "false"):
        retryable = should == "true"
    if retryable:
        cause = "rate_limited" if status == 429 else f"http_{status}"
        wait = parse_retry_after(headers)
        return JudgeRetryableError(
            f"HTTP {status}: {detail}", cause=cause, status=status, retry_after=wait
        )
    hint = _HINTS.get(status, "")
    return JudgeFatalError(f"HTTP {status}: {detail}{hint}", cause=f"http_{status}", status=status)


def classify_exception(exc: BaseException) -> JudgeError | None:
    """Transport failures: timeouts and dropped connections are retryable; None = not ours."""
    name = type(exc).__name__
    if isinstance(exc, aiohttp.ClientSSLError | aiohttp.ServerFingerprintMismatch):
        return JudgeFatalError(f"TLS failure ({name}): {exc}", cause="tls")
    if isinstance(exc, aiohttp.InvalidURL):
        return JudgeFatalError(f"invalid URL ({name}): {exc}; check base_url", cause="bad_url")
    if isinstance(exc, aiohttp.ConnectionTimeoutError):  # nothing answered the connect
        return JudgeRetryableError(f"no connection within the timeout ({name})", cause="connection")
    if isinstance(exc, TimeoutError):
        return JudgeRetryableError(f"no reply within the timeout ({name})", cause="timeout")
    if isinstance(exc, aiohttp.ClientError | ConnectionError):
        return JudgeRetryableError(f"connection failed ({name}): {exc}", cause="connection")
    return None


# ---------------------------------------------------------------- waiting between attempts


class RetryClock:
    """Sleep and clock used between attempts (`ctxprec.storage.core.seams.Clock`), given to a judge
    or batch client in its seams (`create_judge(..., seams=Seams(clock=))`). An instant one (tests)
    only advances a virtual offset on sleep (retry budgets still add up); records each wait."""

    def __init__(
        self,
        instant: bool = False,
        rand: Callable[[], float] = random.random,
        on_sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.instant, self.rand, self.on_sleep = instant, rand, on_sleep
        self.offset = 0.0
        self.waits: list[float] = []

    def now(self) -> float:
        return time.monotonic() + self.offset

    async def sleep(self, seconds: float) -> None:
        if self.on_sleep is not None:
            self.on_sleep(seconds)
        if not self.instant:
            await anyio.sleep(seconds)
            return
        self.waits.append(seconds)
        self.offset += seconds
        await anyio.lowlevel.checkpoint()


def backoff(
    attempt: int,
    base: float,
    cap: float,
    retry_after: float | None = None,
    *,
    rand: Callable[[], float] | None = None,
) -> float:
    """Seconds before retry number `attempt` (1-based). A server-given retry_after wins (plus up
    to 10 % / 1 s jitter so waiters do not return together); else full jitter over
    min(cap, base * 2**(attempt-1))."""
    draw = (rand or random.random)()
    if retry_after is not None:
        return retry_after + draw * min(1.0, 0.1 * retry_after)
    return draw * min(cap, base * 2.0 ** min(max(attempt - 1, 0), 32))


# ---------------------------------------------------------------- when to stop


class RetrySettings(Protocol):
    """The retry fields of the judge settings."""

    @property
    def max_retries(self) -> int: ...
    @property
    def retry_budget_s(self) -> float: ...
    @property
    def backoff_base_s(self) -> float: ...
    @property
    def backoff_max_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long one call is retried: at most `max_retries` retries, and no wait
    that would end past `retry_budget_s` after the first attempt. A connection error (nothing
    answered) is not counted against `max_retries`: a judge restarting is down for seconds, and
    a count of quick retries runs out before it is back. It is retried for as long as the
    judge has been unreachable, up to `retry_budget_s` (the caller says how long that is)."""

    max_retries: int
    retry_budget_s: float
    backoff_base_s: float
    backoff_max_s: float

    @classmethod
    def of(cls, s: RetrySettings) -> RetryPolicy:
        return cls(s.max_retries, s.retry_budget_s, s.backoff_base_s, s.backoff_max_s)

    def may_retry(self, err: JudgeError, retries: int, unreachable_s: float = 0.0) -> bool:
        """A retryable error with retries left (`retries` already made); a connection error
        while the judge has been unreachable for less than the budget."""
        if not isinstance(err, JudgeRetryableError):
            return False
        if err.cause == "connection":
            return unreachable_s < self.retry_budget_s
        return retries < self.max_retries

    @staticmethod
    def pauses_the_run(err: JudgeError) -> float | None:
        """The server's wait when it is past PAUSE_CEILING_S: every call waits it out, and it
        is the server's schedule, not a flaky call, so it is not charged to the budget."""
        wait = getattr(err, "retry_after", None)
        return wait if wait is not None and wait > PAUSE_CEILING_S else None

    def wait(
        self,
        err: JudgeError,
        retries: int,
        elapsed: float,
        *,
        rand: Callable[[], float] | None = None,
    ) -> float | None:
        """Seconds before retry number `retries + 1` (Retry-After, else jittered backoff), or
        None when that wait would pass the budget."""
        retry_after = getattr(err, "retry_after", None)
        wait = backoff(retries + 1, self.backoff_base_s, self.backoff_max_s, retry_after, rand=rand)
        return None if elapsed + wait > self.retry_budget_s else wait

    def describe(self) -> str:
        return (f"max_retries={self.max_retries}, retry_budget_s={self.retry_budget_s:g}; "
                "connection errors are retried for the budget, not counted")  # fmt: skip
