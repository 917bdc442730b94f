"""The stdlib HTTP server the tests' small loopback fakes run on: a client that hangs up (the
product stops reading an oversized reply, gives up on a slow one, or simply ends) is how those
exchanges end, not an error, so it prints no traceback."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["QuietServer", "serving"]


class QuietServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose handler threads end quietly on a dropped connection (reset,
    broken pipe, aborted); any other error in a handler is still printed."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on 127.0.0.1 (a free port) from a thread: yields `http://127.0.0.1:PORT`,
    and stops the server on exit."""
    server = QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
