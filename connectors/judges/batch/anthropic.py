"""Anthropic Message Batches: POST /v1/messages/batches with `requests: [{custom_id, params}]`,
poll `processing_status` until `ended`, then stream `results_url`. Each `params` is the body the
online judge would POST to /v1/messages. The base URL is taken as the Anthropic SDK takes it
(without `/v1`); a trailing `/v1` is tolerated: the batches live under the judge's own API root.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from ctxprec.connectors.judges.batch.client import (
    BatchLimits,
    LineResult,
    ProviderBatches,
    RemoteBatch,
    json_line,
)
from ctxprec.connectors.judges.client import json_int
from ctxprec.connectors.judges.conversation import HttpJudgeBase
from ctxprec.storage.core.errors import JudgeFatalError, JudgeRetryableError
from ctxprec.storage.core.settings import JudgeSettings

__all__ = ["LIMITS", "AnthropicBatches"]

LIMITS = BatchLimits(100_000, 256 * 1024 * 1024)
_FATAL_TYPES = frozenset(
    {"invalid_request_error", "authentication_error", "permission_error", "not_found_error"}
)
_COUNTS = ("processing", "succeeded", "errored", "canceled", "expired")


def _time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class AnthropicBatches(ProviderBatches):
    provider = "anthropic"
    provider_limits = LIMITS

    def _locate(self, judge: HttpJudgeBase, settings: JudgeSettings) -> None:
        self.root = judge.base_url.removesuffix("/v1")  # the API root, as the SDK takes it
        self.url = f"{self.root}/v1/messages/batches"

    def _batch_url(self, batch_id: str) -> str:
        return f"{self.url}/{batch_id}"

    def line(self, custom_id: str, body: dict[str, Any]) -> bytes:
        return json_line({"custom_id": custom_id, "params": body})

    async def submit(
        self, name: str, path: Path, lines: int, on_file: Callable[[str], None],
        file_id: str | None = None,
    ) -> RemoteBatch:  # fmt: skip
        def body() -> tuple[bytes, str]:
            rows = [r for r in path.read_bytes().split(b"\n") if r.strip()]
            return b'{"requests":[' + b",".join(rows) + b"]}", "application/json"

        created = await self.http.json("POST", self.url, content=body)
        return self._remote(created)

    async def find(
        self, name: str, file_id: str | None, since: float, lines: int, claimed: set[str]
    ) -> str | None:
        """Message batches carry no metadata: a batch created after the intent was recorded
        (within 2 minutes of clock skew) with exactly this chunk's number of requests and not
        claimed by another chunk is taken to be the one a crash left unrecorded."""
        found: list[tuple[float, str]] = []
        async for b in self._recent(self.url, "after_id", since, _created):
            created = _created(b)
            counts = b.get("request_counts") or {}
            total = sum(json_int(counts.get(k)) for k in _COUNTS)
            if created >= since - 120 and total == lines and b.get("id") not in claimed:
                found.append((created, str(b["id"])))
        return min(found)[1] if found else None

    def _result_files(self, batch: RemoteBatch) -> list[tuple[str, dict[str, str]]]:
        url = (batch.raw or {}).get("results_url")
        if not url:
            raise JudgeRetryableError(
                f"batch {batch.id} has ended but has no results_url yet", cause="no_results_url"
            )
        return [(str(url), {"accept": "application/binary"})]

    @staticmethod
    def _result(custom_id: str, line: dict[str, Any]) -> LineResult:
        """succeeded → the Message; errored → its doubly nested error (invalid requests are
        fatal, server-side ones retryable); canceled and expired → retryable."""
        result: dict[str, Any] = line["result"] if isinstance(line.get("result"), dict) else {}
        kind = str(result.get("type"))
        if kind == "succeeded" and isinstance(result.get("message"), dict):
            return LineResult(custom_id, result["message"], None)
        if kind == "errored":
            outer: dict[str, Any] = result["error"] if isinstance(result.get("error"), dict) else {}
            inner: dict[str, Any] = (
                outer["error"] if isinstance(outer.get("error"), dict) else outer
            )
            etype = str(inner.get("type") or "api_error")
            message = f"{etype}: {inner.get('message') or 'errored'}"
            if outer.get("request_id"):
                message += f" (request {outer['request_id']})"
            if etype in _FATAL_TYPES:
                return LineResult(custom_id, None, JudgeFatalError(message, cause=etype))
            return LineResult(custom_id, None, JudgeRetryableError(message, cause=etype))
        cause = kind if kind in ("canceled", "expired") else "no_result"
        error = JudgeRetryableError(
            f"batch_{cause}: the request got no answer", cause=f"batch_{cause}"
        )
        return LineResult(custom_id, None, error)

    @staticmethod
    def _remote(data: dict[str, Any]) -> RemoteBatch:
        status = str(data.get("processing_status"))
        counts = data.get("request_counts") or {}
        total = sum(json_int(counts.get(k)) for k in _COUNTS)
        return RemoteBatch(
            id=str(data.get("id")),
            status=status,
            ended=status == "ended",
            total=total,
            answered=total - json_int(counts.get("processing")),
            created_at=_time(data.get("created_at")),
            raw=data,
        )


def _created(batch: dict[str, Any]) -> float:
    return _time(batch.get("created_at")) or 0.0
