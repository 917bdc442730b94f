"""Relevance judges: the protocol, the provider registry and the versioned prompts."""

from ctxprec.connectors.judges.base import (
    ItemRequest,
    Judge,
    JudgeStats,
    NullThrottle,
    Throttle,
    estimate_tokens,
)
from ctxprec.connectors.judges.registry import (
    audit_settings,
    create_judge,
    provider_names,
    register_provider,
    split_model,
)
from ctxprec.storage.core.settings import JudgeSettings
from ctxprec.storage.core.verdict import JudgeReply, Verdict

__all__ = [
    "ItemRequest",
    "Judge",
    "JudgeReply",
    "JudgeSettings",
    "JudgeStats",
    "NullThrottle",
    "Throttle",
    "Verdict",
    "audit_settings",
    "create_judge",
    "estimate_tokens",
    "provider_names",
    "register_provider",
    "split_model",
]
