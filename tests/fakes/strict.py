"""Strict stand-ins of the real judge APIs, as their API references document them: OpenAI chat
completions (and the OpenAI-compatible llama.cpp, Ollama and vLLM flavours) and Anthropic
Messages. Unlike `judge_server`, they validate requests the way the providers do and answer
with the providers' own bodies and headers, so a client is tested against the API, not against
its own assumptions. `with StrictThread(StrictConfig(...)) as server:` gives `server.url` (…/v1),
`server.root` (no /v1, as ANTHROPIC_BASE_URL is written) and `server.stats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from tests.fakes.judge_server import (
    expected_verdict,
    items_from_messages,
    reply_json,
    start_loopback,
    wants_reasons,
)

__all__ = ["StrictConfig", "StrictServer", "StrictStats", "StrictThread", "running_strict"]

_REASONS = {True: "It states what the query asks for.", False: "It does not help."}
_OPENAI_PARAMS = frozenset(
    {
        "model",
        "messages",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "response_format",
        "reasoning_effort",
        "stop",
        "n",
        "seed",
        "user",
        "stream",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "metadata",
        "store",
        "service_tier",
        "parallel_tool_calls",
        "tools",
        "tool_choice",
        "prediction",
        "modalities",
        "audio",
        "verbosity",
        "stream_options",
        "safety_identifier",
    }
)
_ANTHROPIC_PARAMS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "stop_sequences",
        "stream",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "service_tier",
    }
)
QUOTA_MESSAGE = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, read the docs: "
    "https://platform.openai.com/docs/guides/error-codes/api-errors."
)
CREDIT_MESSAGE = (
    "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing "
    "to upgrade or purchase credits."
)


@dataclass
class StrictConfig:
    """flavor: openai | llamacpp | ollama | vllm (the /v1/chat/completions side; /v1/messages
    is always Anthropic). account: ok | quota | credit_exhausted | credit_low | usage_limit.
    `script`: outcomes served first, one per request: refusal, content_filter, rate_limit,
    too_large, long_retry, overloaded_429, overloaded_503, html_502, json_502, busy_503,
    litellm_429, context_length, overloaded_529, rate_limit_anthropic, no_usage,
    null_completion, x_should_retry_false."""

    flavor: str = "openai"
    account: str = "ok"
    models: frozenset[str] | None = None  # known model names (None: any)
    require_key: str | None = None
    reasoning_cap: int = 2048  # a reasoning model with max_completion_tokens <= this: empty
    reasoning_tokens: int = 300  # what reasoning spends when the cap leaves room
    cached_tokens: int = 0  # prompt tokens served from cache (OpenAI: inside prompt_tokens)
    retry_after_s: float = 1.0
    latency_s: float = 0.0
    script: list[str] = field(default_factory=list)
    # where the chat-completions endpoint lives ({path_root}/chat/completions), as each provider
    # serves it: /v1, /openai/v1 (Groq, Azure), /v1beta/openai (Gemini), /api/v1 (OpenRouter)
    path_root: str = "/v1"
    key_header: str = "authorization"  # where require_key is looked for: bearer, or api-key


@dataclass
class StrictStats:
    total: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_outcome: Counter[str] = field(default_factory=Counter)
    ok_pairs: Counter[str] = field(default_factory=Counter)  # items answered with a verdict
    asked: Counter[str] = field(default_factory=Counter)  # items asked, any answer
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)


def _reasoning(model: str) -> bool:
    return bool(re.match(r"^(o\d|gpt-5)", model)) and "chat" not in model


def _efforts(model: str) -> list[str]:
    if model.startswith("o"):
        return ["low", "medium", "high"]
    if re.match(r"gpt-5\.\d", model):
        return ["none", "low", "medium", "high", "xhigh"]
    return ["minimal", "low", "medium", "high"]


def _no_temperature_claude(model: str) -> bool:
    found = re.match(r"claude-(?:opus|sonnet|haiku)-(\d+)(?:-(\d{1,2}))?(?:-|$)", model)
    return found is not None and (int(found.group(1)), int(found.group(2) or 0)) >= (4, 7)


def _oai_error(message: str, kind: str, param: str | None, code: object) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _strict_schema_problem(schema: Any, path: tuple[str, ...] = ()) -> str | None:
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "object":
        if schema.get("additionalProperties") is not False:
            return (
                f"In context={path}, 'additionalProperties' is required to be supplied and to "
                "be false."
            )
        props = schema.get("properties") or {}
        missing = [k for k in props if k not in (schema.get("required") or [])]
        if missing:
            return (
                f"In context={path}, 'required' is required to be supplied and to be an array "
                f"including every key in properties. Missing '{missing[0]}'."
            )
        for key, sub in props.items():
            found = _strict_schema_problem(sub, (*path, "properties", key))
            if found:
                return found
    if isinstance(schema.get("items"), dict):
        return _strict_schema_problem(schema["items"], (*path, "items"))
    return None


class StrictServer:
    def __init__(self, config: StrictConfig | None = None) -> None:
        given = config or StrictConfig()
        self.config = dataclasses.replace(given, script=list(given.script))
        self.stats = StrictStats()
        self.url = self.root = ""
        self._runner: web.AppRunner | None = None

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_post(f"{self.config.path_root.rstrip('/')}/chat/completions", self._openai)
        app.router.add_post("/v1/messages", self._anthropic)
        self._runner, self.root = await start_loopback(app, port)
        self.url = f"{self.root}{self.config.path_root.rstrip('/')}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- bookkeeping
    async def _read(self, request: web.Request) -> tuple[dict[str, Any], list[str]]:
        body = await request.json()
        s = self.stats
        s.total += 1
        s.bodies.append(body)
        s.headers.append(dict(request.headers))
        s.paths.append(request.path)
        s.queries.append(request.query_string)
        items, _, _ = items_from_messages(body.get("messages"))
        s.asked.update(items)
        if self.config.latency_s:
            await asyncio.sleep(self.config.latency_s)
        return body, items

    def _json(
        self,
        payload: dict[str, Any],
        status: int,
        outcome: str,
        headers: dict[str, str] | None = None,
        anthropic: bool = False,
    ) -> web.Response:
        rid = "req_" + secrets.token_hex(12)
        if anthropic and status >= 400:
            payload = {**payload, "request_id": rid}
        self.stats.by_status[status] += 1
        self.stats.by_outcome[outcome] += 1
        base = {"request-id" if anthropic else "x-request-id": rid}
        return web.json_response(payload, status=status, headers={**base, **(headers or {})})

    def _next(self) -> str:
        return self.config.script.pop(0) if self.config.script else "ok"

    # -- OpenAI and OpenAI-compatible
    async def _openai(self, request: web.Request) -> web.StreamResponse:
        body, items = await self._read(request)
        c = self.config
        rejected = self._openai_reject(request, body)
        if rejected is not None:
            status, payload, outcome = rejected
            return self._json(payload, status, outcome)
        outcome = self._next()
        special = self._openai_scripted(outcome)
        if special is not None:
            return special
        model = str(body.get("model"))
        fmt = body.get("response_format") or {}
        cap = body.get("max_completion_tokens")
        if (
            c.flavor == "openai"
            and _reasoning(model)
            and isinstance(cap, int)
            and cap <= c.reasoning_cap
        ):
            return self._completion(body, "", "length", reasoning=cap, outcome="cut_off")
        structured = fmt.get("type") in ("json_schema", "json_object")  # Ollama: others ignored
        if c.flavor == "llamacpp" and fmt.get("type") == "json_object" and "schema" not in fmt:
            structured = False  # free JSON, not our schema: the model writes prose
        text = self._verdict_text(items, structured, wants_reasons(body))
        if outcome == "refusal":
            return self._completion(
                body, None, "stop", refusal="I'm sorry, I can't help with that.", outcome=outcome
            )
        if outcome == "content_filter":
            return self._completion(body, None, "content_filter", outcome=outcome)
        self.stats.ok_pairs.update(items)
        spent = c.reasoning_tokens if _reasoning(model) and c.flavor == "openai" else 0
        return self._completion(body, text, "stop", reasoning=spent, outcome=outcome)

    def _openai_reject(
        self, request: web.Request, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any], str] | None:
        c = self.config
        auth = request.headers.get(c.key_header, "")
        if c.key_header.lower() == "authorization":
            auth = auth.removeprefix("Bearer ")
        if c.require_key is not None and auth != c.require_key:
            if c.flavor == "vllm":
                return 401, {"error": "Unauthorized"}, "auth"
            masked = f"{auth[:6]}****{auth[-4:]}" if len(auth) > 10 else "****"
            return (
                401,
                _oai_error(
                    f"Incorrect API key provided: {masked}. You can find your API key at "
                    "https://platform.openai.com/account/api-keys.",
                    "invalid_request_error",
                    None,
                    "invalid_api_key",
                ),
                "auth",
            )
        model = str(body.get("model"))
        if c.models is not None and model not in c.models:
            return (
                404,
                _oai_error(
                    f"The model `{model}` does not exist or you do not have access to it.",
                    "invalid_request_error",
                    None,
                    "model_not_found",
                ),
                "unknown_model",
            )
        if c.account == "quota":
            return (
                429,
                _oai_error(QUOTA_MESSAGE, "insufficient_quota", None, "insufficient_quota"),
                "quota",
            )
        if c.account == "credit_exhausted":
            return (
                429,
                {
                    "error": {
                        "message": "You have no credits remaining.",
                        "type": "insufficient_quota",
                        "code": "credit_balance_exhausted",
                    }
                },
                "quota",
            )
        if c.flavor == "llamacpp":
            return self._llamacpp_reject(body)
        if c.flavor != "openai":
            return None
        for key in body:
            if key not in _OPENAI_PARAMS:
                return (
                    400,
                    _oai_error(
                        f"Unknown parameter: '{key}'.",
                        "invalid_request_error",
                        key,
                        "unknown_parameter",
                    ),
                    "bad_param",
                )
        if _reasoning(model):
            found = self._reasoning_reject(model, body)
            if found is not None:
                return found
        return self._format_reject(body)

    def _reasoning_reject(
        self, model: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any], str] | None:
        def unsupported(param: str, message: str, code: str) -> tuple[int, dict[str, Any], str]:
            return 400, _oai_error(message, "invalid_request_error", param, code), "bad_param"

        if "max_tokens" in body:
            return unsupported(
                "max_tokens",
                "Unsupported parameter: 'max_tokens' is not "
                "supported with this model. Use 'max_completion_tokens' "
                "instead.",
                "unsupported_parameter",
            )
        if "temperature" in body:
            if model.startswith("o3-mini"):
                return unsupported(
                    "temperature",
                    "Unsupported parameter: 'temperature' is not supported with this model.",
                    "unsupported_parameter",
                )
            if body["temperature"] != 1:
                return unsupported(
                    "temperature",
                    f"Unsupported value: 'temperature' does not "
                    f"support {body['temperature']} with this model. Only the "
                    "default (1) value is supported.",
                    "unsupported_value",
                )
        if "stop" in body and re.match(r"o3|o4-mini", model):
            return unsupported(
                "stop",
                "Unsupported parameter: 'stop' is not supported with this model.",
                "unsupported_parameter",
            )
        effort = body.get("reasoning_effort")
        allowed = _efforts(model)
        if effort is not None and effort not in allowed:
            listed = ", ".join(f"'{e}'" for e in allowed[:-1]) + f", and '{allowed[-1]}'"
            return unsupported(
                "reasoning_effort",
                f"Unsupported value: 'reasoning_effort' does "
                f"not support '{effort}' with this model. Supported values are: "
                f"{listed}.",
                "unsupported_value",
            )
        return None

    def _format_reject(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], str] | None:
        fmt = body.get("response_format")
        if fmt is None:
            return None

        def bad(
            message: str, param: str = "response_format", code: object = None
        ) -> tuple[int, dict[str, Any], str]:
            return 400, _oai_error(message, "invalid_request_error", param, code), "bad_format"

        kind = fmt.get("type")
        if kind == "json_schema":
            spec = fmt.get("json_schema") or {}
            if "name" not in spec:
                return bad("Missing required parameter: 'response_format.json_schema.name'.")
            if spec.get("strict"):
                problem = _strict_schema_problem(spec.get("schema"))
                if problem:
                    return bad(f"Invalid schema for response_format '{spec['name']}': {problem}")
            return None
        if kind == "json_object":
            if set(fmt) - {"type"}:
                extra = sorted(set(fmt) - {"type"})[0]
                return bad(
                    f"Unknown parameter: 'response_format.{extra}'.",
                    f"response_format.{extra}",
                    "unknown_parameter",
                )
            words = json.dumps(body.get("messages", "")).lower()
            if "json" not in words:
                return bad(
                    "'messages' must contain the word 'json' in some form, to use "
                    "'response_format' of type 'json_object'.",
                    "messages",
                )
            return None
        if kind == "text":
            return None
        return bad(
            f"Invalid value: '{kind}'. Supported values are: 'text', 'json_object', and "
            "'json_schema'.",
            "response_format.type",
            "invalid_value",
        )

    def _llamacpp_reject(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], str] | None:
        fmt = body.get("response_format") or {}
        if fmt and fmt.get("type") not in ("text", "json_object"):
            message = (
                "1 validation error: {'type': 'literal_error', 'loc': ('body', "
                "'response_format', 'type'), 'msg': \"Input should be 'text' or "
                f"'json_object'\", 'input': '{fmt.get('type')}'}}"
            )
            return 500, _oai_error(message, "internal_server_error", None, None), "llamacpp_500"
        return None

    def _openai_scripted(self, outcome: str) -> web.StreamResponse | None:
        c = self.config
        wait = c.retry_after_s
        if outcome == "rate_limit":
            ms = int(wait * 1000)
            return self._json(
                _oai_error(
                    "Rate limit reached for o4-mini in organization org-x on tokens per min "
                    f"(TPM): Limit 200000, Used 162960, Requested 42288. Please try again in "
                    f"{ms}ms. Visit "
                    "https://platform.openai.com/account/rate-limits to learn more.",
                    "tokens",
                    None,
                    "rate_limit_exceeded",
                ),
                429,
                outcome,
                {
                    "retry-after": f"{wait:g}",
                    "retry-after-ms": str(ms),
                    "x-ratelimit-remaining-tokens": "0",
                    "x-ratelimit-reset-tokens": f"{ms}ms",
                },
            )
        if outcome == "too_large":
            return self._json(
                _oai_error(
                    "Request too large for gpt-4o in organization org-x on tokens per min (TPM): "
                    "Limit 30000, Requested 30601. The input or output tokens must be reduced in "
                    "order to run successfully.",
                    "tokens",
                    None,
                    "rate_limit_exceeded",
                ),
                429,
                outcome,
            )
        if outcome == "long_retry":
            return self._json(
                _oai_error(
                    "Rate limit reached. Please try again in 1h.",
                    "requests",
                    None,
                    "rate_limit_exceeded",
                ),
                429,
                outcome,
                {"retry-after": "3600"},
            )
        if outcome == "overloaded_429":
            return self._json(
                _oai_error(
                    "The engine is currently overloaded, please try again later",
                    "server_error",
                    None,
                    None,
                ),
                429,
                outcome,
            )
        if outcome == "overloaded_503":
            return self._json(
                _oai_error(
                    "The server is overloaded.",
                    "service_unavailable_error",
                    None,
                    "server_is_overloaded",
                ),
                503,
                outcome,
            )
        if outcome == "busy_503":
            return self._json(
                _oai_error(
                    "server busy, please try again.  maximum pending requests exceeded",
                    "api_error",
                    None,
                    None,
                ),
                503,
                outcome,
            )
        if outcome == "html_502":
            self.stats.by_status[502] += 1
            self.stats.by_outcome[outcome] += 1
            html = "<html><head><title>api.openai.com | 502: Bad gateway</title></head></html>"
            return web.Response(status=502, text=html, content_type="text/html")
        if outcome == "json_502":
            return self._json(
                {
                    "error": {
                        "code": 502,
                        "message": "Bad gateway.",
                        "param": None,
                        "type": "cf_bad_gateway",
                    }
                },
                502,
                outcome,
            )
        if outcome == "litellm_429":
            return self._json(
                {
                    "error": {
                        "message": "litellm.RateLimitError: rate limited",
                        "type": "None",
                        "param": "None",
                        "code": "429",
                    }
                },
                429,
                outcome,
                {"retry-after": "1"},
            )
        if outcome == "context_length":
            return self._json(
                _oai_error(
                    "This model's maximum context length is 8192 tokens. However, your messages "
                    "resulted in 8227 tokens. Please reduce the length of the messages.",
                    "invalid_request_error",
                    "messages",
                    "context_length_exceeded",
                ),
                400,
                outcome,
            )
        if outcome == "x_should_retry_false":
            return self._json(
                _oai_error("boom", "server_error", None, None),
                500,
                outcome,
                {"x-should-retry": "false"},
            )
        return None

    def _verdict_text(self, items: list[str], structured: bool, reasons: bool = True) -> str:
        """The reply's text: exactly the fields the request's schema (or, without one, its
        prompt) asks for: a reason per verdict, or none (verdict-only)."""
        verdicts = [expected_verdict(i) for i in items]
        given = _REASONS if reasons else None
        if len(items) == 1 and (structured or self.config.flavor == "openai"):
            return reply_json(verdicts, False, given)
        if len(items) == 1:  # a small local model without a grammar: prose that may not parse
            return "The context item talks about the subject of the query in some detail."
        return reply_json(verdicts, True, given) if items else "Fine."

    def _completion(
        self,
        body: dict[str, Any],
        content: str | None,
        finish: str,
        *,
        reasoning: int = 0,
        refusal: str | None = None,
        outcome: str = "ok",
    ) -> web.Response:
        c = self.config
        prompt = len(json.dumps(body.get("messages", ""))) // 4 + 1 + c.cached_tokens
        visible = len(content or "") // 4 + (1 if content else 0)
        usage: dict[str, Any] | None = {
            "prompt_tokens": prompt,
            "completion_tokens": visible + reasoning,
            "total_tokens": prompt + visible + reasoning,
            "prompt_tokens_details": {"cached_tokens": c.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reasoning, "audio_tokens": 0},
        }
        if c.flavor == "ollama":
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": visible,
                "total_tokens": prompt + visible,
            }
        message = {"role": "assistant", "content": content, "refusal": refusal, "annotations": []}
        payload: dict[str, Any] = {
            "id": "chatcmpl-" + secrets.token_hex(8),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": usage,
            "service_tier": "default",
            "system_fingerprint": None,
        }
        if outcome == "no_usage":
            payload.pop("usage")
        headers = {
            "x-ratelimit-limit-requests": "5000",
            "x-ratelimit-remaining-requests": "4999",
            "x-ratelimit-reset-requests": "12ms",
            "x-ratelimit-limit-tokens": "2000000",
            "x-ratelimit-remaining-tokens": "1999000",
            "x-ratelimit-reset-tokens": "1m30.5s",
            "openai-processing-ms": "321",
            "openai-version": "2020-10-01",
        }
        if outcome == "null_completion":
            payload["usage"]["completion_tokens"] = None
        return self._json(payload, 200, outcome, headers)

    # -- Anthropic Messages
    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        body, items = await self._read(request)
        c = self.config

        def error(
            status: int,
            kind: str,
            message: str,
            outcome: str,
            headers: dict[str, str] | None = None,
        ) -> web.Response:
            payload = {"type": "error", "error": {"type": kind, "message": message}}
            return self._json(payload, status, outcome, headers, anthropic=True)

        if "anthropic-version" not in request.headers:
            return error(
                400, "invalid_request_error", "anthropic-version: header is required", "bad_header"
            )
        key = request.headers.get("x-api-key")
        if key is None:
            return error(401, "authentication_error", "x-api-key header is required", "auth")
        if c.require_key is not None and key != c.require_key:
            return error(401, "authentication_error", "invalid x-api-key", "auth")
        model = str(body.get("model"))
        if c.models is not None and model not in c.models:
            return error(404, "not_found_error", f"model: {model}", "unknown_model")
        if c.account in ("credit_low", "quota", "credit_exhausted"):
            return error(400, "invalid_request_error", CREDIT_MESSAGE, "quota")
        if c.account == "usage_limit":
            return error(
                400,
                "invalid_request_error",
                "You have reached your specified API "
                "usage limits. You will regain access on 2026-12-01 at 00:00 UTC.",
                "quota",
            )
        for k in body:
            if k not in _ANTHROPIC_PARAMS:
                return error(
                    400,
                    "invalid_request_error",
                    f"{k}: Extra inputs are not permitted",
                    "bad_param",
                )
        if "max_tokens" not in body:
            return error(400, "invalid_request_error", "max_tokens: Field required", "bad_param")
        if _no_temperature_claude(model) and any(
            k in body for k in ("temperature", "top_p", "top_k")
        ):
            return error(
                400,
                "invalid_request_error",
                "`temperature` is deprecated for this model.",
                "bad_param",
            )
        if "temperature" in body and "top_p" in body:
            return error(
                400,
                "invalid_request_error",
                "`temperature` and `top_p` cannot both be "
                "specified for this model. Please use only one.",
                "bad_param",
            )
        outcome = self._next()
        if outcome == "overloaded_529":
            return error(529, "overloaded_error", "Overloaded", outcome)
        if outcome == "rate_limit_anthropic":
            reset = (datetime.now(UTC) + timedelta(seconds=c.retry_after_s)).isoformat()
            return error(
                429,
                "rate_limit_error",
                "This request would exceed the rate limit for "
                "your organization of 1,000,000 input tokens per minute.",
                outcome,
                {
                    "retry-after": f"{max(1, round(c.retry_after_s))}",
                    "anthropic-ratelimit-input-tokens-remaining": "0",
                    "anthropic-ratelimit-input-tokens-reset": reset,
                },
            )
        usage = {
            "input_tokens": len(json.dumps(body.get("messages", ""))) // 4 + 1,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": c.cached_tokens,
            "output_tokens": 20,
            "service_tier": "standard",
        }
        payload: dict[str, Any] = {
            "id": "msg_" + secrets.token_hex(8),
            "type": "message",
            "role": "assistant",
            "model": model,
            "stop_sequence": None,
            "usage": usage,
        }
        if outcome == "refusal":
            payload |= {"content": [], "stop_reason": "refusal"}
        else:
            self.stats.ok_pairs.update(items)
            text = self._verdict_text(items, True, wants_reasons(body))
            payload |= {"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}
        headers = {
            "anthropic-ratelimit-requests-remaining": "999",
            "anthropic-ratelimit-input-tokens-reset": datetime.now(UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
        }
        return self._json(payload, 200, outcome, headers, anthropic=True)


@contextlib.asynccontextmanager
async def running_strict(config: StrictConfig | None = None) -> AsyncIterator[StrictServer]:
    server = StrictServer(config)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


class StrictThread:
    """The strict server on its own loop in a daemon thread, for CLI tests."""

    def __init__(self, config: StrictConfig | None = None) -> None:
        self.server = StrictServer(config)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> StrictServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(10)
        return self.server

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
