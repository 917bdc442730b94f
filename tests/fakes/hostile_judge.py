"""A loopback aiohttp judge that misbehaves on purpose: each reply is made by the test's own
`answer` function (compressed bodies, prose verdicts, absurd usage counts), in the OpenAI
chat-completions or Anthropic messages envelope; every request body is kept."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.fakes.judge_server import start_loopback

__all__ = ["HostileJudge", "Reply", "anthropic_message", "chat_completion"]

# what a test's `answer` gives back for one request: a ready response, or the text of the
# verdict (wrapped in the envelope of the path asked) with the usage to report
Reply = web.StreamResponse | str
Answer = Callable[[str, dict[str, Any]], Reply]


def chat_completion(content: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """An OpenAI chat completion whose message content is `content`."""
    return {
        "id": "chatcmpl-hostile", "object": "chat.completion", "created": int(time.time()),
        "model": "judge-1", "system_fingerprint": None,
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": content, "refusal": None}}],
        "usage": usage if usage is not None
        else {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49},
    }  # fmt: skip


def anthropic_message(content: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """An Anthropic message whose text is `content`."""
    return {
        "id": "msg_hostile", "type": "message", "role": "assistant", "model": "judge-1",
        "content": [{"type": "text", "text": content}], "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage if usage is not None else {"input_tokens": 40, "output_tokens": 9},
    }  # fmt: skip


class HostileJudge:
    """`with HostileJudge(answer) as judge:` serves …/v1/chat/completions and …/v1/messages
    on 127.0.0.1 (`judge.url` is the …/v1 base URL) from its own thread. `answer(path, body)`
    gives each reply; `usage` is the usage a text reply reports (None: a plain one)."""

    def __init__(self, answer: Answer, usage: dict[str, Any] | None = None) -> None:
        self.answer, self.usage = answer, usage
        self.bodies: list[dict[str, Any]] = []
        self.on_request: Callable[[web.Request], None] | None = None  # sees each request first
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.on_request is not None:
            self.on_request(request)
        body = await request.json()
        self.bodies.append(body)
        reply = self.answer(request.path, body)
        if isinstance(reply, web.StreamResponse):
            return reply
        if request.path.endswith("/messages"):
            return web.json_response(anthropic_message(reply, self.usage))
        return web.json_response(chat_completion(reply, self.usage))

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/messages", self._handle)
        self._runner, root = await start_loopback(app, 0)
        self.url = f"{root}/v1"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def __enter__(self) -> HostileJudge:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def texts_sent(self) -> list[str]:
        """Every message text of every request, in order (what the judge was shown)."""
        out = []
        for body in self.bodies:
            for message in body.get("messages") or ():
                content = message.get("content")
                out.append(content if isinstance(content, str) else json.dumps(content))
        return out
