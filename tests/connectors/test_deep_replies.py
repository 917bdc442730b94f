"""Deeply nested replies: a judge reply nested 100,000 levels deep raised RecursionError
and ended the whole run as an internal error (exit 3). Now such a reply is one unreadable
reply: a failed call, the run goes on and says so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import polars as pl
import pytest

from ctxprec.connectors.judges import jsonfast
from tests.fakes.loopback import serving
from tests.fakes.runs import score

DEEP = '{"a":' * 100_000 + "1" + "}" * 100_000


def test_jsonfast_reads_deep_nesting_as_unreadable() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        jsonfast.loads(DEEP)
    with pytest.raises(ValueError, match="nested too deeply"):
        jsonfast.loads("[" * 100_000 + "]" * 100_000)


def envelope(content: str) -> bytes:
    """An OpenAI chat completion whose message content is `content`."""
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "judge-1",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }).encode()  # fmt: skip


@pytest.fixture(params=["body", "content"])
def deep_judge(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A loopback judge whose 200 reply is nested 100,000 deep: the whole body, or the
    message content inside a proper envelope."""
    body = DEEP.encode() if request.param == "body" else envelope(DEEP)

    class Deep(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Deep) as url:
        monkeypatch.setenv("OPENAI_BASE_URL", f"{url}/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-deep-0123456789")
        yield str(request.param)


def test_a_deeply_nested_reply_is_one_failed_call(
    deep_judge: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.parquet"
    pl.DataFrame({"id": ["a"], "query": ["q"], "contexts": [["c1", "c2"]]}).write_parquet(source)
    out = tmp_path / "out"
    code = score(source, "-o", out, "--model", "openai/judge-1", "--max-retries", "0")
    err = capsys.readouterr().err
    assert "internal error" not in err, err
    assert "Traceback" not in err, err
    assert code not in (0, 3), err
    rows = pl.read_parquet(out / "*.parquet")
    assert rows["status"].to_list() == ["failed"]
