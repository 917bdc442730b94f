"""What the user reads must be true: token and cost figures, de-duplication of failed calls,
reasons, estimates, summaries and messages, checked against the fake judge server's own counts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from pipeline.cli import main
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeServer, FakeJudgeThread

KEY = "sk-test-user-facing-0000"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeJudgeServer]:
    with FakeJudgeThread(FakeJudgeConfig()) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        yield server


def shared_items_log(path: Path, rows: int = 24) -> Path:
    """Rows that share questions and items: 4 distinct queries, each item used by many rows."""
    items = [f"passage {k} about topic {k % 3}" for k in range(6)]
    pl.DataFrame(
        {
            "id": [f"r{i}" for i in range(rows)],
            "query": [f"question {i % 4}?" for i in range(rows)],
            "expected_output": [f"answer {i % 4}" for i in range(rows)],
            "contexts": [items[i % 3 : i % 3 + 3] for i in range(rows)],
        }
    ).write_parquet(path)
    return path


def score(*args: object) -> int:
    return main(["score", *map(str, args), "--progress", "off"])


def test_tokens_are_counted_once_per_call(tmp_path: Path, fake: FakeJudgeServer) -> None:
    src = shared_items_log(tmp_path / "log.parquet")
    out = tmp_path / "out"
    assert score(src, "-o", out, "--model", "openai/j", "--batch-rows", 5) == 0
    spent_in, spent_out = fake.stats.input_tokens, fake.stats.output_tokens
    assert spent_in > 0
    rows = pl.read_parquet(out / "*.parquet")
    assert rows["input_tokens"].sum() == spent_in
    assert rows["output_tokens"].sum() == spent_out
    tokens = json.loads((out / "summary.json").read_text())["tokens"]
    assert tokens == {
        "input": spent_in,
        "output": spent_out,
        "this_run_input": spent_in,
        "this_run_output": spent_out,
    }


def test_a_failed_item_is_requested_once_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = shared_items_log(tmp_path / "log.parquet")
    unique = pl.read_parquet(src).explode("contexts").select("query", "contexts").n_unique()
    with FakeJudgeThread(FakeJudgeConfig(p_500=1.0)) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        code = score(src, "-o", tmp_path / "out", "--model", "openai/j", "--max-retries", 0)
        assert code == 1
        assert server.stats.total == unique


def test_reason_llm_asks_the_judge_in_the_batch_path(tmp_path: Path, fake: FakeJudgeServer) -> None:
    src = shared_items_log(tmp_path / "log.parquet", rows=8)
    out = tmp_path / "out"
    assert score(src, "-o", out, "--model", "openai/j", "--reason", "llm") == 0
    reason_bodies = [
        b for b in fake.stats.bodies if "Write a concise explanation" in json.dumps(b["messages"])
    ]
    assert reason_bodies  # the judge was asked to write the reasons
    rows = pl.read_parquet(out / "*.parquet")
    assert not any(r.startswith("Score ") for r in rows["reason"].to_list())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["judge"]["reason_calls"] == len(reason_bodies)
    # a second run takes the reasons from the memo
    before = fake.stats.total
    assert score(src, "-o", tmp_path / "out2", "--model", "openai/j", "--reason", "llm") == 0
    assert fake.stats.total == before


def test_offline_reason_llm_keeps_the_built_reason(tmp_path: Path) -> None:
    import asyncio

    from pipeline import create_context_precision_scorer

    scorer = create_context_precision_scorer(
        "offline", {"context": ["Canberra is the capital.", "Kangaroos hop."], "reason": "llm"}
    )
    result = asyncio.run(scorer.run(input="What is the capital?", output="Canberra"))
    assert result.reason.startswith("Score ")
    assert "stands as is" not in result.reason
    out = tmp_path / "out"
    src = shared_items_log(tmp_path / "log.parquet", rows=4)
    assert score(src, "-o", out, "--reason", "llm") == 0
    assert pl.read_parquet(out / "*.parquet")["reason"].str.starts_with("Score ").all()
