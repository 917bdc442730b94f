"""What the provider batch clients share: the batch and result-line shapes the pipeline reads, the
limits of one batch, custom ids, the batch endpoints' requests (`BatchHttp`: the online judge's
transport protocol, retry policy and clock), and the client skeleton (`ProviderBatches`: poll,
cancel, list recent batches, close).

A client (`batch_openai.OpenAIBatches`, `batch_anthropic.AnthropicBatches`) turns request bodies
built by the online judge into batch lines, uploads them, polls, downloads and reads the result
lines back into reply bodies or errors. It never decides verdicts: the judge's own
`read_response` and the tolerant parser do, exactly as on the online path.
"""

from __future__ import annotations

import abc
import hashlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

from ctxprec.connectors.judges import jsonfast
from ctxprec.connectors.judges.conversation import HttpJudgeBase
from ctxprec.connectors.judges.retry import RetryPolicy, classify, classify_exception
from ctxprec.connectors.judges.secrets import redact
from ctxprec.connectors.judges.transport import AiohttpTransport, HttpRequest, StreamingTransport
from ctxprec.storage.core.errors import JudgeError, JudgeFatalError, JudgeRetryableError
from ctxprec.storage.core.seams import Clock
from ctxprec.storage.core.settings import JudgeSettings

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
    "limits_for",
    "line_error",
]

BATCH_REPLY_BYTES = 64 << 20  # a batch API's JSON reply (status, file metadata), not results
RESULT_LINE_BYTES = 64 << 20  # one line of a results file: one judge reply and its envelope
_ERROR_BODY_BYTES = 64 << 10  # what is read of an error reply to a results download

CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MIN_READ_TIMEOUT_S = 120.0  # a batch upload or download may wait this long for each read
_LIST_PAGES = 20


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """Lines and bytes of one batch (a provider's limits, or smaller ones from the settings)."""

    max_lines: int
    max_bytes: int


def limits_for(provider: BatchLimits, settings: JudgeSettings) -> BatchLimits:
    """The provider's limits, lowered (never raised) by [judge] batch_max_lines and
    batch_max_bytes: smaller batches finish sooner."""
    lines, size = provider.max_lines, provider.max_bytes
    if settings.batch_max_lines is not None:
        lines = min(lines, settings.batch_max_lines)
    if settings.batch_max_bytes is not None:
        size = min(size, settings.batch_max_bytes)
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


async def _head(blocks: AsyncIterator[bytes], limit: int) -> bytes:
    """The first `limit` bytes of a streamed body; the rest is not read."""
    head = b""
    async for block in blocks:
        head += block[: limit - len(head)]
        if len(head) >= limit:
            break
    return head


class BatchHttp:
    """The batch endpoints' requests, through the same transport protocol, retry policy
    (`retry.RetryPolicy`: the judge's max_retries, retry_budget_s and backoff) and clock as the
    online judge's calls: each request is retried on transport errors, 408/409/429 and 5xx
    (honouring Retry-After) and raises the classified JudgeError otherwise."""

    def __init__(
        self,
        headers: Mapping[str, str],
        where: str,
        transport: StreamingTransport,
        policy: RetryPolicy,
        clock: Clock,
    ) -> None:
        self.headers, self.where = dict(headers), where
        self.transport, self.policy, self.clock = transport, policy, clock

    async def json(
        self,
        method: str,
        url: str,
        *,
        body: dict[str, Any] | None = None,
        content: Callable[[], tuple[bytes, str]] | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One request answered by a JSON object: a JSON `body`, or `content` building the body's
        bytes and content type (e.g. a multipart form) for each attempt, or no body."""
        if params:
            url = f"{url}{'&' if '?' in url else '?'}{urlencode(dict(params))}"
        started, retries = self.clock.now(), 0
        while True:
            sent = {**self.headers, **(headers or {})}
            if content is not None:
                data, kind = content()
                request = HttpRequest(method, url, {**sent, "content-type": kind}, content=data)
            elif body is not None:
                request = HttpRequest(method, url, sent, body)
            else:
                request = HttpRequest(method, url, sent, content=b"")
            try:
                reply = await self.transport.send(request)
                if reply.status >= 300:
                    raise classify(reply.status, reply.body, reply.headers)
                break
            except Exception as exc:
                wait = self._wait_or_raise(exc, method, url, retries, started)
            retries += 1
            await self.clock.sleep(wait)
        try:
            parsed = jsonfast.loads(reply.body)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise JudgeRetryableError(
                f"{method} {url}: the reply is not a JSON object: {reply.body[:200]!r}",
                cause="garbage",
            )
        return parsed

    async def lines(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        max_line_bytes: int = RESULT_LINE_BYTES,
    ) -> AsyncIterator[bytes]:
        """GET a JSONL body and yield its non-empty lines (streamed, not held in memory). A line
        longer than `max_line_bytes` fails the download (cause reply_too_large)."""
        request = HttpRequest("GET", url, {**self.headers, **(headers or {})}, content=b"")
        started, retries = self.clock.now(), 0
        while True:
            try:
                async with self.transport.stream(request) as reply:
                    if reply.status >= 300:
                        raw = await _head(reply.blocks, _ERROR_BODY_BYTES)
                        raise classify(reply.status, raw.decode("utf-8", "replace"), reply.headers)
                    pieces: list[bytes] = []  # of the line not ended yet: joined once, at its end
                    size = 0
                    async for block in reply.blocks:
                        start = 0
                        while (end := block.find(b"\n", start)) >= 0:
                            pieces.append(block[start:end])
                            line, pieces, size = b"".join(pieces), [], 0
                            if line.strip():
                                yield line
                            start = end + 1
                        if start < len(block):
                            pieces.append(block[start:])
                            size += len(block) - start
                        if size > max_line_bytes:
                            raise JudgeFatalError(
                                f"a results line over {max_line_bytes:,} bytes; not read further",
                                cause="reply_too_large",
                            )
                    line = b"".join(pieces)
                    if line.strip():
                        yield line
                    return
            except Exception as exc:
                wait = self._wait_or_raise(exc, "GET", url, retries, started)
            retries += 1
            await self.clock.sleep(wait)

    def _wait_or_raise(
        self, exc: Exception, method: str, url: str, retries: int, started: float
    ) -> float:
        """Seconds before the next attempt after `exc`; raises it (classified, with the request
        named) when it is not retryable or the policy allows no more retries."""
        err = exc if isinstance(exc, JudgeError) else classify_exception(exc)
        if err is None:
            raise exc
        elapsed = self.clock.now() - started
        if self.policy.may_retry(err, retries, elapsed):
            # a wait past retry.PAUSE_CEILING_S is the server's schedule: waited, not charged
            wait = self.policy.pauses_the_run(err)
            if wait is None:
                wait = self.policy.wait(err, retries, elapsed, rand=self.clock.rand)
            if wait is not None:
                return wait
        message = redact(f"{self.where}: {method} {url} failed: {err}")
        kind = JudgeRetryableError if isinstance(err, JudgeRetryableError) else JudgeFatalError
        raise kind(message, cause=err.cause, status=err.status) from exc


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
    provider_limits: BatchLimits  # lines and bytes of one batch, as the provider allows

    def __init__(
        self,
        judge: HttpJudgeBase,
        settings: JudgeSettings,
        *,
        transport: StreamingTransport | None = None,
    ) -> None:
        self.judge = judge
        self.limits = limits_for(self.provider_limits, settings)
        # a transport given by the caller is the caller's to close; the default one is ours
        self._own_transport: AiohttpTransport | None = None
        if transport is None:
            timeout_s = max(settings.timeout_s, MIN_READ_TIMEOUT_S)
            transport = self._own_transport = AiohttpTransport(
                timeout_s, per_read=True, max_reply_bytes=BATCH_REPLY_BYTES
            )
        policy = RetryPolicy.of(settings)
        self.http = BatchHttp(judge.auth_headers(), judge.model, transport, policy, judge.clock)
        self._locate(judge, settings)

    @abc.abstractmethod
    def _locate(self, judge: HttpJudgeBase, settings: JudgeSettings) -> None:
        """Set the provider's batch URLs (under the judge's API root or the settings')."""

    @abc.abstractmethod
    def _batch_url(self, batch_id: str) -> str: ...

    @staticmethod
    @abc.abstractmethod
    def _remote(data: dict[str, Any]) -> RemoteBatch: ...

    @abc.abstractmethod
    def _result_files(self, batch: RemoteBatch) -> list[tuple[str, dict[str, str]]]:
        """The URLs (and extra headers) of an ended batch's result lines."""

    @staticmethod
    @abc.abstractmethod
    def _result(custom_id: str, line: dict[str, Any]) -> LineResult:
        """One result line of the provider's shape, read."""

    async def results(self, batch: RemoteBatch) -> AsyncIterator[LineResult]:
        """Each result line of an ended batch, downloaded as it streams; lines that are not a
        JSON object with a custom_id are skipped."""
        for url, headers in self._result_files(batch):
            async for text in self.http.lines(url, headers):
                try:
                    line = json.loads(text)
                except (ValueError, RecursionError):  # not a line of results: skipped
                    continue
                if isinstance(line, dict) and isinstance(line.get("custom_id"), str):
                    yield self._result(line["custom_id"], line)

    async def poll(self, batch_id: str) -> RemoteBatch:
        return self._remote(await self.http.json("GET", self._batch_url(batch_id)))

    async def cancel(self, batch_id: str) -> RemoteBatch:
        return self._remote(await self.http.json("POST", f"{self._batch_url(batch_id)}/cancel"))

    async def aclose(self) -> None:
        if self._own_transport is not None:
            await self._own_transport.aclose()
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
