"""Relevance judges: the protocol, the provider registry and the versioned prompts."""

from connectors.judges.base import (
    Gate,
    ItemRequest,
    Judge,
    JudgeReply,
    JudgeSettings,
    JudgeStats,
    NullGate,
    Verdict,
    estimate_tokens,
)
from connectors.judges.registry import create_judge, provider_names, register_provider, split_model

__all__ = [
    "Gate",
    "ItemRequest",
    "Judge",
    "JudgeReply",
    "JudgeSettings",
    "JudgeStats",
    "NullGate",
    "Verdict",
    "create_judge",
    "estimate_tokens",
    "provider_names",
    "register_provider",
    "split_model",
]
