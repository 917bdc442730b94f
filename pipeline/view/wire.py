"""What goes on the wire of `ctxprec view`, whatever route answers: the security headers every
reply carries, aiohttp's own error replies made the same way (a request it cannot parse: a request
line or header over 8,190 bytes, a duplicate Host, bytes that are not HTTP; none echoes what it
was sent), a connection closed when its request's head is not in by `Seams.view_header_s`, and
a 503 past `Seams.view_connections` open connections (a slow-loris client cannot hold them).
"""

from __future__ import annotations

import asyncio
import json
import logging
from functools import partial
from http import HTTPStatus
from typing import Any

from aiohttp import web

from ctxprec.storage.core.seams import Seams

__all__ = [
    "PAGE_CSP",
    "REPORT_CSP",
    "error_reply",
    "json_reply",
    "protocols",
    "secured",
]

log = logging.getLogger("ctxprec.view")

# the page and its script: scripts and styles from this server only, data from its API only
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# summary.html as written: its own inline styles and SVG, no script, nothing loaded
REPORT_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
_JSON = "application/json; charset=utf-8"
# the headers every reply carries (the Content-Security-Policy is chosen per route)
_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def json_reply(data: Any, status: int = 200) -> web.Response:
    text = json.dumps(data, ensure_ascii=False, default=str, allow_nan=False)
    return web.Response(text=text, status=status, content_type="application/json")


def error_reply(status: int, message: str) -> web.Response:
    return json_reply({"error": message, "status": status}, status)


def secured(response: web.StreamResponse, csp: str = PAGE_CSP) -> web.StreamResponse:
    response.headers.update({"Content-Security-Policy": csp, **_HEADERS})
    return response


class _Handler(web.RequestHandler):
    """aiohttp's HTTP protocol, whose own error replies (a request it cannot parse) are made as
    every other reply is: the security headers, a fixed message echoing nothing it was sent."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        log.debug("view: %s reply to a request it could not handle: %r", status, exc)
        if request.writer.output_size > 0:  # a reply is half sent: the connection is broken
            raise ConnectionError("a reply was sent already; cannot send an error reply")
        phrase = (
            HTTPStatus(status).phrase.lower() if status in HTTPStatus._value2member_map_ else ""
        )
        text = "a request the server cannot read" if status == 400 else phrase or "error"
        response = secured(error_reply(status, text))
        response.force_close()
        return response


def _busy_reply() -> bytes:
    body = json.dumps({"error": "too many open connections; try again", "status": 503})
    head = [
        "HTTP/1.1 503 Service Unavailable",
        f"Content-Type: {_JSON}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        f"Content-Security-Policy: {PAGE_CSP}",
        *(f"{k}: {v}" for k, v in _HEADERS.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n" + body).encode()


_BUSY = _busy_reply()


class _Busy(asyncio.Protocol):
    """A connection past the cap: one 503 reply and the end of the stream; what the client
    sends is read and dropped (closing on unread data would reset the connection before the
    reply is read) until it closes too, for a second at most."""

    _LINGER_S = 1.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_BUSY)
        if transport.can_write_eof():
            transport.write_eof()
        self._closing = asyncio.get_running_loop().call_later(self._LINGER_S, transport.close)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        pass  # dropped

    def eof_received(self) -> bool:
        self._transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing.cancel()


def protocols(server: web.Server, loop: asyncio.AbstractEventLoop, seams: Seams) -> Any:
    """The protocol factory of the viewer's listener (`loop.create_server`) over the app's
    aiohttp `server`."""
    return partial(_protocol, server, loop, seams)


def _protocol(
    server: web.Server, loop: asyncio.AbstractEventLoop, seams: Seams
) -> asyncio.Protocol:
    """The protocol of a new connection: aiohttp's (as `_Handler`), whose keep-alive timer,
    armed when the connection opens and after each reply, closes a connection still waiting
    for its request's head after `seams.view_header_s`; `_Busy` past the connection cap."""
    if len(server.connections) >= seams.view_connections:
        return _Busy()
    options: dict[str, Any] = {"keepalive_timeout": seams.view_header_s, "access_log": None}
    return _Handler(server, loop=loop, **options)
