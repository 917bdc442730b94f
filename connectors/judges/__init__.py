"""Relevance judges: the protocol, the provider registry and the versioned prompts."""

from connectors.judges.base import Gate, ItemRequest, Judge, JudgeStats, NullGate, estimate_tokens
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
    "Gate",
    "ItemRequest",
    "Judge",
    "JudgeReply",
    "JudgeSettings",
    "JudgeStats",
    "NullGate",
    "Verdict",
    "audit_settings",
    "create_judge",
    "estimate_tokens",
    "provider_names",
    "register_provider",
    "split_model",
]
