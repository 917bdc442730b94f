"""Provider registry: `provider/model` strings to judge objects.

Built-in providers register through the same path as any other (`register_provider`);
the provider module is imported only when a judge of that provider is created.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from connectors.judges.base import Gate, Judge, JudgeStats, NullGate
from storage.core.errors import ConfigError
from storage.core.settings import JudgeSettings

__all__ = ["JudgeFactory", "create_judge", "provider_names", "register_provider", "split_model"]


class JudgeFactory(Protocol):
    def __call__(
        self, model_name: str, settings: JudgeSettings, gate: Gate, stats: JudgeStats
    ) -> Judge: ...


# name -> "module:attribute" (imported lazily) or a factory registered by a plugin
_PROVIDERS: dict[str, str | JudgeFactory] = {
    "offline": "connectors.judges.offline:OfflineJudge",
    "openai": "connectors.judges.openai:OpenAIJudge",
    "anthropic": "connectors.judges.anthropic:AnthropicJudge",
}


def register_provider(name: str, factory: str | JudgeFactory) -> None:
    """Add or replace a provider: `factory` is a callable or a "module:attribute" path."""
    _PROVIDERS[name.lower()] = factory


def provider_names() -> list[str]:
    return sorted(_PROVIDERS)


def split_model(model: str) -> tuple[str, str]:
    """Split `openai/gpt-4o-mini` into ("openai", "gpt-4o-mini"); `offline` into ("offline", "")."""
    provider, _, name = model.strip().partition("/")
    provider = provider.lower()
    if provider not in _PROVIDERS:
        known = ", ".join(provider_names())
        raise ConfigError(
            f"unknown judge provider {provider!r} in model {model!r}; use one of: {known} "
            "(e.g. --model openai/gpt-4o-mini; any OpenAI-compatible server is openai/<model> "
            "with OPENAI_BASE_URL or [judge] base_url)"
        )
    if provider != "offline" and not name:
        raise ConfigError(f"model {model!r} names no model; write it as {provider}/<model-name>")
    return provider, name


def _resolve(factory: str | JudgeFactory) -> JudgeFactory:
    if not isinstance(factory, str):
        return factory
    module_name, _, attr = factory.partition(":")
    resolved: JudgeFactory = getattr(importlib.import_module(module_name), attr)
    return resolved


def create_judge(
    settings: JudgeSettings, *, gate: Gate | None = None, stats: JudgeStats | None = None
) -> Judge:
    """Build the judge named by `settings.model`; raises ConfigError (e.g. missing key)."""
    provider, name = split_model(settings.model)
    factory = _resolve(_PROVIDERS[provider])
    return factory(name, settings, gate or NullGate(), stats or JudgeStats())
