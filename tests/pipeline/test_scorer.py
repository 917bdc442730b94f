"""The Python scoring API end to end: create_context_precision_scorer(...).run() and run_evals,
with the offline judge and against the loopback fake OpenAI/Anthropic server."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pipeline import (
    ConfigError,
    ScoreFailedError,
    create_context_precision_scorer,
    map_score,
    run_evals,
)
from pipeline.config import load_config, where
from tests.fakes.judge_server import (
    FakeJudgeServer,
    expected_verdict,
)

ITEMS = [
    "Canberra was chosen as the capital of Australia in 1908.",
    "Sydney is the largest city in Australia.",
    "Australia's capital, Canberra, is home to Parliament House.",
]


async def test_offline_run_gives_score_reason_and_verdicts() -> None:
    scorer = create_context_precision_scorer(model="offline", options={"context": ITEMS})
    result = await scorer.run(
        input="What is the capital of Australia?", output="Canberra is the capital of Australia."
    )
    relevant = [v.relevant for v in result.verdicts]
    assert len(relevant) == 3
    assert all(v.reason for v in result.verdicts)
    assert result.score == map_score(relevant)
    assert "relevant" in result.reason
    assert "Criterion" in result.reason
    assert "MAP" in result.reason or "No item is relevant" in result.reason


@pytest.mark.parametrize("model", ["openai/gpt-test", "anthropic/claude-test"])
async def test_run_equals_map_of_server_verdicts_on_real_rows(
    model: str, fake: FakeJudgeServer, hotpot: Path
) -> None:
    rows = pl.read_parquet(hotpot).head(15).iter_rows(named=True)
    for row in rows:
        scorer = create_context_precision_scorer(model=model, options={"context": row["contexts"]})
        result = await scorer.run(input=row["question"], output=row["ground_truth"])
        verdicts = [expected_verdict(c, fake.config) for c in row["contexts"]]
        assert [v.relevant for v in result.verdicts] == verdicts
        assert result.score == map_score(verdicts)
        assert result.input_tokens > 0
        await scorer.aclose()


async def test_extractor_wins_over_context_and_scale_applies(fake: FakeJudgeServer) -> None:
    seen: list[tuple[object, object]] = []

    def extractor(inp: object, out: object) -> list[str]:
        seen.append((inp, out))
        return ITEMS[::-1]

    scorer = create_context_precision_scorer(
        model="openai/x",
        options={"context": ["ignored"], "context_extractor": extractor, "scale": 10},
    )
    result = await scorer.run(input="q?", output="a.")
    verdicts = [expected_verdict(c, fake.config) for c in ITEMS[::-1]]
    assert seen == [("q?", "a.")]
    assert result.score == map_score(verdicts, 10)
    assert "ignored" not in fake.stats.items


def test_neither_context_nor_extractor_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="context"):
        create_context_precision_scorer(model="offline", options={"scale": 1})


async def test_query_only_when_no_expected_output(fake: FakeJudgeServer) -> None:
    scorer = create_context_precision_scorer(model="openai/x", options={"context": ITEMS})
    await scorer.run(input="What is the capital of Australia?")
    assert fake.stats.query_only == 3


async def test_failed_item_raises_with_partial_verdicts(fake: FakeJudgeServer) -> None:
    fake.config.script = ["400"]  # the first call fails for good (fatal)
    scorer = create_context_precision_scorer(
        model="openai/x", options={"context": ITEMS, "max_retries": 0, "concurrency": 1}
    )
    with pytest.raises(ScoreFailedError) as caught:
        await scorer.run(input="q", output="a")
    partial = caught.value.verdicts
    assert partial.count(None) == 1
    assert len(partial) == 3


async def test_llm_written_reason(fake: FakeJudgeServer) -> None:
    scorer = create_context_precision_scorer(
        model="openai/x", options={"context": ITEMS, "reason": "llm"}
    )
    result = await scorer.run(input="q", output="a")
    assert result.reason
    assert fake.stats.total == 4


async def test_run_evals_reports_a_failing_item_and_keeps_the_others() -> None:
    scorer = create_context_precision_scorer(model="offline", options={"context": ITEMS})
    done: list[int] = []

    async def target(question: str) -> dict[str, object]:
        if question == "boom":
            raise RuntimeError("retriever down")
        return {"output": "Canberra.", "context": ITEMS}

    data = [
        {"input": "What is the capital of Australia?", "ground_truth": "Canberra"},
        {"input": "boom"},
        {"input": "Capital of Australia?", "ground_truth": "Canberra"},
    ]
    result = await run_evals(
        data=data,
        scorers=[scorer],
        target=target,
        on_item_complete=lambda item: done.append(item.index),
        concurrency=2,
    )
    assert sorted(done) == [0, 1, 2]
    assert [i.index for i in result.failed] == [1]
    assert "retriever down" in result.items[1].errors["target"]
    scores = [i.scorer_results["context-precision"].score for i in result.items if not i.failed]
    assert result.scores["context-precision"] == pytest.approx(sum(scores) / len(scores))


@pytest.mark.parametrize(
    ("option", "key", "value"),
    [
        ("timeout_s", "judge.timeout_s", -1),
        ("max_retries", "judge.max_retries", -2),
        ("reasoning_effort", "judge.reasoning_effort", "lots"),
        ("concurrency", "limits.concurrency", 0),
        ("rpm", "limits.rpm", "fast"),
        ("scale", "scoring.scale", -1.0),
        ("reason", "scoring.reason", "poem"),
    ],
)
def test_a_bad_option_is_refused_as_the_cli_refuses_its_flag(
    option: str, key: str, value: object
) -> None:
    """The options go through the CLI's loader: the same check, the same message, naming the
    option instead of the flag."""
    with pytest.raises(ConfigError) as from_cli:
        load_config(None, {key: value}, env={})
    with pytest.raises(ConfigError) as from_api:
        create_context_precision_scorer(model="offline", options={"context": ITEMS, option: value})
    flag = where(key, "command line")
    assert str(from_cli.value).startswith(f"{flag} must be ")
    assert str(from_api.value) == str(from_cli.value).replace(flag, f"option {option!r}", 1)


def test_good_options_reach_the_judge_and_the_gate(fake: FakeJudgeServer) -> None:
    scorer = create_context_precision_scorer(
        model="openai/x",
        options={"context": ITEMS, "timeout_s": "12.5", "concurrency": 3, "scale": 10},
    )
    assert scorer.judge.settings.timeout_s == 12.5  # type: ignore[attr-defined]
    assert scorer.judge.gate.max_in_flight == 3  # type: ignore[attr-defined]
    assert scorer.scale == 10.0
