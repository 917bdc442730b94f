"""One judge call over HTTP under the run's rules: a slot from the throttle, the request through
the transport, the reply classified (`retry.classify`), retried as `retry.RetryPolicy` allows, a
rejected request shape adapted to at once (`shapes`, through the provider's `_learn`), and the
whole run refused when no call can succeed (bad key, unknown model, no quota). Providers add the
headers and the usage reading; `conversation` builds the request bodies and reads the replies.
"""

from __future__ import annotations

import abc
import logging
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from ctxprec.connectors.judges import jsonfast
from ctxprec.connectors.judges.base import JudgeStats, Throttle
from ctxprec.connectors.judges.retry import (
    RetryClock,
    RetryPolicy,
    classify,
    classify_exception,
    error_detail,
    run_refusal,
)
from ctxprec.connectors.judges.secrets import redact, redacted_headers, register_secret
from ctxprec.connectors.judges.shapes import RequestShape
from ctxprec.connectors.judges.transport import (
    AiohttpTransport,
    HttpRequest,
    HttpResponse,
    Transport,
)
from ctxprec.storage.core.constants import MAX_CALL_TOKENS
from ctxprec.storage.core.errors import (
    JudgeError,
    JudgeRefusedRunError,
    JudgeRetryableError,
    JudgeUnreachableError,
)
from ctxprec.storage.core.printable import printable
from ctxprec.storage.core.seams import DEFAULT, Clock, Seams
from ctxprec.storage.core.settings import JudgeSettings

__all__ = ["UNKNOWN", "HttpClient", "json_count", "json_int"]

_log = logging.getLogger("ctxprec.http")

_MAX_ADAPTATIONS = 8  # shape changes one call may go through (each is shared by the run)
_SAME_400_TO_REFUSE = 3  # the same rejected request this often, and nothing accepted: stop


def json_int(value: Any) -> int:
    """An integer field of a provider's JSON (usage, counts); 0 when absent, null or not an int."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


UNKNOWN = -1  # a token count that is not one (`json_count`): the call's usage is unknown


def json_count(value: Any) -> int:
    """A token count of a provider's usage: 0 when absent, null or not an int (vLLM, Ollama,
    proxies leave some out); UNKNOWN when outside 0..MAX_CALL_TOKENS (2**62, -5: not a count).
    Providers read usage through it, so a usage holding UNKNOWN is unknown (one test a call)."""
    return (value if 0 <= value <= MAX_CALL_TOKENS else UNKNOWN) if type(value) is int else 0


def _json_object(body: str) -> dict[str, Any]:
    # A 200 whose body is not a JSON object is a transport/proxy glitch (HTML error page,
    # truncated body), not a model decision: retry it like a 5xx instead of re-asking.
    try:
        data = jsonfast.loads(body)
    except ValueError:
        data = None
    if type(data) is not dict:
        detail = error_detail(body)
        raise JudgeRetryableError(f"HTTP 200 with a non-JSON body: {detail}", cause="garbage")
    return data


def _final_error(err: JudgeError, message: str) -> JudgeError:
    if isinstance(err, JudgeRetryableError):
        new: JudgeError = JudgeRetryableError(
            message, cause=err.cause, status=err.status, retry_after=err.retry_after
        )
    else:
        new = type(err)(message, cause=err.cause, status=err.status)
    new.body = err.body
    return new


class HttpClient(abc.ABC):
    """The POST-with-retries half of an HTTP judge, over one transport (aiohttp unless the seams
    hold one). Run-wide state lives here, shared by every concurrent call: the request `shape`
    (what the server accepts, learned once), the refusal that stops the run, a long pause."""

    provider = "http"
    model: str
    key_env = "API_KEY"
    shape: RequestShape

    def __init__(
        self,
        settings: JudgeSettings,
        throttle: Throttle,
        stats: JudgeStats,
        *,
        url: str,
        api_key: str | None,
        seams: Seams = DEFAULT,
    ) -> None:
        self.settings, self.throttle, self.stats = settings, throttle, stats
        # the waits between attempts: real unless the seams hold a clock (tests: an instant one)
        self.clock: Clock = seams.clock or RetryClock()
        self._url, self._api_key = url, api_key
        register_secret(api_key)
        # a transport given in the seams is the caller's to close; the default one is ours
        transport: Transport | None = seams.transport
        self._own_transport: AiohttpTransport | None = None
        if transport is None:
            transport = self._own_transport = AiohttpTransport(
                settings.timeout_s, max_reply_bytes=settings.max_reply_bytes
            )
        self.transport: Transport = transport
        self.shape = RequestShape()  # providers set the one their model calls for
        self._refused: JudgeRefusedRunError | None = None
        self._accepted = 0
        self._same_400: Counter[str] = Counter()
        self._paused_until = 0.0
        self._unreachable_since: float | None = None  # first connection error since a reply
        self._said_unreachable = False  # the outage's one line is out (until a reply comes)
        self._call_headers: dict[str, str] | None = None

    # -- provider hooks
    @abc.abstractmethod
    def _headers(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def _usage(self, data: dict[str, Any]) -> tuple[int, int] | None: ...

    def _learn(self, status: int, body: str, payload: dict[str, Any]) -> str | None:
        """Change `self.shape` after a rejection of the request's shape; describe the change."""
        return None

    def auth_headers(self) -> dict[str, str]:
        """The provider's auth and version headers, without the JSON content-type ones."""
        skip = {"content-type", "accept"}
        return {k: v for k, v in self._headers().items() if k.lower() not in skip}

    def call_headers(self) -> dict[str, str]:
        """The headers of every judge call: the same for the whole run, so built once."""
        if self._call_headers is None:
            self._call_headers = self._headers()
        return self._call_headers

    async def aclose(self) -> None:
        if self._own_transport is not None:
            await self._own_transport.aclose()

    # -- run-wide state
    def _unknown_usage(self) -> None:
        """A reply's token counts were not counts: count it, and say so once a run."""
        self.stats.usage_unknown += 1
        if self.stats.usage_unknown == 1:
            _log.warning(
                "%s: a reply gave token counts outside 0 to %s; the usage of such calls is "
                "unknown and counted as 0 tokens (usage_unknown in run.json)",
                self.model, f"{MAX_CALL_TOKENS:,}",
            )  # fmt: skip

    def _adapted(self, change: str) -> None:
        """Log a shape change once and record it for run.json and the summary."""
        if change not in self.stats.adaptations:
            _log.warning("%s: adapting for the rest of the run: %s", self.model, change)
        self.stats.adaptations[change] = self.stats.adaptations.get(change, 0) + 1

    def _rejects_everything(self, err: JudgeError) -> str | None:
        """The refusal when the server has rejected the same request shape too often to adapt
        (the refusals by status alone are `retry.run_refusal`'s)."""
        status = err.status
        if status in (400, 422) and err.cause == f"http_{status}" and not self._accepted:
            key = error_detail(err.body or str(err))
            self._same_400[key] += 1
            if self._same_400[key] >= _SAME_400_TO_REFUSE:
                return (f"the server rejects every request and ctxprec cannot adapt: {err}. "
                        "Fix: check [judge] settings (base_url, extra_headers, "
                        "structured_output) for this server")  # fmt: skip
        return None

    def _refuse(
        self, message: str, kind: type[JudgeRefusedRunError] = JudgeRefusedRunError
    ) -> JudgeRefusedRunError:
        if self._refused is None:
            self._refused = kind(redact(f"{self.model}: {message}"))
        return self._refused

    def _say_unreachable(self, err: JudgeError) -> None:
        """One line as soon as a call meets a judge nobody can reach (no connection at all),
        once per outage: where, that the run keeps retrying for the budget, and how to stop it
        or change that. A judge that never answered is stopped when the budget ends (exit 4,
        `JudgeUnreachableError`); one that answered before is waited for, call by call."""
        if self._said_unreachable:
            return
        self._said_unreachable = True
        budget = RetryPolicy.of(self.settings).retry_budget_s
        if self._accepted:
            what = (f"the judge at {self._url} stopped answering ({err}); each call keeps "
                    f"retrying for up to {budget:g} s (the retry budget)")  # fmt: skip
        else:
            what = (f"the judge at {self._url} cannot be reached ({err}); ctxprec keeps "
                    f"retrying until the retry budget of {budget:g} s ends, then stops "
                    "(exit 4)")  # fmt: skip
        line = (
            f"ctxprec: {printable(redact(what), lines=True)}. Ctrl-C stops the run now (finished "
            "parts are kept); --retry-budget SECONDS ([judge] retry_budget_s) changes how long it "
            "waits, --base-url ([judge] base_url) where it calls"
        )
        print(line, file=sys.stderr, flush=True)  # for people, whatever logging is set up
        _log.info("%s", line)

    def _unreachable_refusal(self, err: JudgeError) -> JudgeRefusedRunError:
        """The run's end when no call ever reached the judge within the retry budget."""
        budget = RetryPolicy.of(self.settings).retry_budget_s
        return self._refuse(
            f"no call reached the judge at {self._url} in {budget:g} s of retries ({err}). Fix: "
            "check the base URL (--base-url, [judge] base_url or the provider's base-URL "
            "variable) and that the server is up and reachable from this machine",
            JudgeUnreachableError,
        )

    async def _hold(self) -> None:
        """Wait out a run-wide pause (a Retry-After beyond retry.PAUSE_CEILING_S)."""
        wait = self._paused_until - self.clock.now()
        if wait > 0:
            await self.clock.sleep(wait)

    def _pause(self, seconds: float) -> None:
        until = self.clock.now() + seconds
        if until > self._paused_until + 1.0:
            shown = datetime.fromtimestamp(time.time() + seconds, UTC).strftime("%H:%M:%S")
            _log.warning(
                "%s: the server asks to wait %.0f s; pausing all judge calls until %s UTC",
                self.model, seconds, shown,
            )  # fmt: skip
            self.stats.pauses += 1
        self._paused_until = max(self._paused_until, until)

    # -- one POST with retries
    async def post_json(
        self,
        url: str,
        headers: Mapping[str, str],
        payload: dict[str, Any],
        est_tokens: int,
        rebuild: Callable[[], dict[str, Any]] | None = None,
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        """POST JSON, retrying what `classify` calls retryable; raise the last JudgeError.
        With `rebuild` (the payload from the current shape), a rejected shape is adapted to and
        sent again at once; a refusal of the whole run raises JudgeRefusedRunError."""
        started, attempts, retries, adaptations = self.clock.now(), 0, 0, 0
        while True:
            if self._refused is not None:
                raise self._refused
            if self._paused_until:  # a run-wide pause was set once: wait out what is left
                await self._hold()
            attempts += 1
            try:
                data, reply_headers = await self._attempt(url, headers, payload, est_tokens)
            except JudgeError as err:
                if self._refused is not None:
                    raise self._refused from err
                self.stats.errors_by_cause[err.cause] += 1
                if err.cause == "connection":
                    self._say_unreachable(err)
                refusal = run_refusal(err, self.key_env, self._url)
                if refusal is not None:
                    raise self._refuse(refusal) from err
                if rebuild is not None and adaptations < _MAX_ADAPTATIONS and err.status:
                    fresh = self._adapt(err, payload, rebuild)
                    if fresh != payload:
                        payload, adaptations = fresh, adaptations + 1
                        continue
                refusal = self._rejects_everything(err)
                if refusal is not None:
                    raise self._refuse(refusal) from err
                wait = self._wait_for(err, retries, started)
                if wait is None:
                    if err.cause == "connection" and not self._accepted:
                        raise self._unreachable_refusal(err) from err
                    self.stats.failures[err.cause] += 1
                    raise self._give_up(err, url, attempts) from err
            else:
                self._accepted += 1
                self._unreachable_since = None
                self._said_unreachable = False
                return data, reply_headers
            retries += 1
            self.stats.retries += 1
            _log.debug("retry %d of POST %s in %.2fs", retries, url, wait)
            await self.clock.sleep(wait)

    async def _attempt(
        self, url: str, headers: Mapping[str, str], payload: dict[str, Any], est_tokens: int
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        """One POST under a slot of the throttle: the reply's JSON object and headers, or the
        JudgeError its status, body or transport failure is classified as."""
        async with self.throttle.slot(est_tokens):
            if self._refused is not None:  # refused while this call waited for its slot
                raise self._refused
            self.stats.requests += 1
            reply = await self._send(url, headers, payload)
        if not 200 <= reply.status < 300:
            raise self._http_error(reply.status, reply.body, reply.headers)
        data = _json_object(reply.body)
        usage = self._usage(data)
        if usage is not None and UNKNOWN not in usage:  # (counts that are not: `json_count`)
            self.throttle.used_tokens(est_tokens, usage[0] + usage[1])
        return data, reply.headers

    async def _send(
        self, url: str, headers: Mapping[str, str], payload: dict[str, Any]
    ) -> HttpResponse:
        """The request through the transport; a transport failure raised as its JudgeError."""
        if _log.isEnabledFor(logging.DEBUG):  # not built for every call otherwise
            _log.debug("POST %s headers=%s", url, redacted_headers(headers))
        try:
            return await self.transport.send(HttpRequest("POST", url, headers, payload))
        except Exception as exc:
            err = classify_exception(exc)
            if err is None:
                raise
            _log.debug("POST %s: %s", url, err)
            raise err from exc

    def _adapt(
        self, err: JudgeError, payload: dict[str, Any], rebuild: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """The body to send instead of the rejected `payload`: built from the shape as another
        call already changed it, or after learning from this rejection (else `payload` itself)."""
        fresh = rebuild()
        if fresh == payload:
            change = self._learn(err.status or 0, err.body, payload)
            if change is not None:
                self._adapted(change)
                fresh = rebuild()
        return fresh

    def _wait_for(self, err: JudgeError, retries: int, started: float) -> float | None:
        """Seconds before the next attempt, or None when retrying cannot or may not happen."""
        policy, now = RetryPolicy.of(self.settings), self.clock.now()
        elapsed = now - started
        if err.cause == "connection":
            # how long nothing has answered, across calls: once that passes the budget, a call
            # meeting a dead judge fails at once instead of waiting the budget out again
            if self._unreachable_since is None:
                self._unreachable_since = now
            elapsed = max(elapsed, now - self._unreachable_since)
        if not policy.may_retry(err, retries, elapsed):
            wait = None
        elif (pause := policy.pauses_the_run(err)) is not None:
            self._pause(pause)
            return max(self._paused_until - self.clock.now(), 0.0)
        else:
            wait = policy.wait(err, retries, elapsed, rand=self.clock.rand)
        if wait is None and err.cause == "connection":  # gone for a whole budget: until it
            self._unreachable_since = -math.inf  # answers again, a call fails at its first error
        return wait

    def _give_up(self, err: JudgeError, url: str, attempts: int) -> JudgeError:
        limits = ""
        if isinstance(err, JudgeRetryableError):
            limits = f" ({RetryPolicy.of(self.settings).describe()})"
        message = f"{self.model}: POST {url} failed after {attempts} attempt(s){limits}: {err}"
        return _final_error(err, redact(message))

    def _http_error(self, status: int, body: str, headers: Mapping[str, str]) -> JudgeError:
        raw = classify(status, body, headers)
        err = _final_error(raw, redact(str(raw)))
        _log.debug("%s: %s (cause %s, retry_after=%s)", self.model, err, err.cause,
                   getattr(err, "retry_after", None))  # fmt: skip
        if status == 429 and isinstance(err, JudgeRetryableError):
            self.stats.rate_limited += 1
            self.throttle.rate_limited(err.retry_after)
        return err
