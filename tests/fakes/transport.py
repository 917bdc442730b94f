"""A judge transport that answers from a function instead of a server (httpx's `MockTransport`
idea): `MockTransport(handler)` calls `handler(request)` for each request (sent, or streamed
as a download) and records every request it saw. The builders below return what real providers
send, as their API references document: chat completions, Anthropic messages, and their error
bodies and headers.

    transport = MockTransport(replies(rate_limited(2.0), openai_completion('{"relevant": true}')))
    judge = OpenAIJudge("gpt-4o-mini", settings, throttle, stats, seams=Seams(transport=transport))
"""

from __future__ import annotations

import contextlib
import inspect
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from ctxprec.connectors.judges.transport import HttpRequest, HttpResponse, HttpStream

__all__ = [
    "MockTransport",
    "anthropic_error",
    "anthropic_message",
    "openai_completion",
    "openai_error",
    "rate_limited",
    "replies",
    "verdict_json",
]

Handler = Callable[[HttpRequest], HttpResponse | Awaitable[HttpResponse]]


class MockTransport:
    """Answers each request with `handler(request)` (a plain or an async function); a handler
    may raise (e.g. `ConnectionResetError`) to stand for a transport failure."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[HttpRequest] = []

    async def send(self, request: HttpRequest) -> HttpResponse:
        self.requests.append(request)
        reply = self.handler(request)
        if inspect.isawaitable(reply):
            return await reply
        return reply

    @contextlib.asynccontextmanager
    async def stream(self, request: HttpRequest) -> AsyncIterator[HttpStream]:
        """The handler's reply, its body handed over in blocks of 7 bytes (a download)."""
        reply = await self.send(request)
        data = reply.body.encode()

        async def blocks() -> AsyncIterator[bytes]:
            for start in range(0, len(data), 7):
                yield data[start : start + 7]

        yield HttpStream(reply.status, reply.headers, blocks())

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.json for r in self.requests]


def replies(*script: HttpResponse | BaseException) -> Handler:
    """A handler answering the scripted responses in order (an exception is raised), then the
    last one again for any further request."""
    remaining = list(script)

    def handler(request: HttpRequest) -> HttpResponse:
        step = remaining.pop(0) if len(remaining) > 1 else remaining[0]
        if isinstance(step, BaseException):
            raise step
        return step

    return handler


def _json(status: int, body: Mapping[str, Any], headers: Mapping[str, str]) -> HttpResponse:
    return HttpResponse(status, json.dumps(body), {"content-type": "application/json", **headers})


def verdict_json(relevant: bool, reason: str = "It answers the query.") -> str:
    return json.dumps({"relevant": relevant, "reason": reason})


def openai_completion(
    content: str | None,
    *,
    finish: str = "stop",
    prompt_tokens: int = 40,
    completion_tokens: int = 12,
    refusal: str | None = None,
) -> HttpResponse:
    """A 200 chat.completion with one choice, usage, and OpenAI's headers."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": refusal,
        "annotations": [],
    }
    body = {
        "id": "chatcmpl-" + secrets.token_hex(8),
        "object": "chat.completion",
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }
    return _json(200, body, {"x-request-id": "req_" + secrets.token_hex(8)})


def openai_error(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> HttpResponse:
    """OpenAI's error envelope: {"error": {message, type, param, code}}."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return _json(status, body, {"x-request-id": "req_" + secrets.token_hex(8), **(headers or {})})


def rate_limited(retry_after_s: float) -> HttpResponse:
    """OpenAI's retryable 429 (tokens per minute), with Retry-After in seconds."""
    message = (
        "Rate limit reached for gpt-4o-mini in organization org-test on tokens per min (TPM): "
        f"Limit 200000, Used 199000, Requested 4000. Please try again in {retry_after_s}s."
    )
    return openai_error(
        429,
        message,
        kind="tokens",
        code="rate_limit_exceeded",
        headers={"retry-after": f"{retry_after_s:g}", "x-ratelimit-remaining-tokens": "0"},
    )


def anthropic_message(
    text: str, *, stop_reason: str = "end_turn", input_tokens: int = 40, output_tokens: int = 12
) -> HttpResponse:
    """A 200 Anthropic message with one text block and usage."""
    body = {
        "id": "msg_" + secrets.token_hex(8),
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku-4-5",
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
        },
    }
    return _json(200, body, {"request-id": "req_" + secrets.token_hex(8)})


def anthropic_error(
    status: int, kind: str, message: str, *, headers: Mapping[str, str] | None = None
) -> HttpResponse:
    """Anthropic's error envelope: {"type": "error", "error": {type, message}, "request_id"}."""
    request_id = "req_" + secrets.token_hex(8)
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}
    return _json(status, body, {"request-id": request_id, **(headers or {})})
