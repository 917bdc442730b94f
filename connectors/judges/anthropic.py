"""The Anthropic Messages API judge: request and reply shapes only. Retries live in
`judges.client`, parsing and re-ask in `judges.conversation`, the wire in `judges.transport`.

No JSON-schema structured output here: the prompt asks for JSON only and the tolerant parser
(plus the one re-ask) reads the reply, which is what `settings.structured_output` falls back to.
"""

from __future__ import annotations

from typing import Any

from ctxprec.connectors.judges.client import UNKNOWN, json_count
from ctxprec.connectors.judges.conversation import HttpJudgeBase, Message, Schema
from ctxprec.connectors.judges.shapes import RequestShape, anthropic_shape, learn_anthropic
from ctxprec.connectors.judges.transport import normalize_base_url

__all__ = ["DEFAULT_BASE_URL", "AnthropicJudge"]

DEFAULT_BASE_URL = "https://api.anthropic.com"


def anthropic_base(url: str) -> str:
    """The API root with its /v1: ANTHROPIC_BASE_URL is taken as the Anthropic SDK takes it
    (`https://host`, no /v1); a trailing /v1 is tolerated."""
    base = normalize_base_url(url)
    return base if base.endswith("/v1") else f"{base}/v1"


class AnthropicJudge(HttpJudgeBase):
    """POST {base}/v1/messages with x-api-key ($ANTHROPIC_API_KEY or settings.api_key_env) and
    anthropic-version; base URL from settings.base_url, $ANTHROPIC_BASE_URL, or Anthropic's.
    Models that reject `temperature` (Opus 4.7 and later) are not sent one."""

    provider = default_provider = "anthropic"

    @staticmethod
    def _api_root(url: str) -> str:
        return anthropic_base(url)

    @staticmethod
    def _endpoint(base: str) -> str:
        return f"{base}/messages"

    def _first_shape(self) -> RequestShape:
        return anthropic_shape(self._name)

    def identity(self) -> dict[str, object]:
        return self._identity(anthropic_version=self.settings.anthropic_version)

    def _headers(self) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "application/json",
            "anthropic-version": self.settings.anthropic_version,
        }
        headers.update(self.spec.auth(self._api_key))  # x-api-key
        headers.update(dict(self.settings.extra_headers))
        return headers

    def _payload(
        self, system: str, messages: list[Message], schema: Schema | None, max_tokens: int
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": self._name, "max_tokens": max_tokens}
        if self.shape.send_temperature:
            payload["temperature"] = self.settings.temperature
        payload |= {"system": system, "messages": messages}
        return payload

    def _learn(self, status: int, body: str, payload: dict[str, Any]) -> str | None:
        return learn_anthropic(self.shape, status, body, payload)

    def _reshape(self, payload: dict[str, Any]) -> dict[str, Any]:
        budget = int(payload.get("max_tokens") or self.settings.max_output_tokens)
        messages = list(payload.get("messages") or [])
        return self._payload(str(payload.get("system", "")), messages, None, budget)

    def _text(self, data: dict[str, Any]) -> str:
        """The text blocks of `content`, joined; "" when absent (parser fails, one re-ask)."""
        blocks = data.get("content")
        if not isinstance(blocks, list):
            return ""
        texts = [b.get("text") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
        return "".join(t for t in texts if isinstance(t, str))

    def _finish(self, data: dict[str, Any]) -> str:
        reason = data.get("stop_reason")
        if reason == "refusal":
            return "refused"
        return "length" if reason == "max_tokens" else "stop"

    def _usage(self, data: dict[str, Any]) -> tuple[int, int] | None:
        """Input tokens include prompt-cache reads and writes (reported beside input_tokens):
        all of them count toward limits; each is counted once. One count that is not one makes
        the input UNKNOWN (`client.json_count`)."""
        usage = data.get("usage")
        if not isinstance(usage, dict):
            return None
        keys = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        counts = [json_count(usage.get(k)) for k in keys]
        tokens_in = UNKNOWN if UNKNOWN in counts else json_count(sum(counts))
        return tokens_in, json_count(usage.get("output_tokens"))

    def _cached(self, data: dict[str, Any]) -> int:
        usage = data.get("usage")
        return json_count(usage.get("cache_read_input_tokens")) if isinstance(usage, dict) else 0
