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
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp

from connectors.judges import prompts
from connectors.judges.base import (
    Gate,
    ItemRequest,
    JudgeReply,
    JudgeSettings,
    JudgeStats,
    estimate_tokens,
)
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
from pipeline.errors import ConfigError, JudgeError, JudgeParseError, JudgeRetryableError

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
        return JudgeRetryableError(
            message, cause=err.cause, status=err.status, retry_after=err.retry_after
        )
    return type(err)(message, cause=err.cause, status=err.status)


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


class _Unreadable(Exception):
    """A conversation whose reply stayed unreadable after its re-ask."""

    def __init__(self, error: JudgeParseError, tokens_in: int, tokens_out: int):
        super().__init__(str(error))
        self.error, self.tokens_in, self.tokens_out = error, tokens_in, tokens_out


class HttpJudgeBase(abc.ABC):
    """One shared aiohttp session and the attempt/retry loop; providers give the shapes."""

    provider = "http"
    model: str

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

    def _recover(self, err: JudgeError, payload: dict[str, Any]) -> dict[str, Any] | None:
        """A changed payload to retry a fatal error with (e.g. without response_format)."""
        return None

    # -- public wrappers for other transports (provider batch APIs send the same bodies)
    def build_payload(
        self, system: str, messages: list[Message], schema: Schema | None, max_tokens: int
    ) -> dict[str, Any]:
        """The request body the online path would POST for this conversation."""
        return self._payload(system, messages, schema, max_tokens)

    def read_response(self, data: dict[str, Any]) -> tuple[str, int, int]:
        """(reply text, input tokens, output tokens) of a reply body, read as online."""
        tokens_in, tokens_out = self._usage(data) or (0, 0)
        return self._text(data), tokens_in, tokens_out

    def adapt_payload(self, err: JudgeError, payload: dict[str, Any]) -> dict[str, Any] | None:
        """A changed body to send again after a rejected one (None: nothing to adapt)."""
        return self._recover(err, payload)

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

    # -- one POST with retries
    async def post_json(
        self, url: str, headers: Mapping[str, str], payload: dict[str, Any], est_tokens: int
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        """POST JSON, retrying what `classify` calls retryable; raise the last JudgeError."""
        started, attempts, retries = clock().now(), 0, 0
        while True:
            attempts += 1
            try:
                return await self._attempt(url, headers, payload, est_tokens)
            except JudgeError as err:
                self.stats.errors_by_cause[err.cause] += 1
                changed = self._recover(err, payload)
                if changed is not None:
                    payload = changed
                    continue
                wait = self._wait_for(err, retries, started)
                if wait is None:
                    self.stats.failures[err.cause] += 1
                    raise self._give_up(err, url, attempts) from err
            retries += 1
            self.stats.retries += 1
            _log.debug("retry %d of POST %s in %.2fs", retries, url, wait)
            await clock().sleep(wait)

    def _wait_for(self, err: JudgeError, retries: int, started: float) -> float | None:
        """Seconds before the next attempt, or None when retrying cannot or may not happen."""
        s = self.settings
        if not isinstance(err, JudgeRetryableError) or retries >= s.max_retries:
            return None
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

    # -- the judge: complete, parse, re-ask once
    async def _complete(
        self, system: str, messages: list[Message], schema: Schema | None, max_tokens: int
    ) -> tuple[str, int, int]:
        payload = self._payload(system, messages, schema, max_tokens)
        est = estimate_tokens(system, *(m["content"] for m in messages)) + max_tokens
        data, _ = await self.post_json(self._url, self._headers(), payload, est)
        tokens_in, tokens_out = self._usage(data) or (0, 0)
        self.stats.input_tokens += tokens_in
        self.stats.output_tokens += tokens_out
        return self._text(data), tokens_in, tokens_out

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
                continue
            return value, spent_in + t_in, spent_out + t_out
        self.stats.failures["unparseable"] += 1
        raise error

    async def _conversation(
        self, system: str, user: str, schema: Schema, parse: Callable[[str], T], reask: str,
        max_tokens: int,
    ) -> tuple[T, int, int]:  # fmt: skip
        messages = [{"role": "user", "content": user}]
        text, tokens_in, tokens_out = await self._complete(system, messages, schema, max_tokens)
        try:
            return parse(text), tokens_in, tokens_out
        except JudgeParseError:
            self.stats.reasks += 1
        messages += [
            {"role": "assistant", "content": text.strip() or "(empty reply)"},
            {"role": "user", "content": reask},
        ]
        again, more_in, more_out = await self._complete(system, messages, schema, max_tokens)
        try:
            return parse(again), tokens_in + more_in, tokens_out + more_out
        except JudgeParseError as err:
            clip = " ".join(again.split())[:200]
            message = f"{self.model}: reply unreadable after one re-ask ({err}); reply: {clip!r}"
            error = JudgeParseError(redact(message), cause="unparseable")
            raise _Unreadable(error, tokens_in + more_in, tokens_out + more_out) from err

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
        text, _, _ = await self._complete(
            _REASON_SYSTEM, messages, None, self.settings.max_output_tokens
        )
        if not text.strip():
            raise JudgeParseError(f"{self.model}: empty reply to the reason prompt", cause="empty")
        return text.strip()
