"""`provider/model` strings to judge objects.

The providers of the data registry (`catalog`, providers.toml plus a config's [providers.NAME])
get the judge of their API kind; `offline` and plugins register a factory (`register_provider`),
which wins over the registry. A judge's module is imported only when a judge of it is created.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Protocol

from ctxprec.connectors.judges.base import Judge, JudgeStats, NullThrottle, Throttle
from ctxprec.connectors.judges.catalog import ProviderSpec, ProviderTable, lookup, providers
from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.core.settings import JudgeSettings

__all__ = [
    "JudgeFactory",
    "audit_settings",
    "create_judge",
    "provider_names",
    "register_provider",
    "resolve_model",
    "split_model",
]


class JudgeFactory(Protocol):
    def __call__(
        self, model_name: str, settings: JudgeSettings, throttle: Throttle, stats: JudgeStats
    ) -> Judge: ...


# name -> "module:attribute" (imported lazily) or a factory registered by a plugin
_PROVIDERS: dict[str, str | JudgeFactory] = {
    "offline": "ctxprec.connectors.judges.offline:OfflineJudge",
}
# a registry provider's API kind -> its judge class (called with spec=the provider)
_KINDS = {
    "openai-chat": "ctxprec.connectors.judges.openai:OpenAIJudge",
    "anthropic-messages": "ctxprec.connectors.judges.anthropic:AnthropicJudge",
}


def register_provider(name: str, factory: str | JudgeFactory) -> None:
    """Add or replace a provider: `factory` is a callable or a "module:attribute" path."""
    _PROVIDERS[name.lower()] = factory


def provider_names(extra: ProviderTable = ()) -> list[str]:
    return sorted({*_PROVIDERS, *providers(extra)})


def resolve_model(model: str, extra: ProviderTable = ()) -> tuple[str, str, ProviderSpec | None]:
    """(provider id, model name, registry entry): `groq/llama-3.3-70b-versatile` gives ("groq",
    "llama-3.3-70b-versatile", groq's entry); `openrouter/openai/gpt-5-mini` keeps
    "openai/gpt-5-mini" as the model name; `offline` and plugins have no entry (None). An
    unknown provider is a ConfigError naming the closest known ones."""
    provider, _, name = model.strip().partition("/")
    provider = provider.lower()
    spec = None
    if provider not in _PROVIDERS:
        spec = lookup(provider, model, extra, others=tuple(_PROVIDERS))
        provider = spec.id
    if provider != "offline" and not name:
        raise ConfigError(f"model {model!r} names no model; write it as {provider}/<model-name>")
    return provider, name, spec


def split_model(model: str, extra: ProviderTable = ()) -> tuple[str, str]:
    """Split `openai/gpt-4o-mini` into ("openai", "gpt-4o-mini"); `offline` into ("offline", "")."""
    provider, name, _ = resolve_model(model, extra)
    return provider, name


def _resolve(factory: str | JudgeFactory) -> JudgeFactory:
    if not isinstance(factory, str):
        return factory
    module_name, _, attr = factory.partition(":")
    resolved: JudgeFactory = getattr(importlib.import_module(module_name), attr)
    return resolved


def create_judge(
    settings: JudgeSettings,
    *,
    throttle: Throttle | None = None,
    stats: JudgeStats | None = None,
    seams: Seams = DEFAULT,
) -> Judge:
    """Build the judge named by `settings.model`; raises ConfigError (e.g. missing key).
    An HTTP judge takes its retry clock, transport and key source from `seams` (real waits,
    aiohttp and the environment by default; tests pass their own)."""
    provider, name, spec = resolve_model(settings.model, settings.providers)
    throttle, stats = throttle or NullThrottle(), stats or JudgeStats()
    if spec is None:
        return _resolve(_PROVIDERS[provider])(name, settings, throttle, stats)
    module_name, _, attr = _KINDS[spec.kind].partition(":")
    judge: Judge = getattr(importlib.import_module(module_name), attr)(
        name, settings, throttle, stats, spec=spec, seams=seams
    )
    return judge


def audit_settings(settings: JudgeSettings) -> JudgeSettings | None:
    """The audit judge's settings (`[judge] audit_model`), None without one: the same
    settings but the model, resolved through the same catalog. Its base URL is
    `audit_base_url`, else `base_url` when both models have the same provider (one local
    server or proxy serving both), else the provider's own; likewise the key's variable."""
    if not settings.audit_model:
        return None
    same = (
        resolve_model(settings.audit_model, settings.providers)[0]
        == resolve_model(settings.model, settings.providers)[0]
    )
    inherit = same and settings.audit_base_url is None
    return dataclasses.replace(
        settings,
        model=settings.audit_model,
        base_url=settings.audit_base_url or (settings.base_url if inherit else None),
        api_key_env=settings.api_key_env if inherit else None,
        audit_model=None,
    )
