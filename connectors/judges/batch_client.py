"""What the provider batch clients share: the batch and result-line shapes the pipeline reads, the
limits of one batch, custom ids, one small retrying HTTP helper for the batch endpoints, and the
client skeleton (`ProviderBatches`: poll, cancel, list recent batches, close).

A client (`batch_openai.OpenAIBatches`, `batch_anthropic.AnthropicBatches`) turns request bodies
built by the online judge into batch lines, uploads them, polls, downloads and reads the result
lines back into reply bodies or errors. It never decides verdicts: the judge's own
`read_response` and the tolerant parser do, exactly as on the online path.
"""

from __future__ import annotations

import abc
import hashlib
import json
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import anyio

from connectors.judges.conversation import HttpJudgeBase
from connectors.judges.retry import backoff, classify, classify_exception
from connectors.judges.secrets import redact
from storage.core.errors import ConfigError, JudgeError, JudgeFatalError, JudgeRetryableError
from storage.core.settings import JudgeSettings

__all__ = [
    "CUSTOM_ID",
    "BatchClient",
    "BatchHttp",
    "BatchLimits",
    "LineResult",
    "ProviderBatches",
    "RemoteBatch",
    "custom_id_for",
    "json_line",
    "limits_from_env",
    "line_error",
]

CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_HTTP_ATTEMPTS = 6
_LIST_PAGES = 20


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """Lines and bytes of one batch (a provider's limits, or smaller ones for tests)."""

    max_lines: int
    max_bytes: int


def limits_from_env(default: BatchLimits) -> BatchLimits:
    """CTXPREC_BATCH_MAX_LINES / CTXPREC_BATCH_MAX_BYTES lower the provider's limits (never
    raise them): smaller batches finish sooner and let a test split a run."""
    lines, size = default.max_lines, default.max_bytes
    for var, current in (("CTXPREC_BATCH_MAX_LINES", lines), ("CTXPREC_BATCH_MAX_BYTES", size)):
        raw = os.environ.get(var, "").strip()
        if not raw:
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{var}={raw!r} must be a whole number") from None
        if value < 1:
            raise ConfigError(f"{var}={raw!r} must be at least 1")
        if var.endswith("LINES"):
            lines = min(current, value)
        else:
            size = min(current, value)
    return BatchLimits(lines, size)


def custom_id_for(keys: list[str]) -> str:
    """A batch line's id from the memo key(s) it answers: `k` + 60 hex digits of the item's key,
    or `r` + 60 hex digits over a row's keys (per-row mode). Always ≤ 64 characters."""
    if len(keys) == 1:
        digest = keys[0].removeprefix("v1-")
        return "k" + digest[:60]
    joined = hashlib.sha256("\n".join(keys).encode()).hexdigest()
    return "r" + joined[:60]


@dataclass(frozen=True, slots=True)
class RemoteBatch:
    """One batch as the provider reports it, in the provider's own status words."""

    id: str
    status: str
    ended: bool
    total: int
    answered: int  # lines with a result so far (0 until the end for Anthropic)
    created_at: float | None = None
    error: str | None = None  # why a batch failed as a whole, e.g. "token_limit_exceeded: ..."
    error_retryable: bool = False
    raw: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class LineResult:
    """One result line: the reply body, or the error (retryable or fatal) that replaced it."""

    custom_id: str
    body: dict[str, Any] | None
    error: JudgeError | None


class BatchClient(Protocol):
    provider: str
    limits: BatchLimits
    judge: HttpJudgeBase

    def line(self, custom_id: str, body: dict[str, Any]) -> bytes: ...

    async def submit(
        self, name: str, path: Path, lines: int, on_file: Callable[[str], None],
        file_id: str | None = None,
    ) -> RemoteBatch: ...  # fmt: skip

    async def find(self, name: str, file_id: str | None, since: float, lines: int,
                   claimed: set[str]) -> str | None: ...  # fmt: skip

    async def poll(self, batch_id: str) -> RemoteBatch: ...

    def results(self, batch: RemoteBatch) -> AsyncIterator[LineResult]: ...

    async def cancel(self, batch_id: str) -> RemoteBatch: ...

    async def aclose(self) -> None: ...


# ---------------------------------------------------------------- HTTP for the batch endpoints


class BatchHttp:
    """One aiohttp session; each request is retried on transport errors, 408/409/429 and 5xx
    (honouring Retry-After) and raises the classified JudgeError otherwise."""

    def __init__(self, headers: Mapping[str, str], timeout_s: float, where: str) -> None:
        self.headers, self.timeout_s, self.where = dict(headers), timeout_s, where
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    async def json(
        self,
        method: str,
        url: str,
        *,
        body: Any = None,
        data: Callable[[], Any] | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One JSON request; `data` builds a fresh body (e.g. multipart) for each attempt."""
        text = await self._request(method, url, body=body, data=data, params=params,
                                   headers=headers)  # fmt: skip
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise JudgeRetryableError(
                f"{method} {url}: the reply is not a JSON object: {text[:200]!r}", cause="garbage"
            )
        return parsed

    async def lines(
        self, url: str, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[bytes]:
        """GET a JSONL body and yield its non-empty lines (streamed, not held in memory)."""
        for attempt in range(1, _HTTP_ATTEMPTS + 1):
            try:
                sent = {**self.headers, **(headers or {})}
                async with self.session().get(url, headers=sent) as r:
                    if r.status >= 300:
                        body = (await r.read()).decode("utf-8", "replace")
                        raise classify(r.status, body, r.headers)
                    rest = b""  # split by hand: a long line is fine (no readline limit)
                    async for block in r.content.iter_chunked(1 << 20):
                        *done, rest = (rest + block).split(b"\n")
                        for raw in done:
                            if raw.strip():
                                yield raw
                    if rest.strip():
                        yield rest
                    return
            except JudgeError as err:
                if not self._again(err, attempt):
                    raise self._final(err, "GET", url) from err
                await anyio.sleep(backoff(attempt, 0.5, 30.0, getattr(err, "retry_after", None)))
            except Exception as exc:
                err2 = classify_exception(exc)
                if err2 is None:
                    raise
                if not self._again(err2, attempt):
                    raise self._final(err2, "GET", url) from exc
                await anyio.sleep(backoff(attempt, 0.5, 30.0))

    async def _request(
        self,
        method: str,
        url: str,
        *,
        body: Any,
        data: Callable[[], Any] | None,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str] | None,
    ) -> str:
        for attempt in range(1, _HTTP_ATTEMPTS + 1):
            try:
                kw: dict[str, Any] = {"headers": {**self.headers, **(headers or {})}}
                if params:
                    kw["params"] = dict(params)
                if data is not None:
                    kw["data"] = data()
                elif body is not None:
                    kw["json"] = body
                async with self.session().request(method, url, **kw) as r:
                    text = (await r.read()).decode("utf-8", "replace")
                    if r.status >= 300:
                        raise classify(r.status, text, r.headers)
                    return text
            except JudgeError as err:
                if not self._again(err, attempt):
                    raise self._final(err, method, url) from err
                await anyio.sleep(backoff(attempt, 0.5, 30.0, getattr(err, "retry_after", None)))
            except Exception as exc:
                err2 = classify_exception(exc)
                if err2 is None:
                    raise
                if not self._again(err2, attempt):
                    raise self._final(err2, method, url) from exc
                await anyio.sleep(backoff(attempt, 0.5, 30.0))
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _again(err: JudgeError, attempt: int) -> bool:
        return isinstance(err, JudgeRetryableError) and attempt < _HTTP_ATTEMPTS

    def _final(self, err: JudgeError, method: str, url: str) -> JudgeError:
        message = redact(f"{self.where}: {method} {url} failed: {err}")
        kind = JudgeRetryableError if isinstance(err, JudgeRetryableError) else JudgeFatalError
        return kind(message, cause=err.cause, status=err.status)


def line_error(status: int, body: Any) -> JudgeError:
    """A result line's HTTP error (status and error body inside the line), classified like an
    online reply with that status: 408/409/429/5xx retryable, other 4xx fatal."""
    text = body if isinstance(body, str) else json.dumps(body)
    return classify(status, str(text), {})


def json_line(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


# ---------------------------------------------------------------- the client skeleton


class ProviderBatches(abc.ABC):
    """What both provider clients do alike: the judge whose request bodies and reply reading
    they reuse, the retrying HTTP helper with the judge's auth headers, the batch limits, poll and
    cancel one batch, page through recent batches, close. Providers add the URLs and the shapes."""

    provider: str

    def __init__(self, judge: HttpJudgeBase, settings: JudgeSettings, limits: BatchLimits) -> None:
        self.judge = judge
        self.limits = limits_from_env(limits)
        self.http = BatchHttp(judge.auth_headers(), max(settings.timeout_s, 120.0), judge.model)

    @abc.abstractmethod
    def _batch_url(self, batch_id: str) -> str: ...

    @staticmethod
    @abc.abstractmethod
    def _remote(data: dict[str, Any]) -> RemoteBatch: ...

    async def poll(self, batch_id: str) -> RemoteBatch:
        return self._remote(await self.http.json("GET", self._batch_url(batch_id)))

    async def cancel(self, batch_id: str) -> RemoteBatch:
        return self._remote(await self.http.json("POST", f"{self._batch_url(batch_id)}/cancel"))

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.judge.aclose()

    async def _recent(
        self, url: str, cursor: str, since: float, created: Callable[[dict[str, Any]], float]
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The batches the provider lists at `url`, page by page (`cursor` names the paging
        parameter), until the pages run out or reach an hour before `since`; none from a server
        without the list endpoint. Read it inside `contextlib.aclosing` when stopping early."""
        after: str | None = None
        for _ in range(_LIST_PAGES):
            params = {"limit": "100", **({cursor: after} if after else {})}
            try:
                page = await self.http.json("GET", url, params=params)
            except JudgeFatalError as err:
                if err.status not in (404, 405):
                    raise
                return  # a server without the list endpoint: nothing to look up
            data = page.get("data") or []
            for batch in data:
                yield batch
            oldest = min((created(b) for b in data), default=0.0)
            if not page.get("has_more") or not data or oldest < since - 3600:
                return
            after = str(page.get("last_id") or data[-1].get("id"))
