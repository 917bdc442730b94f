"""The test suite's own manners: everything it needs is in the repository (a fresh clone runs it
with nothing beside it), it reads and writes temp folders only, and its fake servers end quietly
when a client hangs up."""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import platformdirs
import pytest

from tests.conftest import _REAL_CACHE, _TOUCHED, _watch_real_cache
from tests.fakes.inputs import REPO, SAMPLE
from tests.fakes.loopback import QuietServer

# a path to the folder CI keeps beside its checkout: written out, or built in code from `parent`
_SIBLING = "shared"
_BESIDE = re.compile(rf"\.\.[/\\]{_SIBLING}\b|(?:parent|parents\[\d\])\s*/\s*['\"]{_SIBLING}['\"]")
_READ_BY_THE_REPOSITORY = ("pipeline", "connectors", "storage", "tests", "bench", "examples", ".ci")


def _tracked_texts() -> list[Path]:
    files = [REPO / "README.md", REPO / "pyproject.toml", *sorted(REPO.glob("docs/*.md"))]
    for top in _READ_BY_THE_REPOSITORY:
        files += [p for p in sorted((REPO / top).rglob("*")) if p.is_file()]
    return [p for p in files if ".venv" not in p.parts and p.suffix not in {".parquet", ".png"}]


def test_nothing_in_the_repository_reaches_for_a_folder_beside_it() -> None:
    """A clone has nothing beside it: no test, script or page names a folder beside the checkout
    (the HotpotQA log a test may use comes through CTXPREC_TEST_HOTPOT, the MAP vectors from
    tests/data)."""
    offenders = []
    for path in _tracked_texts():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        offenders += [
            f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}"
            for m in _BESIDE.finditer(text)
        ]
    assert offenders == []


def test_the_session_runs_in_a_temp_home() -> None:
    """HOME, the XDG folders and the memo folder of the whole session (and of every process a
    test starts) are temp folders, not the user's."""
    home = Path(os.environ["HOME"])
    assert home.name.startswith("ctxprec-tests-home-")
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        assert Path(os.environ[name]).is_relative_to(home), name
    assert Path(platformdirs.user_cache_dir("ctxprec")).is_relative_to(home)


def test_a_run_that_loses_its_memo_setting_still_writes_into_the_temp_home(
    tmp_path: Path,
) -> None:
    """A subprocess given the environment without CTXPREC_ variables (as the hot-path probes
    give it) falls back on the user cache dir, which is the session's temp home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPREC_")}
    argv = [sys.executable, "-m", "ctxprec", "score", str(SAMPLE), "-o", str(tmp_path / "out")]
    done = subprocess.run(
        [*argv, "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    memo = Path(os.environ["XDG_CACHE_HOME"]) / "ctxprec" / "memo"
    assert any(memo.iterdir())


def test_a_fake_server_ends_quietly_when_the_client_hangs_up(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The product stops reading an oversized reply and closes the connection: the fake's
    handler thread meets a reset / broken pipe and ends without a traceback."""
    handled = threading.Event()

    class Big(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(64 << 20))
            self.end_headers()
            for _ in range(1024):
                self.wfile.write(b"x" * (64 << 10))

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Watched(QuietServer):
        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                handled.set()  # after handle_error has had its say

    server = Watched(("127.0.0.1", 0), Big)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with socket.create_connection(server.server_address[:2]) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert sock.recv(1024).startswith(b"HTTP/1.")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert handled.wait(30)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert "Exception occurred" not in err


def test_reaching_into_the_real_cache_is_noticed() -> None:
    """The session's watch (an audit hook) notes a path under the user's real cache, and only
    such a path; the test that did it fails in its teardown."""
    inside = os.path.join(_REAL_CACHE, "memo", "cache.db")
    _watch_real_cache("sqlite3.connect", (inside,))
    _watch_real_cache("open", (os.path.join(os.environ["HOME"], "elsewhere"), "r", 0))
    _watch_real_cache("open", (3, "r", 0))  # a file descriptor names no path
    noticed = list(_TOUCHED)
    _TOUCHED.clear()  # or this very test would fail
    assert noticed == [f"sqlite3.connect {inside}"]
