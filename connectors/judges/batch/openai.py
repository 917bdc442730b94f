"""OpenAI's Batch API (and any server with its `/files` + `/batches`: Azure OpenAI, Groq): upload a
JSONL file with purpose=batch, create a batch on the provider's chat-completions endpoint
(`/v1/chat/completions`, Azure `/chat/completions`) with a 24h window, poll, download the output
and error files. Each line's body is the one the online judge would POST.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

from ctxprec.connectors.judges.batch.client import (
    BatchLimits,
    LineResult,
    ProviderBatches,
    RemoteBatch,
    json_line,
    line_error,
)
from ctxprec.connectors.judges.client import json_int
from ctxprec.connectors.judges.conversation import HttpJudgeBase
from ctxprec.connectors.judges.openai import OpenAIJudge
from ctxprec.connectors.judges.transport import multipart_form
from ctxprec.storage.core.errors import JudgeRetryableError
from ctxprec.storage.core.settings import JudgeSettings

__all__ = ["ENDPOINT", "LIMITS", "OpenAIBatches"]

ENDPOINT = "/v1/chat/completions"
LIMITS = BatchLimits(50_000, 200 * 1024 * 1024)
_ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
_RETRYABLE_BATCH_ERRORS = frozenset({"token_limit_exceeded", "rate_limit_exceeded"})


class OpenAIBatches(ProviderBatches):
    provider = "openai"
    provider_limits = LIMITS

    def _locate(self, judge: HttpJudgeBase, settings: JudgeSettings) -> None:
        if not isinstance(judge, OpenAIJudge):
            raise TypeError(f"OpenAI batches need an OpenAI-compatible judge, not {judge!r}")
        self.base = judge.base_url.partition("?")[0].rstrip("/")  # the judge's provider's API
        self.endpoint = judge.spec.batch_endpoint

    def _batch_url(self, batch_id: str) -> str:
        return f"{self.base}/batches/{batch_id}"

    def line(self, custom_id: str, body: dict[str, Any]) -> bytes:
        line = {"custom_id": custom_id, "method": "POST", "url": self.endpoint, "body": body}
        return json_line(line)

    async def submit(
        self, name: str, path: Path, lines: int, on_file: Callable[[str], None],
        file_id: str | None = None,
    ) -> RemoteBatch:  # fmt: skip
        if file_id is None:

            def form() -> tuple[bytes, str]:
                upload = (path.name, path.read_bytes(), "application/jsonl")
                return multipart_form({"purpose": "batch"}, {"file": upload})

            uploaded = await self.http.json("POST", f"{self.base}/files", content=form)
            file_id = str(uploaded["id"])
            on_file(file_id)
        created = await self.http.json(
            "POST",
            f"{self.base}/batches",
            body={
                "input_file_id": file_id,
                "endpoint": self.endpoint,
                "completion_window": "24h",
                "metadata": {"ctxprec_chunk": name},
            },
        )
        return self._remote(created)

    async def find(
        self, name: str, file_id: str | None, since: float, lines: int, claimed: set[str]
    ) -> str | None:
        """A batch created for chunk `name` (metadata) or from `file_id` before a crash. Without
        a recorded file id no batch can exist: the batch is created only after it is recorded."""
        if file_id is None:
            return None
        recent = self._recent(f"{self.base}/batches", "after", since, _created)
        async with aclosing(recent) as batches:
            async for b in batches:
                meta = b.get("metadata") or {}
                if b.get("id") in claimed:
                    continue
                if meta.get("ctxprec_chunk") == name or b.get("input_file_id") == file_id:
                    return str(b["id"])
        return None

    def _result_files(self, batch: RemoteBatch) -> list[tuple[str, dict[str, str]]]:
        raw = batch.raw or {}
        files = [raw.get(key) for key in ("output_file_id", "error_file_id")]
        return [(f"{self.base}/files/{file_id}/content", {}) for file_id in files if file_id]

    @staticmethod
    def _result(custom_id: str, line: dict[str, Any]) -> LineResult:
        """A BatchRequestOutput line: `error` for non-HTTP failures (expired, cancelled,
        timeout), else `response` whose status_code decides: 2xx is a reply body, anything else
        an error."""
        error = line.get("error")
        if isinstance(error, dict) and error:
            code = str(error.get("code") or "batch_error")
            message = f"{code}: {error.get('message') or 'no result'}"
            return LineResult(custom_id, None, JudgeRetryableError(message, cause=code))
        response = line.get("response")
        if not isinstance(response, dict):
            error = JudgeRetryableError("no response", cause="no_result")
            return LineResult(custom_id, None, error)
        status = json_int(response.get("status_code"))
        body = response.get("body")
        if 200 <= status < 300 and isinstance(body, dict):
            return LineResult(custom_id, body, None)
        return LineResult(custom_id, None, line_error(status or 500, body))

    @staticmethod
    def _remote(data: dict[str, Any]) -> RemoteBatch:
        status = str(data.get("status"))
        counts = data.get("request_counts") or {}
        error, retryable = None, False
        if status == "failed":
            errors = (data.get("errors") or {}).get("data") or [{}]
            first = errors[0] if isinstance(errors[0], dict) else {}
            code = str(first.get("code") or "batch_failed")
            error = f"{code}: {first.get('message') or 'the batch failed'}"
            retryable = code in _RETRYABLE_BATCH_ERRORS
        return RemoteBatch(
            id=str(data.get("id")),
            status=status,
            ended=status in _ENDED,
            total=json_int(counts.get("total")),
            answered=json_int(counts.get("completed")) + json_int(counts.get("failed")),
            created_at=float(json_int(data.get("created_at"))) or None,
            error=error,
            error_retryable=retryable,
            raw=data,
        )


def _created(batch: dict[str, Any]) -> float:
    return float(json_int(batch.get("created_at")))
