"""A judge that never gives a verdict is cut off: after `[judge] max_unreadable_replies` (20)
replies in a row with no readable verdict the run stops like a refusal (exit 4), says what the
judge sent (clipped, escaped) and what to change, and has paid for at most that many replies
plus the calls in flight; a judge that is only sometimes unreadable is not stopped, and its
unreadable items are not offered a free retry."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import polars as pl
import pytest

from ctxprec.connectors.judges.base import ItemRequest, JudgeStats
from ctxprec.connectors.judges.openai import OpenAIJudge
from ctxprec.storage.core.errors import JudgeNoVerdictError
from ctxprec.storage.core.seams import Seams
from ctxprec.storage.core.settings import JudgeSettings
from tests.fakes.clock import instant_retries
from tests.fakes.inputs import KEY
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeServer, FakeJudgeThread
from tests.fakes.runs import score
from tests.fakes.transport import MockTransport, openai_completion

PROSE = "Hmm, that is hard to say without more context."


def items_log(path: Path, rows: int) -> Path:
    """`rows` rows of 3 distinct items each."""
    pl.DataFrame(
        {
            "id": [f"r{i}" for i in range(rows)],
            "query": [f"Who wrote book {i}?" for i in range(rows)],
            "expected_output": [f"Author {i}." for i in range(rows)],
            "contexts": [[f"Book {i} passage {k}." for k in range(3)] for i in range(rows)],
        }
    ).write_parquet(path)
    return path


@pytest.fixture
def prose_judge(monkeypatch: pytest.MonkeyPatch) -> FakeJudgeServer:
    """A judge that answers every request in prose that holds no verdict."""
    with FakeJudgeThread(FakeJudgeConfig(p_garbage_content=1.0)) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        yield server


@pytest.mark.parametrize("concurrency", [None, 64])  # the default (32), openai.toml's (64)
def test_600_items_against_a_prose_judge_cost_at_most_100_requests(
    tmp_path: Path,
    prose_judge: FakeJudgeServer,
    capsys: pytest.CaptureFixture[str],
    concurrency: int | None,
) -> None:
    src, out = items_log(tmp_path / "log.parquet", 200), tmp_path / "out"
    limits = () if concurrency is None else ("--concurrency", concurrency)
    assert score(src, "-o", out, "--model", "openai/gpt-4o-mini", *limits) == 4
    assert prose_judge.stats.total <= 100  # the fake's own count, calls in flight included
    err = capsys.readouterr().err
    assert "ctxprec: the judge gives no readable verdict:" in err
    assert "20 replies in a row held no readable verdict" in err
    assert f'the last one said: "{PROSE}"' in err  # what the judge sent
    assert "Fix: use a model that answers in JSON" in err
    assert "--mode row" in err
    assert "response_format" in err  # structured outputs
    assert "max_unreadable_replies" in err
    assert "Traceback" not in err
    assert not list(out.glob("*.parquet"))  # no row was failed and committed for it


def test_what_the_judge_sent_is_clipped_and_escaped(judge_keys: None) -> None:
    """The stop message quotes the judge's last reply: control characters escaped, at most 200
    characters of it."""
    said = "\x1b[31mNO IDEA\x1b[0m\r\n" + "blah " * 200
    transport = MockTransport(lambda request: openai_completion(said))
    settings = JudgeSettings(model="openai/gpt-4o-mini", max_unreadable_replies=3)
    seams = Seams(transport=transport, clock=instant_retries())
    judge = OpenAIJudge("gpt-4o-mini", settings, NoLimits(), JudgeStats(), seams=seams)
    request = ItemRequest("q?", "a", "item")

    async def until_stopped() -> str:
        for _ in range(10):
            try:
                await judge.judge_item(request)
            except JudgeNoVerdictError as stopped:
                return str(stopped)
        return ""

    message = anyio.run(until_stopped)
    assert len(transport.requests) == 3  # the third unreadable reply in a row stops it
    assert "3 replies in a row held no readable verdict" in message
    assert "\x1b" not in message
    assert "\r" not in message
    assert "NO IDEA" in message
    quoted = message.split('the last one said: "', 1)[1].split('". Fix:', 1)[0]
    assert len(quoted) <= 200


class NoLimits:
    """A throttle that admits every call at once (the judge is called directly)."""

    @contextlib.asynccontextmanager
    async def slot(self, est_tokens: int) -> AsyncIterator[None]:
        yield

    def used_tokens(self, estimated: int, actual: int) -> None:
        return None

    def rate_limited(self, retry_after: float | None) -> None:
        return None


def test_a_judge_that_is_sometimes_unreadable_is_not_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A readable reply starts the count again: a judge unreadable a third of the time scores
    the run (its unreadable items are re-asked, most then read)."""
    with FakeJudgeThread(FakeJudgeConfig(p_garbage_content=0.3, seed=3)) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        code = score(items_log(tmp_path / "log.parquet", 40), "-o", tmp_path / "out",
                     "--model", "openai/gpt-4o-mini")  # fmt: skip
    assert code in (0, 1)
    assert "gives no readable verdict" not in capsys.readouterr().err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rows"]["ok"] >= 30


def test_zero_never_stops_and_unreadable_rows_are_not_offered_a_free_retry(
    tmp_path: Path, prose_judge: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[judge]\nmax_unreadable_replies = 0\n")
    out = tmp_path / "out"
    src = items_log(tmp_path / "log.parquet", 4)
    assert score(src, "-o", out, "--model", "openai/gpt-4o-mini", "--config", config) == 1
    assert prose_judge.stats.total == 12 * 4  # each item: ask, re-ask, then once more afresh
    printed = capsys.readouterr().out
    assert "4 rows failed: the judge's replies held no readable verdict (unparseable x4)" in printed
    assert "a re-run asks again and pays again: change the model" in printed
    assert "re-run the same command to retry only them" not in printed
    errors = pl.read_parquet(out / "*.parquet")["error"].to_list()
    assert all("in 2 conversations, each re-asked once" in e for e in errors)
    html = (out / "summary.html").read_text()
    assert "a re-run asks again and pays again" in html
