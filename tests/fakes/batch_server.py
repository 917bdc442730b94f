"""A strict loopback fake of both provider batch APIs (OpenAI Batch, Anthropic Message Batches),
on the same verdict rule as the fake judge server (`FakeJudgeServer._verdict`, a `flip_share`
included), plus its online endpoints (to count, and serve, any online call).

OpenAI: POST /v1/files (multipart, purpose=batch, JSONL, ≤ max lines and bytes), POST /v1/batches
(completion_window "24h", a known endpoint, metadata), GET /v1/batches[/{id}], POST …/cancel,
GET /v1/files/{id}/content. Lifecycle validating → in_progress → finalizing → completed with
request_counts advancing; output shuffled; 4xx lines as response.status_code with the error in
the body; an error file; token_limit_exceeded failures; expiry with partial output and
batch_expired lines; cancelling → cancelled with partial output.

Anthropic: POST /v1/messages/batches (custom_id pattern and ≤ 64 characters → 400 at create),
GET /v1/messages/batches[/{id}], POST …/cancel, GET …/results. processing_status in_progress
with counts 0 until ended, results_url null until ended, results shuffled with all four
result types and the doubly nested errored.error.error.

Run alone: `python -m tests.fakes.batch_server --port 0 [--p-expire 0.2] [--hold]`; prints the
OpenAI base URL (…/v1). GET /_fake/stats gives the counts; POST /_fake/release ends a hold.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import re
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from tests.fakes.judge_server import (
    FakeJudgeConfig,
    FakeJudgeServer,
    _envelope,
    items_from_messages,
    reply_json,
    start_loopback,
    wants_reasons,
)

__all__ = ["BatchFakeConfig", "BatchFakeServer", "BatchFakeThread", "running_batch_fake"]

OPENAI_ENDPOINTS = frozenset(
    {
        "/v1/responses", "/v1/chat/completions", "/v1/embeddings", "/v1/completions",
        "/v1/moderations", "/v1/images/generations", "/v1/images/edits", "/v1/videos",
        "/chat/completions",  # Azure OpenAI's v1 API names it without /v1
    }
)  # fmt: skip
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_REASONS = {  # one sentence each, as long as a real judge's (~105 characters, ~26 tokens)
    True: "It states the specific fact the expected output relies on, so it directly helps answer "
    "the question asked.",
    False: "It is about a related topic but gives none of the facts the expected output needs, so "
    "it does not help.",
}


@dataclass
class BatchFakeConfig:
    """Timings are seconds after creation; shares are per line, drawn with `seed`."""

    seed: int = 0
    overrides: dict[str, bool] = field(default_factory=dict)  # item text -> verdict
    # a judge that is not the truth, as the fake judge server's (FakeJudgeConfig.flip_share
    # with seed `flip_seed`): the same items get the wrong verdict in batches and online
    flip_share: float = 0.0
    flip_seed: int = 0
    validate_s: float = 0.05
    process_s: float = 0.2
    finalize_s: float = 0.05
    cancel_s: float = 0.1  # cancelling -> cancelled
    hold: bool = False  # batches stay in_progress until POST /_fake/release
    p_expire: float = 0.0  # lines that expire (the batch then ends `expired`)
    p_line_5xx: float = 0.0  # lines answered 500 inside the response (retryable)
    p_garbage: float = 0.0  # a 200 whose text holds no verdict (unparseable)
    bad_items: set[str] = field(default_factory=set)  # items answered 400 (fatal)
    fail_batches: int = 0  # the next N batches fail as a whole: token_limit_exceeded
    max_lines: int = 50_000
    max_bytes: int = 200 * 1024 * 1024
    anthropic_max_requests: int = 100_000
    anthropic_max_bytes: int = 256 * 1024 * 1024
    require_key: str | None = None
    # where OpenAI's files and batches live (/v1; Groq /openai/v1, Azure /openai/v1) and the
    # header its key comes in (a bearer token; Azure's api-key)
    openai_root: str = "/v1"
    key_header: str = "authorization"
    poll_errors: int = 0  # the next N status requests are answered 503
    results_url_lag: int = 0  # Anthropic: polls of an ended batch still without results_url
    content_404: int = 0  # the next N result downloads: 404 (a file gone after its retention)


@dataclass
class BatchFakeStats:
    files: int = 0
    batches_created: int = 0
    lines: int = 0  # batch lines received (all batches)
    items: Counter[str] = field(default_factory=Counter)  # lines per item text
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)  # lines per (query, item)
    polls: int = 0
    list_calls: int = 0
    cancels: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    verdicts: dict[str, bool] = field(default_factory=dict)  # item -> verdict served

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files, "batches_created": self.batches_created, "lines": self.lines,
            "distinct_items": len(self.items), "distinct_pairs": len(self.pairs),
            "max_lines_per_pair": max(self.pairs.values(), default=0),
            "polls": self.polls, "list_calls": self.list_calls, "cancels": self.cancels,
            "rejected": dict(self.rejected),
        }  # fmt: skip


@dataclass
class _Line:
    custom_id: str
    body: dict[str, Any]
    fate: str  # ok | expire | 5xx | garbage | bad


@dataclass
class _Batch:
    id: str
    kind: str  # openai | anthropic
    created: float
    lines: list[_Line]
    input_file_id: str | None = None
    endpoint: str = "/v1/chat/completions"
    metadata: dict[str, Any] | None = None
    failed_error: dict[str, Any] | None = None
    cancel_at: float | None = None
    cancel_share: float = 0.0  # lines answered when the cancel came
    done_at: float | None = None  # set at the end (or at a hold's release)
    output_file_id: str | None = None
    error_file_id: str | None = None
    results: list[bytes] | None = None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _openai_error(status: int, message: str, code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": code}}  # fmt: skip
    return web.json_response(body, status=status)


def _anthropic_error(
    status: int, message: str, kind: str = "invalid_request_error"
) -> web.Response:
    body = {"type": "error", "error": {"type": kind, "message": message},
            "request_id": f"req_{uuid.uuid4().hex[:20]}"}  # fmt: skip
    return web.json_response(body, status=status)


class BatchFakeServer:
    def __init__(self, config: BatchFakeConfig | None = None) -> None:
        self.config = dataclasses.replace(config or BatchFakeConfig())
        self.stats = BatchFakeStats()
        c = self.config
        self.online = FakeJudgeServer(
            FakeJudgeConfig(overrides=c.overrides, flip_share=c.flip_share, seed=c.flip_seed)
        )
        self.url = ""  # OpenAI base URL (…/v1)
        self.root = ""  # Anthropic base URL (no /v1)
        self._files: dict[str, bytes] = {}
        self._batches: dict[str, _Batch] = {}
        self._rng = random.Random(self.config.seed)
        self._runner: web.AppRunner | None = None

    # -- server
    async def start(self, port: int = 0) -> None:
        app = web.Application(client_max_size=1024**3)
        r = app.router
        o = self.config.openai_root.rstrip("/")
        r.add_post(f"{o}/files", self._upload)
        r.add_get(f"{o}/files/{{id}}/content", self._content)
        r.add_post(f"{o}/batches", self._create_openai)
        r.add_get(f"{o}/batches", self._list_openai)
        r.add_get(f"{o}/batches/{{id}}", self._get_openai)
        r.add_post(f"{o}/batches/{{id}}/cancel", self._cancel_openai)
        r.add_post("/v1/messages/batches", self._create_anthropic)
        r.add_get("/v1/messages/batches", self._list_anthropic)
        r.add_get("/v1/messages/batches/{id}", self._get_anthropic)
        r.add_post("/v1/messages/batches/{id}/cancel", self._cancel_anthropic)
        r.add_get("/v1/messages/batches/{id}/results", self._results_anthropic)
        r.add_post("/v1/chat/completions", self.online._handle)
        r.add_post("/v1/messages", self.online._handle)
        r.add_get("/_fake/stats", self._stats_view)
        r.add_post("/_fake/release", self._release)
        self._runner, self.root = await start_loopback(app, port, handler_cancellation=False)
        self.url = f"{self.root}{o}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def release(self) -> None:
        """End the hold: batches still running end at once (as if the provider were done)."""
        self.config.hold = False
        c = self.config
        for b in self._batches.values():
            if b.done_at is None and b.cancel_at is None:
                b.created -= c.validate_s + c.process_s + c.finalize_s

    @property
    def online_calls(self) -> int:
        return self.online.stats.total

    def batch_count(self) -> int:
        return len(self._batches)

    # -- shared
    def _auth_ok(self, request: web.Request, anthropic: bool) -> bool:
        key = self.config.require_key
        if key is None:
            return True
        if anthropic:
            return request.headers.get("x-api-key") == key
        if self.config.key_header.lower() != "authorization":
            return request.headers.get(self.config.key_header) == key
        return request.headers.get("Authorization") == f"Bearer {key}"

    def _fate(self, body: dict[str, Any]) -> str:
        items, _, _ = items_from_messages(body.get("messages"))
        c = self.config
        if any(item in c.bad_items for item in items):
            return "bad"
        draw = self._rng.random()
        for fate, p in (("expire", c.p_expire), ("5xx", c.p_line_5xx), ("garbage", c.p_garbage)):
            draw -= p
            if draw < 0:
                return fate
        return "ok"

    def _count(self, body: dict[str, Any]) -> None:
        items, _, _ = items_from_messages(body.get("messages"))
        users = [m.get("content") for m in body.get("messages") or () if m.get("role") == "user"]
        text = next((u for u in users if isinstance(u, str)), "")
        query = text.split("</query>", 1)[0]
        self.stats.lines += 1
        for item in items:
            self.stats.items[item] += 1
            self.stats.pairs[(query, item)] += 1

    def _reply(self, body: dict[str, Any], anthropic: bool) -> dict[str, Any]:
        items, per_row, _ = items_from_messages(body.get("messages"))
        verdicts = [self.online._verdict(item) for item in items]  # the online fake's rule
        for item, v in zip(items, verdicts, strict=True):
            self.stats.verdicts[item] = v
        text = reply_json(verdicts, per_row, _REASONS if wants_reasons(body) else None)
        envelope = _envelope(anthropic, body, text)
        if anthropic:
            envelope["usage"]["service_tier"] = "batch"
        return envelope

    def _phase(self, b: _Batch, now: float) -> tuple[str, float]:
        """(phase, share of lines processed) at `now`."""
        c = self.config
        if b.failed_error is not None:
            return ("validating", 0.0) if now < b.created + c.validate_s else ("failed", 0.0)
        if b.done_at is not None:
            return "done", 1.0
        if b.cancel_at is not None:
            share = b.cancel_share
            return ("cancelling", share) if now < b.cancel_at + c.cancel_s else ("cancelled", share)
        t = now - b.created
        if t < c.validate_s:
            return "validating", 0.0
        if c.hold or t < c.validate_s + c.process_s:
            return "in_progress", self._share(b, now)
        if t < c.validate_s + c.process_s + c.finalize_s:
            return "finalizing", 1.0
        return "ended", 1.0

    def _share(self, b: _Batch, at: float) -> float:
        c = self.config
        t = at - b.created - c.validate_s
        if t <= 0:
            return 0.0
        share = min(1.0, t / c.process_s) if c.process_s > 0 else 1.0
        return min(share, 0.5) if c.hold else share

    def _finish(self, b: _Batch, processed_share: float, cancelled: bool) -> None:
        """Build the results once: lines past the processed share (or expired) get no answer."""
        b.done_at = time.time()
        cut = int(len(b.lines) * processed_share)
        out, err = [], []
        for i, line in enumerate(b.lines):
            fate = line.fate
            if cancelled and i >= cut:
                fate = "cancel"
            out_line, is_error = self._result_line(b, line, fate)
            (err if is_error else out).append(out_line)
        self._rng.shuffle(out)
        self._rng.shuffle(err)
        if b.kind == "anthropic":
            b.results = out + err
            self._rng.shuffle(b.results)
            return
        if out:
            b.output_file_id = self._store_file(b"".join(out))
        if err:
            b.error_file_id = self._store_file(b"".join(err))

    def _store_file(self, content: bytes) -> str:
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        self._files[file_id] = content
        return file_id

    def _result_line(self, b: _Batch, line: _Line, fate: str) -> tuple[bytes, bool]:
        if b.kind == "anthropic":
            result: dict[str, Any]
            if fate == "ok":
                result = {"type": "succeeded", "message": self._reply(line.body, True)}
            elif fate == "garbage":
                msg = self._reply(line.body, True)
                msg["content"] = [{"type": "text", "text": "Hard to say without more context."}]
                result = {"type": "succeeded", "message": msg}
            elif fate == "expire":
                result = {"type": "expired"}
            elif fate == "cancel":
                result = {"type": "canceled"}
            else:
                kind, text = (
                    ("invalid_request_error", "messages.0.content: bad item")
                    if fate == "bad"
                    else ("api_error", "Internal server error")
                )
                inner = {"type": kind, "message": text}
                rid = f"req_{uuid.uuid4().hex[:16]}"
                error = {"type": "error", "error": inner, "request_id": rid}
                result = {"type": "errored", "error": error}
            row = {"custom_id": line.custom_id, "result": result}
            return json.dumps(row).encode() + b"\n", fate != "ok"
        rid = f"batch_req_{uuid.uuid4().hex[:24]}"
        if fate in ("expire", "cancel"):
            code = "batch_expired" if fate == "expire" else "batch_cancelled"
            message = (
                "This request could not be executed before the completion window expired."
                if fate == "expire"
                else "This request was cancelled."
            )
            row = {"id": rid, "custom_id": line.custom_id, "response": None,
                   "error": {"code": code, "message": message}}  # fmt: skip
            return json.dumps(row).encode() + b"\n", True
        if fate in ("bad", "5xx"):
            status = 400 if fate == "bad" else 500
            err = {"error": {"message": "Invalid 'messages[1].content': bad item." if fate == "bad"
                             else "The server had an error while processing your request.",
                             "type": "invalid_request_error" if fate == "bad" else "server_error",
                             "param": None, "code": None}}  # fmt: skip
            response = {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}", "body": err}
            row = {"id": rid, "custom_id": line.custom_id, "response": response, "error": None}
            return json.dumps(row).encode() + b"\n", True  # non-2xx lines go to the error file
        body = self._reply(line.body, False)
        if fate == "garbage":
            body["choices"][0]["message"]["content"] = "Hard to say without more context."
        response = {"status_code": 200, "request_id": f"req_{uuid.uuid4().hex}", "body": body}
        row = {"id": rid, "custom_id": line.custom_id, "response": response, "error": None}
        return json.dumps(row).encode() + b"\n", False

    # -- OpenAI
    async def _upload(self, request: web.Request) -> web.Response:
        if not self._auth_ok(request, False):
            return _openai_error(401, "Incorrect API key provided.", "invalid_api_key")
        if not request.content_type.startswith("multipart/"):
            self.stats.rejected["not_multipart"] += 1
            return _openai_error(400, "Expected multipart/form-data.")
        form = await request.post()
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            self.stats.rejected["purpose"] += 1
            return _openai_error(400, f"Invalid purpose {purpose!r}; use 'batch'.")
        if not isinstance(upload, web.FileField):
            self.stats.rejected["no_file"] += 1
            return _openai_error(400, "Missing file.")
        content = upload.file.read()
        if len(content) > self.config.max_bytes:
            self.stats.rejected["too_large"] += 1
            return _openai_error(400, "File is too large for a batch (200 MB).")
        rows = [r for r in content.split(b"\n") if r.strip()]
        if len(rows) > self.config.max_lines:
            self.stats.rejected["too_many_lines"] += 1
            return _openai_error(400, f"A batch takes at most {self.config.max_lines} requests.")
        for r in rows:
            try:
                obj = json.loads(r)
            except ValueError:
                obj = None
            if not isinstance(obj, dict):
                self.stats.rejected["not_jsonl"] += 1
                return _openai_error(400, "The file is not valid JSONL.", "invalid_file_format")
        file_id = self._store_file(content)
        self.stats.files += 1
        return web.json_response({
            "id": file_id, "object": "file", "bytes": len(content), "created_at": int(time.time()),
            "filename": upload.filename, "purpose": "batch", "status": "processed",
        })  # fmt: skip

    async def _content(self, request: web.Request) -> web.Response:
        if not self._auth_ok(request, False):
            return _openai_error(401, "Incorrect API key provided.", "invalid_api_key")
        content = self._files.get(request.match_info["id"])
        if self.config.content_404 > 0:
            self.config.content_404 -= 1
            content = None
        if content is None:
            return _openai_error(404, "No such File object.")
        return web.Response(body=content, content_type="application/octet-stream")

    async def _create_openai(self, request: web.Request) -> web.Response:
        if not self._auth_ok(request, False):
            return _openai_error(401, "Incorrect API key provided.", "invalid_api_key")
        body = await request.json()
        if body.get("completion_window") != "24h":
            self.stats.rejected["completion_window"] += 1
            return _openai_error(400, "completion_window must be '24h'.")
        endpoint = body.get("endpoint")
        if endpoint not in OPENAI_ENDPOINTS:
            self.stats.rejected["endpoint"] += 1
            return _openai_error(400, f"Invalid endpoint {endpoint!r}.")
        meta = body.get("metadata")
        if meta is not None and (
            not isinstance(meta, dict) or len(meta) > 16
            or any(len(str(k)) > 64 or len(str(v)) > 512 for k, v in meta.items())
        ):  # fmt: skip
            return _openai_error(400, "Invalid metadata.")
        content = self._files.get(str(body.get("input_file_id")))
        if content is None:
            return _openai_error(404, "No such File object.")
        batch = _Batch(f"batch_{uuid.uuid4().hex[:24]}", "openai", time.time(), [],
                       input_file_id=body["input_file_id"], endpoint=endpoint,
                       metadata=meta)  # fmt: skip
        batch.failed_error = self._validate_openai(batch, content)
        if batch.failed_error is None and self.config.fail_batches > 0:
            self.config.fail_batches -= 1
            batch.failed_error = {
                "code": "token_limit_exceeded", "line": None, "param": None,
                "message": "Enqueued token limit reached for judge in organization org-fake. "
                "Limit: 2,000,000 enqueued tokens. Please try again once some in_progress "
                "batches have been completed.",
            }  # fmt: skip
        if batch.failed_error is None:
            for line in batch.lines:
                self._count(line.body)
        self._batches[batch.id] = batch
        self.stats.batches_created += 1
        return web.json_response(self._openai_view(batch))

    def _validate_openai(self, b: _Batch, content: bytes) -> dict[str, Any] | None:
        seen: set[str] = set()
        model = None
        for n, raw in enumerate((r for r in content.split(b"\n") if r.strip()), start=1):
            obj = json.loads(raw)
            cid, body = obj.get("custom_id"), obj.get("body")

            def bad(code: str, message: str, line: int = n) -> dict[str, Any]:
                return {"code": code, "line": line, "message": message, "param": None}

            if not isinstance(cid, str) or not cid:
                return bad("missing_required_parameter", "custom_id is required.")
            if cid in seen:
                return bad("duplicate_custom_id", f"The custom_id {cid!r} is not unique.")
            seen.add(cid)
            if obj.get("method") != "POST":
                return bad("invalid_method", "Only POST is supported.")
            if obj.get("url") != b.endpoint:
                return bad("mismatched_url", f"url {obj.get('url')!r} is not {b.endpoint!r}.")
            if not isinstance(body, dict) or "model" not in body:
                return bad("missing_required_parameter", "body.model is required.")
            if model is not None and body["model"] != model:
                return bad("mismatched_model", "All requests in a batch must use one model.")
            model = body["model"]
            b.lines.append(_Line(cid, body, self._fate(body)))
        if not b.lines:
            return {"code": "empty_file", "line": None, "message": "The file is empty.",
                    "param": None}  # fmt: skip
        return None

    def _openai_view(self, b: _Batch) -> dict[str, Any]:
        now = time.time()
        phase, share = self._phase(b, now)
        total = len(b.lines)
        view: dict[str, Any] = {
            "id": b.id, "object": "batch", "endpoint": b.endpoint, "errors": None,
            "input_file_id": b.input_file_id, "completion_window": "24h",
            "created_at": int(b.created), "expires_at": int(b.created) + 86400,
            "in_progress_at": None, "finalizing_at": None, "completed_at": None,
            "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "output_file_id": None, "error_file_id": None, "metadata": b.metadata,
            "model": b.lines[0].body.get("model") if b.lines else None,
            "request_counts": {"total": total, "completed": 0, "failed": 0},
        }  # fmt: skip
        if phase == "failed":
            assert b.failed_error is not None
            view.update(status="failed", failed_at=int(now),
                        errors={"object": "list", "data": [b.failed_error]})  # fmt: skip
            view["request_counts"] = {"total": 0, "completed": 0, "failed": 0}
            return view
        if phase in ("ended", "cancelled") and b.done_at is None:
            self._finish(b, share, cancelled=phase == "cancelled")
        bad = sum(1 for x in b.lines if x.fate in ("expire",))
        if b.done_at is not None:
            expired = b.cancel_at is None and bad > 0
            status = (
                "cancelled" if b.cancel_at is not None else ("expired" if expired else "completed")
            )
            failed = len((self._files.get(b.error_file_id or "") or b"").splitlines())
            view.update(status=status, output_file_id=b.output_file_id,
                        error_file_id=b.error_file_id)  # fmt: skip
            view["request_counts"] = {"total": total, "completed": total - failed, "failed": failed}
            view[f"{status}_at"] = int(b.done_at)
            return view
        done = int(total * share)
        view["status"] = phase
        view["request_counts"] = {"total": total, "completed": done, "failed": 0}
        return view

    async def _get_openai(self, request: web.Request) -> web.Response:
        if not self._auth_ok(request, False):
            return _openai_error(401, "Incorrect API key provided.", "invalid_api_key")
        self.stats.polls += 1
        if self.config.poll_errors > 0:
            self.config.poll_errors -= 1
            body = {"error": {"message": "The server is overloaded.", "type": "server_error",
                              "param": None, "code": "server_is_overloaded"}}  # fmt: skip
            return web.json_response(body, status=503)
        b = self._batches.get(request.match_info["id"])
        if b is None or b.kind != "openai":
            return _openai_error(404, "No such batch.")
        return web.json_response(self._openai_view(b))

    async def _list_openai(self, request: web.Request) -> web.Response:
        if not self._auth_ok(request, False):
            return _openai_error(401, "Incorrect API key provided.", "invalid_api_key")
        self.stats.list_calls += 1
        limit = min(100, int(request.query.get("limit", "20")))
        ordered = sorted((b for b in self._batches.values() if b.kind == "openai"),
                         key=lambda b: b.created, reverse=True)  # fmt: skip
        after = request.query.get("after")
        if after is not None:
            ids = [b.id for b in ordered]
            ordered = ordered[ids.index(after) + 1 :] if after in ids else []
        page = ordered[:limit]
        data = [self._openai_view(b) for b in page]
        return web.json_response({
            "object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit,
        })  # fmt: skip

    async def _cancel_openai(self, request: web.Request) -> web.Response:
        if not self._auth_ok(request, False):
            return _openai_error(401, "Incorrect API key provided.", "invalid_api_key")
        b = self._batches.get(request.match_info["id"])
        if b is None or b.kind != "openai":
            return _openai_error(404, "No such batch.")
        phase, _ = self._phase(b, time.time())
        if phase in ("validating", "in_progress", "finalizing"):
            self.stats.cancels += 1
            b.cancel_at = time.time()
            b.cancel_share = self._share(b, b.cancel_at)
        return web.json_response(self._openai_view(b))

    # -- Anthropic
    def _anthropic_headers_ok(self, request: web.Request) -> web.Response | None:
        if "anthropic-version" not in request.headers:
            return _anthropic_error(400, "anthropic-version: header is required")
        if not self._auth_ok(request, True):
            return _anthropic_error(401, "x-api-key header is required", "authentication_error")
        return None

    async def _create_anthropic(self, request: web.Request) -> web.Response:
        if (bad := self._anthropic_headers_ok(request)) is not None:
            return bad
        raw = await request.read()
        if len(raw) > self.config.anthropic_max_bytes:
            return _anthropic_error(413, "Request exceeds the maximum size", "request_too_large")
        try:
            body = json.loads(raw)
        except ValueError:
            return _anthropic_error(400, "The request body is not valid JSON.")
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            return _anthropic_error(400, "requests: Field required")
        if len(requests) > self.config.anthropic_max_requests:
            return _anthropic_error(400, "requests: too many requests in one batch")
        seen: set[str] = set()
        lines = []
        for i, req in enumerate(requests):
            cid = req.get("custom_id") if isinstance(req, dict) else None
            if not isinstance(cid, str) or len(cid) > 64:
                self.stats.rejected["custom_id"] += 1
                return _anthropic_error(
                    400, f"requests.{i}.custom_id: String should have at most 64 characters"
                )
            if not CUSTOM_ID.match(cid):
                self.stats.rejected["custom_id"] += 1
                return _anthropic_error(
                    400, f"requests.{i}.custom_id: String should match pattern "
                    "'^[a-zA-Z0-9_-]{1,64}$'",
                )  # fmt: skip
            if cid in seen:
                return _anthropic_error(400, f"requests.{i}.custom_id: duplicate custom_id {cid}")
            seen.add(cid)
            params = req.get("params")
            if not isinstance(params, dict) or "max_tokens" not in params:
                return _anthropic_error(400, f"requests.{i}.params.max_tokens: Field required")
            lines.append(_Line(cid, params, self._fate(params)))
        for line in lines:
            self._count(line.body)
        b = _Batch(f"msgbatch_{uuid.uuid4().hex[:24]}", "anthropic", time.time(), lines)
        self._batches[b.id] = b
        self.stats.batches_created += 1
        return web.json_response(self._anthropic_view(b))

    def _anthropic_view(self, b: _Batch) -> dict[str, Any]:
        now = time.time()
        phase, share = self._phase(b, now)
        if phase in ("ended", "cancelled") and b.done_at is None:
            self._finish(b, share, cancelled=phase == "cancelled")
        total = len(b.lines)
        counts = {"processing": total, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        view: dict[str, Any] = {
            "id": b.id, "type": "message_batch", "created_at": _iso(b.created),
            "expires_at": _iso(b.created + 86400), "ended_at": None, "archived_at": None,
            "cancel_initiated_at": _iso(b.cancel_at) if b.cancel_at else None,
            "results_url": None, "request_counts": counts,
            "processing_status": "canceling" if b.cancel_at else "in_progress",
        }  # fmt: skip
        if b.done_at is None or b.results is None:
            return view  # counts stay 0 (all processing) until the whole batch ends
        kinds: Counter[str] = Counter()
        for row in b.results:
            kinds[json.loads(row)["result"]["type"]] += 1
        view["request_counts"] = {"processing": 0, **{k: kinds[k] for k in
                                  ("succeeded", "errored", "canceled", "expired")}}  # fmt: skip
        view.update(processing_status="ended", ended_at=_iso(b.done_at),
                    results_url=f"{self.root}/v1/messages/batches/{b.id}/results")  # fmt: skip
        return view

    async def _get_anthropic(self, request: web.Request) -> web.Response:
        if (bad := self._anthropic_headers_ok(request)) is not None:
            return bad
        self.stats.polls += 1
        if self.config.poll_errors > 0:
            self.config.poll_errors -= 1
            return _anthropic_error(529, "Overloaded", "overloaded_error")
        b = self._batches.get(request.match_info["id"])
        if b is None or b.kind != "anthropic":
            return _anthropic_error(404, "No such batch.", "not_found_error")
        view = self._anthropic_view(b)
        if view["processing_status"] == "ended" and self.config.results_url_lag > 0:
            self.config.results_url_lag -= 1
            view["results_url"] = None
        return web.json_response(view)

    async def _list_anthropic(self, request: web.Request) -> web.Response:
        if (bad := self._anthropic_headers_ok(request)) is not None:
            return bad
        self.stats.list_calls += 1
        limit = min(100, int(request.query.get("limit", "20")))
        ordered = sorted((b for b in self._batches.values() if b.kind == "anthropic"),
                         key=lambda b: b.created, reverse=True)  # fmt: skip
        after = request.query.get("after_id")
        if after is not None:
            ids = [b.id for b in ordered]
            ordered = ordered[ids.index(after) + 1 :] if after in ids else []
        data = [self._anthropic_view(b) for b in ordered[:limit]]
        return web.json_response({
            "data": data, "has_more": len(ordered) > limit,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        })  # fmt: skip

    async def _cancel_anthropic(self, request: web.Request) -> web.Response:
        if (bad := self._anthropic_headers_ok(request)) is not None:
            return bad
        b = self._batches.get(request.match_info["id"])
        if b is None or b.kind != "anthropic":
            return _anthropic_error(404, "No such batch.", "not_found_error")
        if b.done_at is None and b.cancel_at is None:
            self.stats.cancels += 1
            b.cancel_at = time.time()
            b.cancel_share = self._share(b, b.cancel_at)
        return web.json_response(self._anthropic_view(b))

    async def _results_anthropic(self, request: web.Request) -> web.StreamResponse:
        if (bad := self._anthropic_headers_ok(request)) is not None:
            return bad
        b = self._batches.get(request.match_info["id"])
        if self.config.content_404 > 0:
            self.config.content_404 -= 1
            b = None
        if b is None or b.kind != "anthropic" or b.results is None:
            return _anthropic_error(404, "No results for this batch (yet).", "not_found_error")
        return web.Response(body=b"".join(b.results), content_type="application/binary")

    # -- control
    async def _stats_view(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                **self.stats.as_dict(),
                "online_calls": self.online_calls,
                "batches": len(self._batches),
            }
        )

    async def _release(self, request: web.Request) -> web.Response:
        self.release()
        return web.json_response({"released": True})


@contextlib.asynccontextmanager
async def running_batch_fake(
    config: BatchFakeConfig | None = None, *, port: int = 0
) -> AsyncIterator[BatchFakeServer]:
    server = BatchFakeServer(config)
    await server.start(port)
    try:
        yield server
    finally:
        await server.stop()


class BatchFakeThread:
    """`with BatchFakeThread(cfg) as server:` — the server on its own loop in a daemon thread."""

    def __init__(self, config: BatchFakeConfig | None = None, *, port: int = 0) -> None:
        self.server, self._port = BatchFakeServer(config), port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> BatchFakeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(self._port), self._loop).result(10)
        return self.server

    def call(self, fn: Any) -> Any:
        """Run `fn()` on the server's loop (to change its state between requests safely)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--p-expire", type=float, default=0.0)
    parser.add_argument("--p-line-5xx", type=float, default=0.0)
    parser.add_argument("--process-s", type=float, default=0.2)
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args(argv)
    config = BatchFakeConfig(
        seed=args.seed, p_expire=args.p_expire, p_line_5xx=args.p_line_5xx,
        process_s=args.process_s, hold=args.hold,
    )  # fmt: skip

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with running_batch_fake(config, port=args.port) as server:
            print(server.url, flush=True)
            await stop.wait()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
