"""A judge answering valid JSON with a 10 MB reason drove a 60-call run to
2.7 GB of RSS and put 601 MB into the memo. A reply is read up to [judge] max_reply_bytes
(4 MiB by default); a longer one is a failed call, read no further; a reason is kept to
MAX_REASON_CHARS."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import polars as pl
import pytest

from ctxprec.connectors.judges.parse import MAX_REASON_CHARS
from tests.fakes.loopback import QuietServer
from tests.fakes.runs import score


def completion(reason: str) -> bytes:
    content = json.dumps({"relevant": True, "reason": reason})
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "judge-1",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }).encode()  # fmt: skip


def serve(monkeypatch: pytest.MonkeyPatch, body: bytes, *, chunked: bool) -> QuietServer:
    """A loopback judge answering every call with `body`, sized or chunked."""

    class Judge(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(0, len(body), 1 << 16):
                    block = body[i : i + (1 << 16)]
                    try:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                    except (BrokenPipeError, ConnectionResetError):
                        return  # the client stopped reading: what the cap is for
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    return

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = QuietServer(("127.0.0.1", 0), Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{server.server_address[1]}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-size-0123456789")
    return server


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.parquet"
    pl.DataFrame({"id": ["a"], "query": ["q"], "contexts": [["c1", "c2"]]}).write_parquet(path)
    return path


@pytest.fixture(params=[False, True], ids=["sized", "chunked"])
def huge(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    server = serve(monkeypatch, completion("x" * (10 << 20)), chunked=bool(request.param))
    yield
    server.shutdown()
    server.server_close()


@pytest.mark.usefixtures("huge")
def test_a_reply_over_the_limit_is_a_failed_call(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = score(source, "-o", out, "--model", "openai/judge-1", "--cache-dir", tmp_path / "m")
    err = capsys.readouterr().err
    assert code not in (0, 3), err
    rows = pl.read_parquet(out / "*.parquet")
    assert rows["status"].to_list() == ["failed"]
    assert "reply over 4,194,304 bytes" in str(rows["error"][0])
    memo = sum(p.stat().st_size for p in (tmp_path / "m").rglob("*") if p.is_file())
    assert memo < 1 << 20  # nothing of the reply was kept


def test_the_limit_is_a_setting(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(monkeypatch, completion("y" * 300_000), chunked=False)
    try:
        monkeypatch.setenv("CTXPREC_MAX_REPLY_BYTES", "100000")
        assert score(source, "-o", tmp_path / "small", "--model", "openai/judge-1") != 0
        monkeypatch.setenv("CTXPREC_MAX_REPLY_BYTES", "1000000")
        out = tmp_path / "big"
        assert score(source, "-o", out, "--model", "openai/judge-1") == 0
    finally:
        server.shutdown()
        server.server_close()
    reasons = pl.read_parquet(out / "*.parquet")["verdict_reasons"][0].to_list()
    assert len(reasons) == 2
    assert all(len(r) <= MAX_REASON_CHARS for r in reasons)
