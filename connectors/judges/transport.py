"""How a judge's request crosses the wire, and nothing more: `Transport` is one method
(`send` a request, get the status, body and headers back), `AiohttpTransport` is the real one.
Tests pass their own transport (tests/fakes/transport.py) to test the client without a server,
as httpx's `MockTransport` does. Retries, classification and parsing live above this layer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

__all__ = ["AiohttpTransport", "HttpRequest", "HttpResponse", "Transport", "normalize_base_url"]


def normalize_base_url(url: str) -> str:
    return url.strip().rstrip("/")


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One JSON request: method, URL, headers (auth included) and the JSON body."""

    method: str
    url: str
    headers: Mapping[str, str]
    json: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """What came back: the status, the body decoded as UTF-8 (bad bytes replaced), the headers."""

    status: int
    body: str
    headers: Mapping[str, str] = field(default_factory=dict)


class Transport(Protocol):
    """Sends one request. Raises on transport failures (timeouts, dropped connections): the
    client classifies them (`retry.classify_exception`) as it classifies statuses."""

    async def send(self, request: HttpRequest) -> HttpResponse: ...


class AiohttpTransport:
    """One aiohttp session (no connection cap: the run's gate limits calls in flight), made on
    first use and again when the event loop changes; `aclose` closes it."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self.session is None or self.session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0, ttl_dns_cache=300)
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            self.session = aiohttp.ClientSession(connector=connector, timeout=timeout)
            self._loop = loop
        return self.session

    async def send(self, request: HttpRequest) -> HttpResponse:
        session = self._session_now()
        async with session.request(
            request.method, request.url, json=request.json, headers=dict(request.headers)
        ) as resp:
            raw = await resp.read()
            return HttpResponse(resp.status, raw.decode("utf-8", "replace"), resp.headers)

    async def aclose(self) -> None:
        session, self.session = self.session, None
        if session is not None and not session.closed:
            await session.close()
