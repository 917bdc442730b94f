"""A 403 body holding NUL and ANSI escape bytes was printed raw to the
operator's terminal. Whatever a server sends reaches the terminal, the logs and the stored
errors with its control characters shown as escapes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from ctxprec.connectors.judges.retry import classify
from ctxprec.storage.core.printable import printable
from tests.fakes.inputs import REPO
from tests.fakes.loopback import serving
from tests.fakes.runs import score

HOSTILE = 'forbidden\x00\x1b[2J\x1b[31mALL GOOD\x1b[0m\r\x07 {"x": 1}'


def test_printable_escapes_control_characters() -> None:
    assert printable("a\x1b[31mb\x00c\r") == "a\\x1b[31mb\\x00c\\r"
    assert printable("line\nnext", lines=True) == "line\nnext"
    assert printable("line\nnext") == "line\\nnext"
    assert printable("é ünïcode ok") == "é ünïcode ok"
    assert printable("x" * 50, 10) == "x" * 10


def test_a_servers_error_body_is_shown_escaped() -> None:
    err = classify(403, HOSTILE)
    text = str(err)
    assert "\x1b" not in text
    assert "\x00" not in text
    assert "\\x1b[2J" in text


@pytest.fixture
def hostile_403(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A loopback judge answering every POST 403 with control characters in its JSON error
    body, as a misbehaving gateway would; OPENAI_BASE_URL points at it."""
    asked: list[str] = []
    body = json.dumps({"error": {"message": HOSTILE, "type": "permission_error"}}).encode()

    class Forbidden(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            asked.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Forbidden) as url:
        monkeypatch.setenv("OPENAI_BASE_URL", f"{url}/v1")
        yield asked


def test_the_terminal_gets_no_control_character_from_a_server(
    hostile_403: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = score(REPO / "examples" / "sample.parquet", "-o", tmp_path / "o", "--model",
                 "openai/judge-1")  # fmt: skip
    captured = capsys.readouterr()
    assert hostile_403
    assert code == 4, captured.err  # a 403 refuses the run
    shown = captured.out + captured.err
    assert "\x1b" not in shown
    assert "\x00" not in shown
    assert "\\x1b[2J" in shown, shown
