"""A judge that answers 307 to another host. aiohttp follows redirects by
default, so every prompt (and the bearer key) went to the host the reply named. A judge call
now follows no redirect: the 3xx is a failed call naming where it pointed, and the other host
receives nothing."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import polars as pl
import pytest

from tests.fakes.judge_server import FakeJudgeServer
from tests.fakes.loopback import serving
from tests.fakes.runs import score

HTTP = ("--model", "openai/judge-1")


@pytest.fixture
def redirecting(fake: FakeJudgeServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A loopback judge that answers every POST with 307 to the fake judge (another port);
    OPENAI_BASE_URL points at it. Yields the paths it was asked for."""
    asked: list[str] = []

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            asked.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(307)
            self.send_header("Location", f"{fake.url}/chat/completions")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Redirect) as url:
        monkeypatch.setenv("OPENAI_BASE_URL", f"{url}/v1")
        yield asked


def test_a_redirect_is_a_failed_call_and_the_other_host_gets_nothing(
    redirecting: list[str],
    fake: FakeJudgeServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = tmp_path / "in.parquet"
    pl.DataFrame(
        {"id": ["a", "b"], "query": ["q1", "q2"], "contexts": [["c1", "c2"], ["c3"]]}
    ).write_parquet(source)
    out = tmp_path / "out"
    code = score(source, "-o", out, *HTTP, "--max-retries", "0")
    err = capsys.readouterr().err
    assert fake.stats.total == 0  # the host the 307 named received no request
    assert redirecting  # the judge the command named was asked
    assert code != 0, err
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    rows = pl.read_parquet(out / "*.parquet")
    assert set(rows["status"]) == {"failed"}
    errors = " ".join(str(e) for e in rows["error"].to_list())
    assert f"HTTP 307 redirect to {fake.url}/chat/completions" in errors, errors
    assert "follows no redirect" in errors
