"""How every request of ctxprec crosses the wire, and nothing more: `Transport` is one method
(`send` a request, get the status, body and headers back); `StreamingTransport` adds `stream`
(the reply's body read block by block, for batch result files); `AiohttpTransport` is the real
one. The online judge and the batch clients both send through it, as openai-python's
`_base_client` serves every request. Tests pass their own transport (tests/fakes/transport.py)
to test a client without a server, as httpx's `MockTransport` does. Retries, classification and
parsing live above this layer (client.py, batch_client.py, retry.py). Bodies are decoded here,
not by aiohttp: gzip and deflate (all ctxprec asks for) through a decompressor that never gives
more than it is asked, so a reply's cap holds on its decoded bytes.
"""

from __future__ import annotations

import asyncio
import secrets
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from ctxprec.connectors.judges import jsonfast
from ctxprec.storage.core.errors import JudgeFatalError

__all__ = [
    "AiohttpTransport",
    "HttpRequest",
    "HttpResponse",
    "HttpStream",
    "StreamingTransport",
    "Transport",
    "multipart_form",
    "normalize_base_url",
]


def normalize_base_url(url: str) -> str:
    return url.strip().rstrip("/")


@dataclass(slots=True)  # (not frozen: a frozen dataclass's __init__ costs a call per field)
class HttpRequest:
    """One request: method, URL, headers (auth included) and the JSON body, or `content`: the
    body's bytes as they are sent (a multipart form, a pre-built JSON body; b"" for none)."""

    method: str
    url: str
    headers: Mapping[str, str]
    json: dict[str, Any] = field(default_factory=dict)
    content: bytes | None = None


@dataclass(slots=True)
class HttpResponse:
    """What came back: the status, the body decoded as UTF-8 (bad bytes replaced), the headers."""

    status: int
    body: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HttpStream:
    """A reply whose body is read as it arrives: the status, the headers, the body's blocks."""

    status: int
    headers: Mapping[str, str]
    blocks: AsyncIterator[bytes]


class Transport(Protocol):
    """Sends one request. Raises on transport failures (timeouts, dropped connections): the
    client classifies them (`retry.classify_exception`) as it classifies statuses."""

    async def send(self, request: HttpRequest) -> HttpResponse: ...


class StreamingTransport(Transport, Protocol):
    """A transport that can also hand a reply's body over block by block (large downloads)."""

    def stream(self, request: HttpRequest) -> AbstractAsyncContextManager[HttpStream]: ...


def multipart_form(
    fields: Mapping[str, str], files: Mapping[str, tuple[str, bytes, str]]
) -> tuple[bytes, str]:
    """A multipart/form-data body (`files`: name -> (filename, bytes, content type)) and its
    content-type header."""
    boundary = "ctxprec-" + secrets.token_hex(16)
    parts: list[bytes] = []
    for name, value in fields.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
        parts.append(head.encode() + value.encode() + b"\r\n")
    for name, (filename, data, kind) in files.items():
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{filename}"\r\nContent-Type: {kind}\r\n\r\n'
        )
        parts.append(head.encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


MAX_REPLY_BYTES = 4 << 20  # one judge reply: a verdict, or a row's verdicts, is a few KB
ACCEPT_ENCODING = "gzip, deflate"  # what ctxprec decodes (`_Decoder`), so all it asks for
CONNECT_TIMEOUT_S = 10.0  # a TCP connection not made by then: the host is not answering
_STREAM_BLOCK = 1 << 20  # decoded bytes of one block of a streamed download, at most


class _Decoder:
    """A gzip or deflate body decoded a bounded step at a time: `feed` gives at most `limit`
    bytes and keeps the compressed input it did not get to. A bomb (400 MB from 408 KB) is
    thus never expanded further than its reader asks."""

    __slots__ = ("_gzip", "_tail", "_z", "encoding")

    def __init__(self, encoding: str) -> None:
        self.encoding, self._gzip = encoding, encoding in ("gzip", "x-gzip")
        self._z: Any = None
        self._tail = b""

    @classmethod
    def of(cls, header: str | None, status: int) -> _Decoder | None:
        """The decoder of a Content-Encoding header (None: the body is as sent); a coding
        ctxprec did not ask for is a failed call, not retried."""
        encoding = (header or "").strip().lower()
        if encoding in ("", "identity"):
            return None
        if encoding in ("gzip", "x-gzip", "deflate"):
            return cls(encoding)
        raise JudgeFatalError(
            f"reply in Content-Encoding {header!r} (HTTP {status}), which ctxprec did not ask "
            f"for: it reads {ACCEPT_ENCODING}",
            cause="reply_encoding",
            status=status,
        )

    def _start(self, data: bytes) -> Any:
        if self._gzip:
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        # deflate is a zlib stream (RFC 9110); some servers send the bare deflate data
        return zlib.decompressobj(zlib.MAX_WBITS if data[0] & 0x0F == 8 else -zlib.MAX_WBITS)

    def feed(self, data: bytes, limit: int) -> bytes:
        """Up to `limit` (>= 1) decoded bytes from what is left and `data`."""
        pending, out = self._tail + data if self._tail else data, []
        try:
            while pending and limit > 0:
                if self._z is None or self._z.eof:  # the first member, or the next one
                    self._z = self._start(pending)
                chunk = self._z.decompress(pending, limit)
                out.append(chunk)
                limit -= len(chunk)
                pending = self._z.unconsumed_tail or (self._z.unused_data if self._z.eof else b"")
        except zlib.error as exc:
            raise aiohttp.ClientPayloadError(f"reply body is not valid {self.encoding}") from exc
        self._tail = pending
        return b"".join(out)

    @property
    def pending(self) -> bool:
        """Whether compressed input is left that `feed` has not decoded yet."""
        return bool(self._tail)


async def _decoded(blocks: AsyncIterator[bytes], decoder: _Decoder) -> AsyncIterator[bytes]:
    """A streamed body's blocks decoded, none over _STREAM_BLOCK bytes."""
    async for block in blocks:
        out = decoder.feed(block, _STREAM_BLOCK)
        while out:
            yield out
            out = decoder.feed(b"", _STREAM_BLOCK) if decoder.pending else b""


class AiohttpTransport:
    """One aiohttp session (no connection cap: the run's throttle limits calls in flight), made on
    first use and again when the event loop changes; `aclose` closes it. `timeout_s` bounds a
    whole request, or with `per_read` each read of the socket (large uploads and downloads)."""

    def __init__(
        self, timeout_s: float, *, per_read: bool = False, max_reply_bytes: int = MAX_REPLY_BYTES
    ) -> None:
        self.timeout_s, self.per_read = timeout_s, per_read
        self.max_reply_bytes = max_reply_bytes
        self.session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self.session is None or self.session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0, ttl_dns_cache=300)
            if self.per_read:
                timeout = aiohttp.ClientTimeout(
                    total=None, sock_connect=30, sock_read=self.timeout_s
                )
            else:  # a host that never accepts the connection is said within seconds
                connect = min(CONNECT_TIMEOUT_S, self.timeout_s)
                timeout = aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=connect)
            # bodies given as `json` are encoded by jsonfast.dumps: json.dumps' text, faster;
            # bodies are decoded by `_Decoder`, bounded (aiohttp would expand them whole)
            self.session = aiohttp.ClientSession(
                connector=connector,
                timeout=timeout,
                json_serialize=jsonfast.dumps,
                auto_decompress=False,
                headers={"Accept-Encoding": ACCEPT_ENCODING},
            )
            self._loop = loop
        return self.session

    @staticmethod
    def _body(request: HttpRequest) -> dict[str, Any]:
        if request.content is not None:  # b"": no body at all (no content-type either)
            return {"data": request.content} if request.content else {}
        return {"json": request.json}

    async def send(self, request: HttpRequest) -> HttpResponse:
        session = self.session
        if session is None or session.closed or self._loop is not asyncio.get_running_loop():
            session = self._session_now()
        # aiohttp copies the headers into its own multidict: no copy of ours needed
        sent = session.request(
            request.method,
            request.url,
            headers=request.headers,
            allow_redirects=False,  # a 3xx is the caller's failed call (`retry.classify`)
            **self._body(request),
        )
        async with sent as resp:
            length = resp.content_length
            encoding = resp.headers.get("Content-Encoding")
            if length is None or length > self.max_reply_bytes or encoding is not None:
                raw = await self._capped(resp, encoding)  # chunked, said too big, or encoded
            else:
                raw = await resp.read()
            return HttpResponse(resp.status, raw.decode("utf-8", "replace"), resp.headers)

    async def _capped(self, resp: aiohttp.ClientResponse, encoding: str | None) -> bytes:
        """The body, decoded, read up to `max_reply_bytes` decoded bytes; a longer one is a
        failed call (not retried), read and decoded no further."""
        decoder = _Decoder.of(encoding, resp.status)
        blocks, size, cap = [], 0, self.max_reply_bytes
        async for block in resp.content.iter_chunked(1 << 16):
            if decoder is not None:  # one byte past the room left is enough to know
                block = decoder.feed(block, cap - size + 1)
            size += len(block)
            if size > cap:
                raise JudgeFatalError(
                    f"reply over {cap:,} bytes (HTTP {resp.status}{_decoded_from(encoding)}); "
                    "not read further: [judge] max_reply_bytes / CTXPREC_MAX_REPLY_BYTES raises "
                    "the limit",
                    cause="reply_too_large",
                    status=resp.status,
                )
            blocks.append(block)
        return b"".join(blocks)

    @asynccontextmanager
    async def stream(self, request: HttpRequest) -> AsyncIterator[HttpStream]:
        session = self._session_now()
        async with session.request(
            request.method,
            request.url,
            headers=dict(request.headers),
            allow_redirects=False,
            **self._body(request),
        ) as resp:
            blocks = resp.content.iter_chunked(_STREAM_BLOCK)
            decoder = _Decoder.of(resp.headers.get("Content-Encoding"), resp.status)
            yield HttpStream(
                resp.status, resp.headers, blocks if decoder is None else _decoded(blocks, decoder)
            )

    async def aclose(self) -> None:
        session, self.session = self.session, None
        if session is not None and not session.closed:
            await session.close()


def _decoded_from(encoding: str | None) -> str:
    return f", once decoded from {encoding}" if encoding else ""
