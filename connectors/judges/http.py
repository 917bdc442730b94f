"""Shared machinery of the HTTP judges: one aiohttp session, the attempt/retry loop, the
parse-and-re-ask judge template, and key redaction in logs. The failure policy (retryable vs
fatal, waits) lives in `connectors.judges.retry`; providers only add request/reply shapes.
"""

from __future__ import annotations

import abc
import asyncio
import ipaddress
import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp

from connectors.judges import prompts
from connectors.judges.base import Gate, ItemRequest, JudgeSettings, JudgeStats, estimate_tokens
from connectors.judges.parse import parse_row_verdicts, parse_verdict
from connectors.judges.retry import (
    RetryClock,
    backoff,
    classify,
    classify_exception,
    clock,
    error_detail,
    parse_retry_after,
    set_testing,
)
from connectors.judges.shapes import BUDGET_CAP, RequestShape
from storage.core.errors import (
    ConfigError,
    JudgeError,
    JudgeFatalError,
    JudgeParseError,
    JudgeRefusedRunError,
    JudgeRetryableError,
)
from storage.core.verdict import JudgeReply

__all__ = [
    "HttpJudgeBase",
    "Message",
    "RedactingFilter",
    "RetryClock",
    "Schema",
    "api_key_from_env",
    "backoff",
    "classify",
    "classify_exception",
    "is_loopback",
    "json_int",
    "normalize_base_url",
    "parse_retry_after",
    "redact",
    "register_secret",
    "set_testing",
]

T = TypeVar("T")
Message = dict[str, str]
Schema = tuple[str, dict[str, object]]

_log = logging.getLogger("ctxprec.http")
REDACTED = "***"

# ---------------------------------------------------------------- secrets never reach a log

_SECRETS: set[str] = set()
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key"})
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"(?i)((?:proxy-)?authorization|x-api-key|api-key)(['\"]?\s*[:=]\s*['\"]?)"
            r"(?:bearer\s+)?[^'\",\s}]+"
        ),
        r"\1\2" + REDACTED,
    ),
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]{6,}"), "Bearer " + REDACTED),
    (re.compile(r"\b(?:sk|rk|pk)-[A-Za-z0-9_\-]{8,}"), REDACTED),
)


def register_secret(value: str | None) -> None:
    """Remember a key's exact value so `redact` removes it wherever it shows up."""
    if value and len(value) >= 4:
        _SECRETS.add(value)


def redact(text: str) -> str:
    """Remove known keys, auth header values and key-shaped tokens (sk-...) from text."""
    for secret in tuple(_SECRETS):  # a copy: another thread may register a key meanwhile
        text = text.replace(secret, REDACTED)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites each record's message (and traceback text) through `redact`."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            record.msg, record.args = redact(record.getMessage()), None
        except (TypeError, ValueError):  # a malformed log call: let the handler report it
            return True
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


def _install_redaction() -> None:
    # A logger's filters only see records logged on that very logger, not its children's,
    # so the filter goes on "ctxprec" (the brief) and on "ctxprec.http" (where we log).
    for name in ("ctxprec", "ctxprec.http"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())


_install_redaction()

# ---------------------------------------------------------------- endpoints and keys


def normalize_base_url(url: str) -> str:
    return url.strip().rstrip("/")


def is_loopback(url: str) -> bool:
    """True for localhost / 127.x / ::1 base URLs (local vLLM, Ollama: no key needed)."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key_from_env(env_name: str, base_url: str, model: str) -> str | None:
    """The key from `env_name`; missing is a ConfigError unless the server is on loopback."""
    key = os.environ.get(env_name, "").strip() or None
    if key is None and not is_loopback(base_url):
        raise ConfigError(
            f"judge {model} needs an API key: set the environment variable {env_name} "
            "(or name another one with [judge] api_key_env); servers on localhost need none"
        )
    register_secret(key)
    return key


def _json_object(body: str) -> dict[str, Any]:
    # A 200 whose body is not a JSON object is a transport/proxy glitch (HTML error page,
    # truncated body), not a model decision: retry it like a 5xx instead of re-asking.
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
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


def json_int(value: Any) -> int:
    """An integer field of a provider's JSON (usage, counts); 0 when absent, null or not an int."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _split(total: int, parts: int) -> list[int]:
    """Split a token count evenly; the first items take the remainder, so the sum is exact."""
    share, rest = divmod(total, parts)
    return [share + (1 if i < rest else 0) for i in range(parts)]


_REASK_ITEM = 'Reply with JSON only: {"relevant": true|false, "reason": "..."}'
_REASK_ROW = (
    'Reply with JSON only: {"verdicts": [{"index": 0, "relevant": true|false, '
    '"reason": "..."}, ...]} with one verdict per item, in order.'
)
_REASON_SYSTEM = "You explain retrieval evaluation results to engineers, concisely and plainly."

_FRESH_CONVERSATIONS = 1
_MAX_ADAPTATIONS = 8  # shape changes one call may go through (each is shared by the run)
_MAX_BUMPS = 3  # budget raises one call may go through (x4 each, up to shapes.BUDGET_CAP)
PAUSE_CEILING_S = 120.0  # a longer Retry-After pauses the whole run, with a line saying so
_SAME_400_TO_REFUSE = 3  # the same rejected request this often, and nothing accepted: stop
Row = tuple[str, str | None, Sequence[str]]


class _Unreadable(Exception):
    """A conversation whose reply stayed unreadable after its re-ask."""

    def __init__(self, error: JudgeParseError, tokens_in: int, tokens_out: int):
        super().__init__(str(error))
        self.error, self.tokens_in, self.tokens_out = error, tokens_in, tokens_out


class _Reply:
    """One completed call: the reply text, how it ended, what it cost, the budget it had."""

    __slots__ = ("factor", "finish", "text", "tokens_in", "tokens_out")

    def __init__(self, text: str, finish: str, tokens_in: int, tokens_out: int, factor: int):
        self.text, self.finish, self.factor = text, finish, factor
        self.tokens_in, self.tokens_out = tokens_in, tokens_out


class HttpJudgeBase(abc.ABC):
    """One shared aiohttp session and the attempt/retry loop; providers give the shapes.

    Run-wide state lives here, shared by every concurrent call: the request `shape` (what the
    server accepts, learned once), the refusal that stops the run, and a long server pause."""

    provider = "http"
    model: str
    key_env = "API_KEY"
    shape: RequestShape

    def __init__(
        self,
        settings: JudgeSettings,
        gate: Gate,
        stats: JudgeStats,
        *,
        url: str,
        api_key: str | None,
    ) -> None:
        self.settings, self.gate, self.stats = settings, gate, stats
        self._url, self._api_key = url, api_key
        register_secret(api_key)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.shape = RequestShape()  # providers set the one their model calls for
        self._refused: JudgeRefusedRunError | None = None
        self._accepted = 0
        self._same_400: Counter[str] = Counter()
        self._paused_until = 0.0

    # -- provider hooks
    @abc.abstractmethod
    def identity(self) -> dict[str, object]: ...

    @abc.abstractmethod
    def _headers(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def _payload(
        self, system: str, messages: list[Message], schema: Schema | None, max_tokens: int
    ) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _text(self, data: dict[str, Any]) -> str: ...

    @abc.abstractmethod
    def _usage(self, data: dict[str, Any]) -> tuple[int, int] | None: ...

    def _cached(self, data: dict[str, Any]) -> int:
        """Prompt tokens served from the provider's cache (a part of `_usage`'s input)."""
        return 0

    def _finish(self, data: dict[str, Any]) -> str:
        """How the reply ended: stop, length (cut off by the budget), refused, filtered."""
        return "stop"

    def _learn(self, status: int, body: str, payload: dict[str, Any]) -> str | None:
        """Change `self.shape` after a rejection of the request's shape; describe the change."""
        return None

    # -- what a batch API needs: the same request bodies, the same reading of replies
    def build_payload(self, request: ItemRequest | None = None, *, row: Row | None = None
                      ) -> dict[str, Any]:  # fmt: skip
        """The request body this judge sends for one item (or, with `row`, one row's items)."""
        if request is not None:
            system, user = prompts.item_messages(request)
            schema: Schema = ("verdict", prompts.ITEM_SCHEMA)
            budget = self.settings.max_output_tokens
        elif row is not None:
            system, user = prompts.row_messages(*row)
            schema = ("verdicts", prompts.ROW_SCHEMA)
            budget = self.settings.max_output_tokens * len(row[2])
        else:
            raise ValueError("build_payload needs an ItemRequest or a row")
        messages = [{"role": "user", "content": user}]
        return self._payload(system, messages, schema, self.shape.budget(budget))

    def read_response(self, data: dict[str, Any], n_items: int | None = None) -> list[JudgeReply]:
        """Verdicts from a reply body (n_items None: one item; else a row of n_items), with its
        usage split evenly. Raises JudgeError: refused, filtered, truncated or unparseable."""
        text, finish = self._text(data), self._finish(data)
        tokens_in, tokens_out = self._usage(data) or (0, 0)
        self._check_finish(finish)
        try:
            if n_items is None:
                return [JudgeReply(parse_verdict(text), tokens_in, tokens_out)]
            verdicts = parse_row_verdicts(text, n_items)
        except JudgeParseError as err:
            cause = "truncated" if finish == "length" else "unparseable"
            raise JudgeParseError(f"{self.model}: {err}", cause=cause) from err
        pairs = zip(verdicts, _split(tokens_in, n_items), _split(tokens_out, n_items), strict=True)
        return [JudgeReply(v, i, o) for v, i, o in pairs]

    def sent_shape(self) -> dict[str, object]:
        """What this run sends (after any adaptation), for run.json and the summary."""
        return self.shape.describe()

    def adapt_payload(self, err: JudgeError, payload: dict[str, Any]) -> dict[str, Any] | None:
        """A body to send again after `payload` was rejected for its shape (a batch line's
        4xx), learned for the rest of the run as online; None when it is not about the shape."""
        if not err.status or self._learn(err.status, err.body, payload) is None:
            return None
        fresh = self._reshape(payload)
        return None if fresh == payload else fresh

    def _reshape(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The same conversation as `payload`, built again with the current shape."""
        return payload

    def auth_headers(self) -> dict[str, str]:
        """The provider's auth and version headers, without the JSON content-type ones."""
        skip = {"content-type", "accept"}
        return {k: v for k, v in self._headers().items() if k.lower() not in skip}

    # -- session
    def _session_now(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0, ttl_dns_cache=300)
            timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
            self._loop = loop
        return self._session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    # -- run-wide state
    def _adapted(self, change: str) -> None:
        """Log a shape change once and record it for run.json and the summary."""
        if change not in self.stats.adaptations:
            _log.warning("%s: adapting for the rest of the run: %s", self.model, change)
        self.stats.adaptations[change] = self.stats.adaptations.get(change, 0) + 1

    def _refusal(self, err: JudgeError) -> str | None:
        """The message (cause and fix) when `err` means no call of this run can succeed."""
        status, env = err.status, self.key_env
        if err.cause == "quota_exhausted":
            return (f"the account is out of quota or credit: {err}. Fix: add credit or raise the "
                    f"spend limit of the account behind ${env} (or use another key)")  # fmt: skip
        if status == 401:
            return f"the API key was refused ({err}). Fix: put a valid key in ${env}"
        if status == 403:
            return (f"this key may not use the model: {err}. Fix: use a key or project with "
                    "access to it, or another --model")  # fmt: skip
        if status == 404:
            return (f"unknown model or wrong endpoint: {err}. Fix: check --model and the base "
                    f"URL ({self._url})")  # fmt: skip
        if status in (400, 422) and err.cause == f"http_{status}" and not self._accepted:
            key = error_detail(err.body or str(err))
            self._same_400[key] += 1
            if self._same_400[key] >= _SAME_400_TO_REFUSE:
                return (f"the server rejects every request and ctxprec cannot adapt: {err}. "
                        "Fix: check [judge] settings (base_url, extra_headers, "
                        "structured_output) for this server")  # fmt: skip
        return None

    def _refuse(self, message: str) -> JudgeRefusedRunError:
        if self._refused is None:
            self._refused = JudgeRefusedRunError(redact(f"{self.model}: {message}"))
        return self._refused

    async def _hold(self) -> None:
        """Wait out a run-wide pause (a Retry-After beyond PAUSE_CEILING_S)."""
        wait = self._paused_until - clock().now()
        if wait > 0:
            await clock().sleep(wait)

    def _pause(self, seconds: float) -> None:
        until = clock().now() + seconds
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
        started, attempts, retries, adaptations = clock().now(), 0, 0, 0
        while True:
            if self._refused is not None:
                raise self._refused
            await self._hold()
            attempts += 1
            try:
                data, reply_headers = await self._attempt(url, headers, payload, est_tokens)
            except JudgeError as err:
                if self._refused is not None:
                    raise self._refused from err
                self.stats.errors_by_cause[err.cause] += 1
                if err.status in (401, 403, 404) or err.cause == "quota_exhausted":
                    raise self._refuse(self._refusal(err) or str(err)) from err
                if rebuild is not None and adaptations < _MAX_ADAPTATIONS and err.status:
                    fresh = rebuild()
                    if fresh == payload:
                        change = self._learn(err.status, err.body, payload)
                        if change is not None:
                            self._adapted(change)
                            fresh = rebuild()
                    if fresh != payload:
                        payload, adaptations = fresh, adaptations + 1
                        continue
                refusal = self._refusal(err)
                if refusal is not None:
                    raise self._refuse(refusal) from err
                wait = self._wait_for(err, retries, started)
                if wait is None:
                    self.stats.failures[err.cause] += 1
                    raise self._give_up(err, url, attempts) from err
            else:
                self._accepted += 1
                return data, reply_headers
            retries += 1
            self.stats.retries += 1
            _log.debug("retry %d of POST %s in %.2fs", retries, url, wait)
            await clock().sleep(wait)

    def _wait_for(self, err: JudgeError, retries: int, started: float) -> float | None:
        """Seconds before the next attempt, or None when retrying cannot or may not happen.
        A server-asked wait beyond PAUSE_CEILING_S pauses every call and is not counted
        against the retry budget (it is the server's schedule, not a flaky call)."""
        s = self.settings
        if not isinstance(err, JudgeRetryableError) or retries >= s.max_retries:
            return None
        if err.retry_after is not None and err.retry_after > PAUSE_CEILING_S:
            self._pause(err.retry_after)
            return max(self._paused_until - clock().now(), 0.0)
        wait = backoff(retries + 1, s.backoff_base_s, s.backoff_max_s, err.retry_after)
        if clock().now() - started + wait > s.retry_budget_s:
            return None
        return wait

    def _give_up(self, err: JudgeError, url: str, attempts: int) -> JudgeError:
        s = self.settings
        limits = (
            f" (max_retries={s.max_retries}, retry_budget_s={s.retry_budget_s:g})"
            if isinstance(err, JudgeRetryableError)
            else ""
        )
        message = f"{self.model}: POST {url} failed after {attempts} attempt(s){limits}: {err}"
        return _final_error(err, redact(message))

    async def _attempt(
        self, url: str, headers: Mapping[str, str], payload: dict[str, Any], est_tokens: int
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        async with self.gate.slot(est_tokens):
            if self._refused is not None:  # refused while this call waited for its slot
                raise self._refused
            self.stats.requests += 1
            status, body, reply_headers = await self._send(url, headers, payload)
        if not 200 <= status < 300:
            raise self._http_error(status, body, reply_headers)
        data = _json_object(body)
        usage = self._usage(data)
        if usage is not None:
            self.gate.used_tokens(est_tokens, sum(usage))
        return data, reply_headers

    async def _send(
        self, url: str, headers: Mapping[str, str], payload: dict[str, Any]
    ) -> tuple[int, str, Mapping[str, str]]:
        shown = {k: REDACTED if k.lower() in _SECRET_HEADERS else v for k, v in headers.items()}
        _log.debug("POST %s headers=%s", url, shown)
        try:
            async with self._session_now().post(url, json=payload, headers=headers) as resp:
                raw = await resp.read()
                return resp.status, raw.decode("utf-8", "replace"), resp.headers
        except Exception as exc:
            err = classify_exception(exc)
            if err is None:
                raise
            _log.debug("POST %s: %s", url, err)
            raise err from exc

    def _http_error(self, status: int, body: str, headers: Mapping[str, str]) -> JudgeError:
        raw = classify(status, body, headers)
        err = _final_error(raw, redact(str(raw)))
        _log.debug("%s: %s (cause %s, retry_after=%s)", self.model, err, err.cause,
                   getattr(err, "retry_after", None))  # fmt: skip
        if status == 429 and isinstance(err, JudgeRetryableError):
            self.stats.rate_limited += 1
            self.gate.rate_limited(err.retry_after)
        return err

    # -- the judge: complete, parse, raise the budget when cut off, re-ask once
    async def _complete(
        self, system: str, messages: list[Message], schema: Schema | None, max_tokens: int
    ) -> _Reply:
        factor = self.shape.budget_factor
        budget = self.shape.budget(max_tokens)

        def build() -> dict[str, Any]:
            return self._payload(system, messages, schema, self.shape.budget(max_tokens))

        est = estimate_tokens(system, *(m["content"] for m in messages)) + budget
        data, _ = await self.post_json(self._url, self._headers(), build(), est, build)
        tokens_in, tokens_out = self._usage(data) or (0, 0)
        self.stats.input_tokens += tokens_in
        self.stats.output_tokens += tokens_out
        self.stats.cached_input_tokens += self._cached(data)
        return _Reply(self._text(data), self._finish(data), tokens_in, tokens_out, factor)

    def _check_finish(self, finish: str) -> None:
        if finish == "refused":
            self.stats.failures["refused"] += 1
            raise JudgeFatalError(f"{self.model}: the model refused to judge this item",
                                  cause="refused")  # fmt: skip
        if finish == "filtered":
            self.stats.failures["filtered"] += 1
            raise JudgeFatalError(f"{self.model}: the provider's content filter stopped the reply",
                                  cause="filtered")  # fmt: skip

    def _bump_budget(self, factor: int, max_tokens: int) -> bool:
        """A reply cut off by the budget: raise the run's budget (x4, bounded); False at the cap."""
        shape = self.shape
        if shape.budget_factor > factor:  # another call raised it meanwhile
            return True
        if shape.budget(max_tokens) >= BUDGET_CAP:
            return False
        shape.budget_factor *= 4
        self._adapted(f"completion budget x{shape.budget_factor} (replies were cut off)")
        return True

    async def _call_parsed(
        self, system: str, messages: list[Message], schema: Schema, parse: Callable[[str], T],
        max_tokens: int,
    ) -> tuple[T | JudgeParseError, str, int, int]:  # fmt: skip
        """One call, read; a reply cut off by its budget is asked again with a larger budget
        (not re-asked: the model did nothing wrong). Refusals and filters raise."""
        spent_in = spent_out = 0
        for _ in range(1 + _MAX_BUMPS):
            reply = await self._complete(system, messages, schema, max_tokens)
            spent_in, spent_out = spent_in + reply.tokens_in, spent_out + reply.tokens_out
            self._check_finish(reply.finish)
            try:
                return parse(reply.text), reply.text, spent_in, spent_out
            except JudgeParseError as err:
                if reply.finish != "length" or not self._bump_budget(reply.factor, max_tokens):
                    cause = "truncated" if reply.finish == "length" else err.cause
                    return JudgeParseError(str(err), cause=cause), reply.text, spent_in, spent_out
                self.stats.retries += 1
        return JudgeParseError("reply cut off", cause="truncated"), "", spent_in, spent_out

    async def _ask(
        self, system: str, user: str, schema: Schema, parse: Callable[[str], T], reask: str,
        max_tokens: int,
    ) -> tuple[T, int, int]:  # fmt: skip
        """A conversation: one call, and on an unreadable reply one re-ask showing the model its
        reply. A conversation that stays unreadable is started afresh once (a transient garbage
        reply twice in a row is not a broken model), then the item fails as `unparseable`."""
        spent_in = spent_out = 0
        for fresh in range(1 + _FRESH_CONVERSATIONS):
            if fresh:
                self.stats.retries += 1
            try:
                value, t_in, t_out = await self._conversation(
                    system, user, schema, parse, reask, max_tokens
                )
            except _Unreadable as bad:
                spent_in, spent_out = spent_in + bad.tokens_in, spent_out + bad.tokens_out
                error = bad.error
                if error.cause == "truncated":
                    break
                continue
            return value, spent_in + t_in, spent_out + t_out
        self.stats.failures[error.cause] += 1
        raise error

    async def _conversation(
        self, system: str, user: str, schema: Schema, parse: Callable[[str], T], reask: str,
        max_tokens: int,
    ) -> tuple[T, int, int]:  # fmt: skip
        messages = [{"role": "user", "content": user}]
        first, text, tokens_in, tokens_out = await self._call_parsed(
            system, messages, schema, parse, max_tokens
        )
        if not isinstance(first, JudgeParseError):
            return first, tokens_in, tokens_out
        if first.cause == "truncated":
            message = f"{self.model}: reply cut off at the largest completion budget ({first})"
            error = JudgeParseError(redact(message), cause="truncated")
            raise _Unreadable(error, tokens_in, tokens_out)
        self.stats.reasks += 1
        messages += [
            {"role": "assistant", "content": text.strip() or "(empty reply)"},
            {"role": "user", "content": reask},
        ]
        again, text2, more_in, more_out = await self._call_parsed(
            system, messages, schema, parse, max_tokens
        )
        if not isinstance(again, JudgeParseError):
            return again, tokens_in + more_in, tokens_out + more_out
        clip = " ".join(text2.split())[:200]
        message = f"{self.model}: reply unreadable after one re-ask ({again}); reply: {clip!r}"
        error = JudgeParseError(redact(message), cause=again.cause)
        raise _Unreadable(error, tokens_in + more_in, tokens_out + more_out)

    async def judge_item(self, request: ItemRequest) -> JudgeReply:
        system, user = prompts.item_messages(request)
        verdict, tokens_in, tokens_out = await self._ask(
            system, user, ("verdict", prompts.ITEM_SCHEMA), parse_verdict, _REASK_ITEM,
            self.settings.max_output_tokens,
        )  # fmt: skip
        return JudgeReply(verdict, tokens_in, tokens_out)

    async def judge_row(
        self, query: str, expected: str | None, items: Sequence[str]
    ) -> list[JudgeReply]:
        """All items in one call; output budget max_output_tokens per item; usage split evenly."""
        if not items:
            return []
        n = len(items)
        system, user = prompts.row_messages(query, expected, items)
        verdicts, tokens_in, tokens_out = await self._ask(
            system, user, ("verdicts", prompts.ROW_SCHEMA),
            lambda text: parse_row_verdicts(text, n), _REASK_ROW,
            self.settings.max_output_tokens * n,
        )  # fmt: skip
        pairs = zip(verdicts, _split(tokens_in, n), _split(tokens_out, n), strict=True)
        return [JudgeReply(v, i, o) for v, i, o in pairs]

    async def write_reason(self, prompt: str) -> str:
        messages = [{"role": "user", "content": prompt}]
        reply = await self._complete(
            _REASON_SYSTEM, messages, None, self.settings.max_output_tokens
        )
        if not reply.text.strip():
            raise JudgeParseError(f"{self.model}: empty reply to the reason prompt", cause="empty")
        return reply.text.strip()
