"""A loopback host that records every request it receives (path and Authorization header) and
answers 404: the host a planted state file names, which must receive nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

from tests.fakes.loopback import serving


@contextmanager
def recording_host() -> Iterator[tuple[str, list[str]]]:
    """(its base URL ending in /v1, the requests it received as "PATH AUTHORIZATION")."""
    asked: list[str] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(f"{self.path} {self.headers.get('Authorization')}")
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Recorder) as url:
        yield f"{url}/v1", asked
