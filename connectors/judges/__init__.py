"""Relevance judges: the protocol, the provider registry and the versioned prompts."""

from connectors.judges.base import (
    ItemRequest,
    Judge,
    JudgeStats,
    NullThrottle,
    Throttle,
    estimate_tokens,
)
from connectors.judges.registry import (
    audit_settings,
    create_judge,
    provider_names,
    register_provider,
    split_model,
)
from storage.core.settings import JudgeSettings
from storage.core.verdict import JudgeReply, Verdict

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
