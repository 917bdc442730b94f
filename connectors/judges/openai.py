"""The OpenAI-compatible chat-completions judge (OpenAI and every "openai-chat" provider of the
registry: Azure, Gemini, Groq, OpenRouter, ..., vLLM, Ollama, LiteLLM proxies): request and reply
shapes only. Retries live in `judges.client`, parsing and re-ask in
`judges.conversation`, the wire in `judges.transport`.
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import urlsplit

from ctxprec.connectors.judges.client import json_count
from ctxprec.connectors.judges.conversation import HttpJudgeBase, Message, Schema
from ctxprec.connectors.judges.shapes import RequestShape, learn_openai, openai_shape
from ctxprec.connectors.judges.transport import normalize_base_url

__all__ = ["DEFAULT_BASE_URL", "OpenAIJudge"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"


_FINISH = {"content_filter": "filtered", "length": "length"}  # other finish reasons: "stop"


def _text_of(message: dict[str, Any]) -> str:
    """choices[0].message.content (a string or a list of text parts); "" when absent."""
    content = message.get("content") or ""
    if type(content) is str:
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(str(p) for p in parts)
    return str(content)


def _finish_of(choice: dict[str, Any], message: dict[str, Any]) -> str:
    if message.get("refusal"):
        return "refused"
    reason = choice.get("finish_reason")
    return _FINISH.get(reason, "stop") if isinstance(reason, str) else "stop"


@functools.lru_cache(maxsize=16)
def _is_azure(base_url: str) -> bool:
    """Azure OpenAI (keys in `api-key`): asked for every call's headers, parsed once."""
    return (urlsplit(base_url).hostname or "").endswith(".azure.com")


class OpenAIJudge(HttpJudgeBase):
    """POST {base}/chat/completions. The provider (`spec`, OpenAI's by default) gives the base
    URL (with its /v1, as openai-python takes it; settings.base_url wins, then its variable such as
    $OPENAI_BASE_URL), the key variables (settings.api_key_env replaces them) and the key header
    (a bearer token, Azure's `api-key`). A base URL with a query (an Azure deployment URL with
    ?api-version=...) keeps it after /chat/completions. The request shape follows the model
    name, whatever the provider (`shapes.openai_shape`), and adapts once per run to what the
    server rejects."""

    provider = default_provider = "openai"

    @staticmethod
    def _api_root(url: str) -> str:
        return normalize_base_url(url)

    @staticmethod
    def _endpoint(base: str) -> str:
        path, sep, query = base.partition("?")
        return f"{path.rstrip('/')}/chat/completions{sep}{query}"

    def _first_shape(self) -> RequestShape:
        s = self.settings
        return openai_shape(self._name, s.structured_output, s.reasoning_effort)

    def identity(self) -> dict[str, object]:
        s = self.settings
        ident = self._identity(structured_output=s.structured_output)
        first = openai_shape(self._name, s.structured_output, s.reasoning_effort)
        if first.reasoning or s.reasoning_effort is not None:
            ident["reasoning_effort"] = first.reasoning_effort
        return ident

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        azure_host = _is_azure(self._base)
        if self._api_key is not None and azure_host:
            headers["api-key"] = self._api_key  # an Azure URL spoken to as openai/...: its header
        else:
            headers.update(self.spec.auth(self._api_key))
        headers.update(dict(self.settings.extra_headers))
        return headers

    def _payload(
        self, system: str, messages: list[Message], schema: Schema | None, max_tokens: int
    ) -> dict[str, Any]:
        """The body `_build` gives, from a copy of the body's fixed part (everything but the
        messages, in its order), built once per shape version, schema and budget."""
        shape = self.shape
        key = (shape.version, max_tokens, id(schema))
        known = self._templates.get(key)
        if known is None or known[0] is not schema:  # (an entry holds its schema: ids stay)
            if len(self._templates) >= 64:
                self._templates.clear()
            fixed = self._build("", [], schema, max_tokens)
            known = self._templates[key] = (schema, fixed if "messages" in fixed else None)
        if known[1] is None:
            return self._build(system, messages, schema, max_tokens)
        payload = known[1].copy()
        payload["messages"] = self._chat(system, messages)  # (the key is there: order stays)
        return payload

    def _chat(self, system: str, messages: list[Message]) -> list[Message]:
        """The messages as sent: the system text first, or in the first user turn where the
        server takes no system role (`system_in_user`)."""
        if self.shape.system_in_user and messages:
            first = {"role": "user", "content": f"{system}\n\n{messages[0]['content']}"}
            return [first, *messages[1:]]
        return [{"role": "system", "content": system}, *messages]

    def _build(
        self, system: str, messages: list[Message], schema: Schema | None, max_tokens: int
    ) -> dict[str, Any]:
        shape = self.shape
        payload: dict[str, Any] = {"model": self._name, "messages": self._chat(system, messages)}
        if shape.send_temperature:
            payload["temperature"] = self.settings.temperature
        payload[shape.tokens_field] = max_tokens
        if shape.reasoning_effort is not None:
            payload["reasoning_effort"] = shape.reasoning_effort
        if schema is not None and shape.output != "text":
            name, body = schema
            if shape.output == "json_schema":
                payload["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": name, "schema": body, "strict": True},
                }
            elif shape.output == "json_object_schema":  # llama.cpp, vLLM: grammar from schema
                payload["response_format"] = {"type": "json_object", "schema": body}
            else:
                payload["response_format"] = {"type": "json_object"}
        for key in shape.dropped:
            payload.pop(key, None)
        return payload

    def _learn(self, status: int, body: str, payload: dict[str, Any]) -> str | None:
        return learn_openai(self.shape, status, body, payload)

    def _reshape(self, payload: dict[str, Any]) -> dict[str, Any]:
        chat = list(payload.get("messages") or [])
        if chat and chat[0].get("role") == "system":
            system, rest = str(chat[0].get("content", "")), chat[1:]
        else:  # the system text already rides in the first user message
            system, rest = "", chat
        fmt = payload.get("response_format") or {}
        schema: Schema | None = None
        if fmt.get("type") == "json_schema":
            named = fmt.get("json_schema") or {}
            schema = (str(named.get("name", "verdict")), named.get("schema") or {})
        elif fmt:
            schema = ("verdict", fmt.get("schema") or {})
        budget = payload.get("max_completion_tokens") or payload.get("max_tokens")
        fresh = self._payload(system, rest, schema, int(budget or self.settings.max_output_tokens))
        first = fresh["messages"][0] if fresh.get("messages") else {}
        if not system and first.get("role") == "system":  # nothing to move: keep the user turn
            fresh["messages"] = fresh["messages"][1:]
        elif not system and str(first.get("content", "")).startswith("\n\n"):
            first["content"] = str(first["content"])[2:]
        return fresh

    def _read(self, data: dict[str, Any]) -> tuple[str, str, tuple[int, int] | None, int]:
        """`_text`, `_finish`, `_usage` and `_cached` of one reply, its message found once."""
        choice, message = self._message(data)
        return _text_of(message), _finish_of(choice, message), self._usage(data), self._cached(data)

    def _message(self, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        choices = data.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else {}
        first = first if isinstance(first, dict) else {}
        message = first.get("message")
        return first, message if isinstance(message, dict) else {}

    def _text(self, data: dict[str, Any]) -> str:
        return _text_of(self._message(data)[1])

    def _finish(self, data: dict[str, Any]) -> str:
        return _finish_of(*self._message(data))

    def _usage(self, data: dict[str, Any]) -> tuple[int, int] | None:
        """prompt_tokens (cached ones included), completion_tokens (reasoning included); a
        missing usage or null counts are tolerated (vLLM, Ollama, proxies), a count that is not
        one is UNKNOWN (`client.json_count`)."""
        usage = data.get("usage")
        if not isinstance(usage, dict):
            return None
        return json_count(usage.get("prompt_tokens")), json_count(usage.get("completion_tokens"))

    def _cached(self, data: dict[str, Any]) -> int:
        usage = data.get("usage")
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        return json_count(details.get("cached_tokens")) if isinstance(details, dict) else 0
