"""`--mode row` that does not waste rows: a reply with missing, extra or repeated verdicts is
re-asked once, then the row is judged item by item (memoized per item); only items that fail on
their own fail. Against the real fake judge on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from tests.fakes.inputs import KEY
from tests.fakes.judge_server import (
    FakeJudgeConfig,
    FakeJudgeServer,
    FakeJudgeThread,
    expected_verdict,
)
from tests.fakes.runs import score


def labelled_log(path: Path, rows: int = 120) -> Path:
    """Rows of 2 to 6 distinct items each, labelled with the fake judge's own truth."""
    contexts = [[f"row {i} passage {k}" for k in range(2 + i % 5)] for i in range(rows)]
    pl.DataFrame(
        {
            "id": [f"r{i}" for i in range(rows)],
            "query": [f"question {i}?" for i in range(rows)],
            "expected_output": [f"answer {i}" for i in range(rows)],
            "contexts": contexts,
            "labels": [[expected_verdict(t) for t in c] for c in contexts],
        }
    ).write_parquet(path)
    return path


@pytest.fixture
def dropping(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeJudgeServer]:
    """A judge that drops the last verdict of about a third of its multi-item row replies."""
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "memo"))
    with FakeJudgeThread(FakeJudgeConfig(p_row_drop=0.34, seed=3)) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        yield server


def test_short_row_replies_end_ok_and_equal_to_the_labels(
    tmp_path: Path, dropping: FakeJudgeServer
) -> None:
    src, out = labelled_log(tmp_path / "log.parquet"), tmp_path / "out"
    args = ("--model", "openai/j", "--mode", "row", "--map", "labels=labels")
    assert score(src, "-o", out, *args) == 0
    rows = pl.read_parquet(out / "*.parquet")
    assert rows.height == 120
    assert rows["status"].to_list() == ["ok"] * 120
    assert rows["score"].to_list() == rows["label_score"].to_list()
    assert dropping.stats.by_outcome["row_drop"] > 20  # the judge did drop verdicts
    judge = json.loads((out / "summary.json").read_text())["judge"]
    assert judge["row_fallbacks"] >= 1  # a re-ask that dropped again: judged per item
    assert judge["reasks"] == dropping.stats.by_outcome["row_drop"] - judge["row_fallbacks"]
    assert "rows judged per item after a wrong row reply" in (out / "summary.md").read_text()
    # the per-item verdicts are memoized like any other: a second run asks nothing
    before = dropping.stats.total
    assert score(src, "-o", tmp_path / "again", *args) == 0
    assert dropping.stats.total == before


def test_only_the_item_that_fails_alone_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "memo"))
    src, out = labelled_log(tmp_path / "log.parquet", rows=1), tmp_path / "out"  # 2 items
    config = FakeJudgeConfig(script=["row_mismatch", "row_mismatch", "500"])
    with FakeJudgeThread(config) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        args = ("--model", "openai/j", "--mode", "row", "--max-retries", 0)
        assert score(src, "-o", out, *args) == 1
        row = pl.read_parquet(out / "*.parquet").row(0, named=True)
        assert row["status"] == "failed"
        assert row["verdicts"].count(None) == 1  # the other item kept its verdict
        failed_at = row["verdicts"].index(None) + 1
        assert row["error"].startswith("http_500") or "500" in row["error"]
        assert row["error"].endswith(f"(item #{failed_at})")
        assert server.stats.total == 4
        assert score(src, "-o", out, *args) == 0  # the next run asks again and finishes
    assert pl.read_parquet(out / "*.parquet")["status"].to_list() == ["ok"]
