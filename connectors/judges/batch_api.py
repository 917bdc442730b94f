"""Batch mode as the pipeline sees it: which providers have a batch API, and the client for a
judge model (`create_batch_client`). The clients (`batch_openai.OpenAIBatches`,
`batch_anthropic.AnthropicBatches`) and what they share (`batch_client`) sit below this module.

A client turns request bodies built by the online judge into batch lines, uploads them, polls,
downloads and reads the result lines back into reply bodies or errors. It never decides
verdicts: the judge's own `read_response` and the tolerant parser do, exactly as online.
"""

from __future__ import annotations

from typing import Any

from connectors.judges.batch_anthropic import AnthropicBatches
from connectors.judges.batch_client import (
    BatchClient,
)
from connectors.judges.batch_openai import OpenAIBatches
from connectors.judges.conversation import HttpJudgeBase
from connectors.judges.registry import create_judge, split_model
from storage.core.errors import ConfigError
from storage.core.settings import JudgeSettings

__all__ = [
    "BATCH_PROVIDERS",
    "create_batch_client",
]

BATCH_PROVIDERS = ("openai", "anthropic")


def create_batch_client(settings: JudgeSettings, **kw: Any) -> BatchClient:
    """The batch client of `settings.model`'s provider; ConfigError for one without a batch API."""
    provider, _ = split_model(settings.model)
    if provider not in BATCH_PROVIDERS:
        raise ConfigError(
            f"--batch-api needs a provider with a batch API (openai/..., anthropic/...); "
            f"{settings.model!r} has none: drop --batch-api (or [judge] batch_api) for it"
        )
    judge = create_judge(settings)
    if not isinstance(judge, HttpJudgeBase):
        raise ConfigError(f"--batch-api: the judge {settings.model!r} is not an HTTP judge")
    if provider == "openai":
        return OpenAIBatches(judge, settings, **kw)
    return AnthropicBatches(judge, settings, **kw)
