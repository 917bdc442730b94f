"""Batch mode as the pipeline sees it: which providers have a batch API (the registry's `batch`
field: OpenAI's Files + Batches for openai, azure and groq, Message Batches for anthropic;
`check_batch_support`), and the client for a judge model (`create_batch_client`). The clients
(`batch_openai.OpenAIBatches`, `batch_anthropic.AnthropicBatches`) and what they share
(`batch_client`) sit below this module.

A client turns request bodies built by the online judge into batch lines, uploads them, polls,
downloads and reads the result lines back into reply bodies or errors. It never decides
verdicts: the judge's own `read_response` and the tolerant parser do, exactly as online.
"""

from __future__ import annotations

from ctxprec.connectors.judges.batch.anthropic import AnthropicBatches
from ctxprec.connectors.judges.batch.client import BatchClient
from ctxprec.connectors.judges.batch.openai import OpenAIBatches
from ctxprec.connectors.judges.catalog import providers
from ctxprec.connectors.judges.conversation import HttpJudgeBase
from ctxprec.connectors.judges.registry import create_judge, resolve_model
from ctxprec.connectors.judges.transport import StreamingTransport
from ctxprec.storage.core.errors import ConfigError
from ctxprec.storage.core.seams import DEFAULT, Seams
from ctxprec.storage.core.settings import JudgeSettings

__all__ = [
    "batch_providers",
    "check_batch_support",
    "create_batch_client",
]


def batch_providers(settings: JudgeSettings) -> list[str]:
    """The registry providers whose batch API ctxprec speaks."""
    from_registry = providers(settings.providers).values()
    return sorted(spec.id for spec in from_registry if spec.batch)


def check_batch_support(settings: JudgeSettings, who: str = "judge") -> str:
    """The batch API kind ("openai" or "anthropic") of `settings.model`'s provider; a clear
    ConfigError (exit 2, before any call) for a provider without one ctxprec speaks. `who`
    names the judge in it ("judge", or "audit judge" for `--audit-model`)."""
    provider, _, spec = resolve_model(settings.model, settings.providers)
    if spec is None or spec.batch is None:
        raise ConfigError(
            f"--batch-api sends the {who}'s calls through the provider's batch API; the {who} "
            f"{settings.model!r} ({provider}) has none that ctxprec speaks (OpenAI's Files + "
            f"Batches or Anthropic's Message Batches: {', '.join(batch_providers(settings))}): "
            "drop --batch-api (or [judge] batch_api = true) for it"
        )
    return spec.batch


def create_batch_client(
    settings: JudgeSettings,
    *,
    transport: StreamingTransport | None = None,
    seams: Seams = DEFAULT,
) -> BatchClient:
    """The batch client of `settings.model`'s provider; ConfigError for one without a batch API.
    Its requests go through `transport` (else the seams' transport, else aiohttp) and wait on
    the seams' clock (real waits unless it holds one); its key is read from the seams' keys."""
    kind = check_batch_support(settings)
    transport = transport or seams.transport
    judge = create_judge(settings, seams=seams)
    if not isinstance(judge, HttpJudgeBase):
        raise ConfigError(f"--batch-api: the judge {settings.model!r} is not an HTTP judge")
    if kind == "openai":
        return OpenAIBatches(judge, settings, transport=transport)
    return AnthropicBatches(judge, settings, transport=transport)
