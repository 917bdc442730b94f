"""The OpenAI-compatible chat-completions judge (OpenAI, Azure, vLLM, Ollama, LiteLLM proxies):
request and reply shapes only. Session, retries, parsing and re-ask live in `judges.http`.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import urlsplit

from connectors.judges.base import Gate, JudgeSettings, JudgeStats
from connectors.judges.http import (
    HttpJudgeBase,
    Message,
    Schema,
    api_key_from_env,
    normalize_base_url,
)
from pipeline.errors import JudgeError

__all__ = ["DEFAULT_BASE_URL", "OpenAIJudge"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_log = logging.getLogger("ctxprec.http")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class OpenAIJudge(HttpJudgeBase):
    """POST {base}/chat/completions. Key from $OPENAI_API_KEY (or settings.api_key_env), none
    needed on loopback; base URL from settings.base_url, $OPENAI_BASE_URL, or OpenAI's."""

    provider = "openai"

    def __init__(
        self, model_name: str, settings: JudgeSettings, gate: Gate, stats: JudgeStats
    ) -> None:
        base = normalize_base_url(
            settings.base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        )
        model = f"openai/{model_name}"
        key = api_key_from_env(settings.api_key_env or "OPENAI_API_KEY", base, model)
        super().__init__(settings, gate, stats, url=f"{base}/chat/completions", api_key=key)
        self.model, self._name, self._base = model, model_name, base
        self._send_schema = settings.structured_output
        self._tokens_field = "max_tokens"

    def identity(self) -> dict[str, object]:
        s = self.settings
        return {
            "provider": "openai",
            "model": self._name,
            "base_url": self._base,
            "temperature": s.temperature,
            "max_output_tokens": s.max_output_tokens,
            "structured_output": s.structured_output,
        }

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key is not None:
            # Azure OpenAI takes its keys in `api-key`; everyone else in a bearer token.
            if (urlsplit(self._base).hostname or "").endswith(".azure.com"):
                headers["api-key"] = self._api_key
            else:
                headers["Authorization"] = f"Bearer {self._api_key}"
        headers.update(dict(self.settings.extra_headers))
        return headers

    def _payload(
        self, system: str, messages: list[Message], schema: Schema | None, max_tokens: int
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self._name,
            "messages": [{"role": "system", "content": system}, *messages],
            "temperature": self.settings.temperature,
            self._tokens_field: max_tokens,
        }
        if schema is not None and self._send_schema:
            name, body = schema
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": body, "strict": True},
            }
        return payload

    def _recover(self, err: JudgeError, payload: dict[str, Any]) -> dict[str, Any] | None:
        """A 400 about response_format: drop it for good (the tolerant parser takes over).
        A 400 asking for max_completion_tokens (newer models): rename the field for good."""
        if err.status != 400:
            return None
        text = str(err)
        if "response_format" in payload and ("response_format" in text or "json_schema" in text):
            self._send_schema = False
            _log.warning("%s rejected response_format; using the tolerant parser", self.model)
            return {k: v for k, v in payload.items() if k != "response_format"}
        if "max_tokens" in payload and "max_completion_tokens" in text:
            self._tokens_field = "max_completion_tokens"
            changed = {k: v for k, v in payload.items() if k != "max_tokens"}
            return {**changed, "max_completion_tokens": payload["max_tokens"]}
        return None

    def _text(self, data: dict[str, Any]) -> str:
        """choices[0].message.content (a string or a list of text parts); a refusal's text;
        "" when absent, so the parser fails and the one re-ask happens."""
        choices = data.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else {}
        message = first.get("message") if isinstance(first, dict) else None
        if not isinstance(message, dict):
            return ""
        content = message.get("content") or message.get("refusal") or ""
        if isinstance(content, list):
            parts = [p.get("text", "") for p in content if isinstance(p, dict)]
            return "".join(str(p) for p in parts)
        return str(content)

    def _usage(self, data: dict[str, Any]) -> tuple[int, int] | None:
        usage = data.get("usage")
        if not isinstance(usage, dict):
            return None
        return _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
