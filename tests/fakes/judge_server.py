"""A real aiohttp judge server on 127.0.0.1 for tests and benchmarks: OpenAI chat-completions and
Anthropic messages shapes, seeded latency and faults (5xx, 429, garbage, drops, hangs), an RPM
limit, and request statistics. Run alone: `python -m tests.fakes.judge_server --port 0`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import email.utils
import hashlib
import json
import math
import random
import re
import signal
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = [
    "FakeJudgeConfig",
    "FakeJudgeServer",
    "FakeJudgeStats",
    "FakeJudgeThread",
    "expected_verdict",
    "flipped_item",
    "items_from_messages",
    "main",
    "reply_json",
    "running_fake_judge",
    "system_text",
    "wants_reasons",
]

ITEM_OPEN, ITEM_CLOSE = "<context_item>\n", "\n</context_item>"
ROW_ITEM = re.compile(r'<context_item index="\d+">\n(.*?)\n</context_item>', re.DOTALL)
_RANDOM_FAULTS = ("500", "503", "garbage_body", "garbage_content", "drop", "hang", "429")
_REASONS = {  # one sentence each, as long as a real judge's (~105 characters, ~26 tokens)
    True: "It states the specific fact the expected output relies on, so it directly helps answer "
    "the question asked.",
    False: "It is about a related topic but gives none of the facts the expected output needs, so "
    "it does not help.",
}
_FIXED_ERRORS = {
    "quota": (429, "You exceeded your current quota, please check your plan and billing."),
    "400_response_format": (400, "Invalid parameter: 'response_format' is not supported."),
}


async def start_loopback(
    app: web.Application, port: int, *, handler_cancellation: bool = True
) -> tuple[web.AppRunner, str]:
    """Serve `app` on 127.0.0.1:`port` (0: any free port): its runner and `http://127.0.0.1:PORT`.
    Every fake server starts this way; `runner.cleanup()` stops it."""
    runner = web.AppRunner(
        app, handler_cancellation=handler_cancellation, shutdown_timeout=0.5, access_log=None
    )
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    await web.SockSite(runner, sock).start()
    return runner, f"http://127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class FakeJudgeConfig:
    """How the server behaves: `script` outcomes first, in order, then seeded random faults.
    Outcomes: ok prose fenced 500 503 529 garbage_body garbage_content drop hang 429 (per
    retry_after_mode) 429_seconds 429_ms 429_date 429_ratelimit 429_none quota 4xx row_mismatch"""

    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    seed: int = 0
    overrides: dict[str, bool] = field(default_factory=dict)
    style: str = "json"  # json | prose | fenced: reply style without (or ignoring) a schema
    ignore_response_format: bool = False
    reject_response_format: bool = False  # answer 400 to any request carrying response_format
    p_500: float = 0.0
    p_503: float = 0.0
    p_garbage_body: float = 0.0  # HTTP 200 with an HTML body
    p_garbage_content: float = 0.0  # a proper envelope whose text holds no verdict
    p_drop: float = 0.0
    p_hang: float = 0.0
    p_429: float = 0.0
    hang_s: float = 30.0
    retry_after_mode: str = "seconds"  # seconds | ms | date | ratelimit | none
    retry_after_s: float = 1.0
    rpm_limit: int | None = None
    rpm_window_s: float = 60.0  # rpm_limit enforced over sliding windows this long (pro rata)
    require_key: str | None = None  # 401 (echoing the key sent) unless this key is presented
    script: list[str] = field(default_factory=list)
    # a judge that is not the truth: `flip_share` of items (chosen by a seeded hash of the item,
    # the same at every call) get the wrong verdict; `p_flip_call` flips each judged item of
    # each call at random (a judge that disagrees with itself); `p_row_drop` of multi-item row
    # replies lose their last verdict (seeded, drawn per reply)
    flip_share: float = 0.0
    p_flip_call: float = 0.0
    p_row_drop: float = 0.0
    # `p_flip_prompt` of (system prompt, item) pairs get the wrong verdict, drawn by a seeded
    # hash of both: the same at every call with that prompt, independent between prompts (a
    # judge whose borderline verdicts move with the prompt's wording, e.g. verdict-only or not)
    p_flip_prompt: float = 0.0


@dataclass
class FakeJudgeStats:
    """What the server saw. Item texts are counted once per request that carried them."""

    total: int = 0
    by_outcome: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    max_in_flight: int = 0
    timestamps: list[float] = field(default_factory=list)
    items: Counter[str] = field(default_factory=Counter)
    query_only: int = 0
    response_format_seen: int = 0
    auth_headers: list[str] = field(default_factory=list)
    bodies: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=1000))  # latest
    input_tokens: int = 0  # usage the server reported in its successful replies, summed
    output_tokens: int = 0

    def per_window(self, width_s: float = 1.0) -> Counter[int]:
        """Requests per window since the first one: per second by default, 60.0 per minute."""
        start = self.timestamps[0] if self.timestamps else 0.0
        return Counter(int((t - start) // width_s) for t in self.timestamps)

    def as_dict(self) -> dict[str, Any]:
        scalars = (
            "total", "max_in_flight", "query_only", "response_format_seen",
            "input_tokens", "output_tokens",
        )  # fmt: skip
        return {k: getattr(self, k) for k in scalars} | {
            "by_outcome": dict(self.by_outcome),
            "items_judged": self.items.total(), "distinct_items": len(self.items),
            "per_second": dict(self.per_window()),
        }  # fmt: skip


def expected_verdict(item: str, config: FakeJudgeConfig | None = None) -> bool:
    """The server's rule: the override if any, else sha256(item)[0] is even."""
    if config is not None and item in config.overrides:
        return config.overrides[item]
    return hashlib.sha256(item.encode("utf-8")).digest()[0] % 2 == 0


def flipped_item(item: str, seed: int = 0) -> float:
    """A uniform draw in [0, 1) fixed by the item and the seed: `flip_share` flips the items whose
    draw is below it."""
    digest = hashlib.sha256(f"{seed}:{item}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


_ESCAPED_TAG = re.compile(r"&lt;(/?\s*(?:context_item|query|expected_output)\b)", re.IGNORECASE)


def system_text(body: dict[str, Any]) -> str:
    """The system prompt of a request: Anthropic's `system` (text or blocks), else the system
    (or developer) messages, else the first user message (a model that takes no system role)."""
    system = body.get("system")
    if isinstance(system, list):
        return "".join(b.get("text", "") for b in system if isinstance(b, dict))
    if isinstance(system, str):
        return system
    messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
    texts = [m.get("content") for m in messages if m.get("role") in ("system", "developer")]
    texts = texts or [m.get("content") for m in messages if m.get("role") == "user"][:1]
    return "".join(t for t in texts if isinstance(t, str))


def _schema_of(body: dict[str, Any]) -> dict[str, Any] | None:
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return None
    schema = (
        (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else None
    )
    schema = schema if schema is not None else fmt.get("schema")
    return schema if isinstance(schema, dict) else None


def wants_reasons(body: dict[str, Any]) -> bool:
    """Does the request ask for a reason per verdict? A JSON schema decides, as a provider's
    constrained decoding writes exactly its fields (a strict schema without `reason` gets no
    reason); without one, the prompt does (a model writes what the instructions show)."""
    schema = _schema_of(body)
    if schema is not None:
        props = schema.get("properties") or {}
        if "verdicts" in props:
            props = ((props["verdicts"] or {}).get("items") or {}).get("properties") or {}
        return "reason" in props
    return '"reason"' in system_text(body)


def reply_json(verdicts: Sequence[bool], per_row: bool, reasons: dict[bool, str] | None) -> str:
    """The JSON a judge writes for these verdicts: one item's, or a row's numbered verdicts;
    with `reasons[verdict]` as each reason, or none (verdict-only)."""

    def one(v: bool) -> dict[str, Any]:
        return {"relevant": v} if reasons is None else {"relevant": v, "reason": reasons[v]}

    if per_row:
        return json.dumps({"verdicts": [{"index": i, **one(v)} for i, v in enumerate(verdicts)]})
    return json.dumps(one(verdicts[0]))


def _unescaped(text: str) -> str:
    """The item as its author wrote it: prompts escape our own tag names inside items."""
    return _ESCAPED_TAG.sub(r"<\1", text)


def items_from_messages(messages: Any) -> tuple[list[str], bool, bool]:
    """(item texts, per-row?, query-only?) recovered from the first user message."""
    users = [m.get("content") for m in messages or () if m.get("role") == "user"]
    text = next((u for u in users if isinstance(u, str)), "")
    query_only = "<expected_output>" not in text
    if ITEM_OPEN in text:  # one item: from the first opening tag to the last closing tag
        start = text.index(ITEM_OPEN) + len(ITEM_OPEN)
        return [_unescaped(text[start : text.rindex(ITEM_CLOSE)])], False, query_only
    items = [_unescaped(t) for t in ROW_ITEM.findall(text)]
    return items, bool(items), query_only


class FakeJudgeServer:
    """The server: `url` (…/v1), `stats`, and `config` (a copy; change it between requests)."""

    def __init__(self, config: FakeJudgeConfig | None = None) -> None:
        given = config or FakeJudgeConfig()  # copied: `script` is consumed as requests arrive
        self.config = dataclasses.replace(given, script=list(given.script))
        self.stats = FakeJudgeStats()
        self.url = ""
        self._rng = random.Random(self.config.seed)
        self._noise = random.Random(self.config.seed + 1)  # flips and drops: faults unchanged
        self._window: deque[float] = deque()
        self._runner: web.AppRunner | None = None

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/messages", self._handle)
        app.router.add_get("/_fake/stats", self._stats_view)
        self._runner, root = await start_loopback(app, port)
        self.url = f"{root}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _record(self, request: web.Request, body: dict[str, Any]) -> None:
        s = self.stats
        s.total += 1
        s.timestamps.append(time.monotonic())
        s.bodies.append(body)
        if (auth := _auth(request)) is not None:
            s.auth_headers.append(auth)
        s.response_format_seen += "response_format" in body
        items, _, query_only = items_from_messages(body.get("messages"))
        s.items.update(items)
        s.query_only += query_only and bool(items)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        self._record(request, body)
        self.stats.in_flight += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
        try:
            await self._delay()
            outcome = self._decide(request, body)
            self.stats.by_outcome[outcome] += 1
            return await self._respond(request, body, outcome)
        finally:
            self.stats.in_flight -= 1

    async def _delay(self) -> None:
        c = self.config
        jitter = self._rng.uniform(-c.jitter_ms, c.jitter_ms) if c.jitter_ms else 0.0
        await asyncio.sleep(max(0.0, c.latency_ms + jitter) / 1000.0)

    def _decide(self, request: web.Request, body: dict[str, Any]) -> str:
        c = self.config
        presented = (_auth(request) or "").removeprefix("Bearer ")
        if c.require_key is not None and presented != c.require_key:
            return "401"
        if c.script:
            return c.script.pop(0)
        if c.reject_response_format and "response_format" in body:
            return "400_response_format"
        if c.rpm_limit is not None and not self._admit(c.rpm_limit):
            return "rpm_429"
        draw = self._rng.random()
        for outcome in _RANDOM_FAULTS:
            draw -= getattr(c, f"p_{outcome}")
            if draw < 0:
                return outcome
        return "ok"

    def _admit(self, rpm: int) -> bool:
        now = time.monotonic()
        window = self.config.rpm_window_s
        while self._window and self._window[0] <= now - window:
            self._window.popleft()
        if len(self._window) >= rpm * window / 60.0:
            return False
        self._window.append(now)
        return True

    async def _respond(
        self, request: web.Request, body: dict[str, Any], outcome: str
    ) -> web.StreamResponse:
        anthropic = request.path.endswith("/messages")
        if outcome == "drop":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)
        if outcome == "hang":
            await asyncio.sleep(self.config.hang_s)
        if outcome == "garbage_body":
            return web.Response(text="<html>502 upstream glitch</html>", content_type="text/html")
        if outcome.startswith(("4", "5", "quota", "rpm")):
            return self._error(outcome, anthropic, request)
        text = self._reply_text(body, outcome)
        envelope = _envelope(anthropic, body, text)
        usage = envelope["usage"]
        self.stats.input_tokens += usage.get("input_tokens", usage.get("prompt_tokens", 0))
        self.stats.output_tokens += usage.get("output_tokens", usage.get("completion_tokens", 0))
        return web.json_response(envelope)

    def _reply_text(self, body: dict[str, Any], outcome: str) -> str:
        if outcome == "garbage_content":
            return "Hmm, that is hard to say without more context."
        items, per_row, _ = items_from_messages(body.get("messages"))
        system = system_text(body) if self.config.p_flip_prompt else ""
        verdicts = [self._verdict(item, system) for item in items]
        schema = "response_format" in body and not self.config.ignore_response_format
        style = outcome if outcome in ("prose", "fenced") else self.config.style
        reasons = _REASONS if wants_reasons(body) else None
        if per_row:
            drop = len(verdicts) > 1 and self._noise.random() < self.config.p_row_drop
            if drop:
                self.stats.by_outcome["row_drop"] += 1
            kept = verdicts[:-1] if outcome == "row_mismatch" or drop else verdicts
            return reply_json(kept, True, reasons)
        if not items:  # not a judging prompt (e.g. the reason prompt): plain prose
            return "Relevant items came first, which keeps the precision high."
        return _styled(verdicts[0], items[0], "json" if schema else style, reasons is not None)

    def _verdict(self, item: str, system: str = "") -> bool:
        c = self.config
        verdict = expected_verdict(item, c)
        if c.flip_share and flipped_item(item, c.seed) < c.flip_share:
            verdict = not verdict
        if c.p_flip_prompt and flipped_item(system + item, c.seed) < c.p_flip_prompt:
            verdict = not verdict
        if c.p_flip_call and self._noise.random() < c.p_flip_call:
            verdict = not verdict
        return verdict

    def _error(self, outcome: str, anthropic: bool, request: web.Request) -> web.Response:
        status, message, headers = self._error_parts(outcome, request)
        kind = "overloaded_error" if status == 529 else "api_error"
        if anthropic:
            payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
        else:
            code = "insufficient_quota" if outcome == "quota" else kind
            payload = {"error": {"message": message, "type": code, "code": code}}
        return web.json_response(payload, status=status, headers=headers)

    def _error_parts(self, outcome: str, request: web.Request) -> tuple[int, str, dict[str, str]]:
        if outcome in _FIXED_ERRORS:
            return *_FIXED_ERRORS[outcome], {}
        if outcome == "rpm_429":
            window = self.config.rpm_window_s
            wait = window - (time.monotonic() - self._window[0]) if self._window else 1.0
            return 429, "Rate limit (requests/min).", {"Retry-After": str(max(1, math.ceil(wait)))}
        if outcome.startswith("429"):
            mode = outcome.partition("_")[2] or self.config.retry_after_mode
            return 429, "Rate limit reached.", _retry_headers(mode, self.config.retry_after_s)
        if outcome == "401":
            return 401, f"Incorrect API key provided: {_auth(request)}.", {}
        return int(outcome), f"fake failure {outcome}", {}

    async def _stats_view(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats.as_dict())


def _auth(request: web.Request) -> str | None:
    return request.headers.get("Authorization") or request.headers.get("x-api-key")


def _retry_headers(mode: str, seconds: float) -> dict[str, str]:
    if mode == "seconds":
        return {"Retry-After": f"{seconds:g}"}
    if mode == "ms":
        return {"retry-after-ms": str(int(seconds * 1000))}
    if mode == "date":
        return {"Retry-After": email.utils.formatdate(time.time() + seconds, usegmt=True)}
    if mode == "ratelimit":
        return {
            "x-ratelimit-reset-requests": f"{seconds:g}s", "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-tokens": "6m0s", "x-ratelimit-remaining-tokens": "1000",
        }  # fmt: skip
    return {}


def _styled(verdict: bool, item: str, style: str, reason: bool = True) -> str:
    as_json = reply_json([verdict], False, _REASONS if reason else None)
    if style == "fenced":
        return f"Here is my verdict:\n```json\n{as_json}\n```"
    if style == "prose":  # the item quoted, as a careful judge quotes what it read
        snippet = " ".join(item.split())[:60]
        return f'Yes - it mentions "{snippet}".' if verdict else f'No - "{snippet}" does not help.'
    return as_json


def _envelope(anthropic: bool, body: dict[str, Any], text: str) -> dict[str, Any]:
    tokens_in = len(json.dumps(body.get("messages", ""))) // 4 + 1
    tokens_out = len(text) // 4 + 1
    model = body.get("model", "fake")
    if anthropic:
        return {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out},
        }  # fmt: skip
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                  "total_tokens": tokens_in + tokens_out},
    }  # fmt: skip


@contextlib.asynccontextmanager
async def running_fake_judge(
    config: FakeJudgeConfig | None = None, *, port: int = 0
) -> AsyncIterator[FakeJudgeServer]:
    """`async with running_fake_judge(cfg) as server:` — server.url is http://127.0.0.1:P/v1."""
    server = FakeJudgeServer(config)
    await server.start(port)
    try:
        yield server
    finally:
        await server.stop()


class FakeJudgeThread:
    """The server on its own event loop in a daemon thread, for synchronous tests:
    `with FakeJudgeThread(cfg) as server: ...`."""

    def __init__(self, config: FakeJudgeConfig | None = None, *, port: int = 0) -> None:
        self.server, self._port = FakeJudgeServer(config), port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> FakeJudgeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(self._port), self._loop).result(10)
        return self.server

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    casts = {"float": float, "int": int, "str": str, "int | None": int, "str | None": str}
    for f in dataclasses.fields(FakeJudgeConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, action="store_true")
        elif f.type in casts:
            parser.add_argument(flag, type=casts[str(f.type)], default=None)
    parser.add_argument("--script", nargs="*", default=[], help="outcomes served first")
    return parser


async def _serve_forever(config: FakeJudgeConfig, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running_fake_judge(config, port=port) as server:
        print(server.url, flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGINT/SIGTERM; prints the base URL (…/v1) on the first line of stdout.
    Stats as JSON: GET {root}/_fake/stats."""
    args = vars(_arg_parser().parse_args(argv))
    port = args.pop("port")
    given = {k: v for k, v in args.items() if v is not None and v is not False}
    asyncio.run(_serve_forever(FakeJudgeConfig(**given), port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
