"""The Python scoring API end to end: create_context_precision_scorer(...).run() and run_evals,
with the offline judge and against the loopback fake OpenAI/Anthropic server."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from ctxprec import (
    ConfigError,
    ScoreFailedError,
    create_context_precision_scorer,
    map_score,
    run_evals,
)
from ctxprec.config import load_config, where
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
        assert result.paid_input_tokens == result.verdict_input_tokens > 0  # no memo
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
    assert scorer.judge.throttle.max_in_flight == 3  # type: ignore[attr-defined]
    assert scorer.scale == 10.0


QUESTION, ANSWER = "What is the capital of Australia?", "Canberra is the capital of Australia."


@pytest.mark.parametrize(
    "run",
    [
        {"input": QUESTION, "output": ANSWER},
        {"input": QUESTION, "output": "Sydney.", "groundTruth": ANSWER, "runId": "r1"},
        {  # an agent's run as Mastra hands it over: messages in, messages out
            "input": {"inputMessages": [{"role": "user", "content": QUESTION}]},
            "output": [
                {
                    "role": "assistant",
                    "content": {"format": 2, "parts": [{"type": "text", "text": ANSWER}]},
                }
            ],
            "requestContext": {},
        },
    ],
)
async def test_mastras_run_object_scores_as_the_keyword_form(
    run: dict[str, object], fake: FakeJudgeServer
) -> None:
    # the dict was taken whole as the query, with no expected output
    scorer = create_context_precision_scorer(model="openai/x", options={"context": ITEMS})
    keyword = await scorer.run(input=QUESTION, output=ANSWER)
    asked = fake.stats.total
    mastra = await scorer.run(run)
    assert mastra.score == keyword.score
    assert mastra.verdicts == keyword.verdicts
    assert mastra.prompt_version == keyword.prompt_version  # judged against an expected output
    assert fake.stats.total == 2 * asked  # the same prompts again (no memo here)
    offline = create_context_precision_scorer(model="offline", options={"context": ITEMS})
    assert (await offline.run(run)).score == 0.83


async def test_a_run_objects_extractor_gets_mastras_input_and_output() -> None:
    seen: list[tuple[object, object]] = []

    def extractor(inp: object, out: object) -> list[str]:
        seen.append((inp, out))
        return ITEMS

    scorer = create_context_precision_scorer(
        model="offline", options={"context_extractor": extractor}
    )
    output = {"role": "assistant", "content": ANSWER, "metadata": {"retrievedContext": ITEMS}}
    await scorer.run({"input": QUESTION, "output": output, "groundTruth": "Canberra"})
    assert seen == [(QUESTION, output)]


@pytest.mark.parametrize(
    ("call", "named"),
    [
        ({"query": QUESTION, "output": ANSWER}, "unknown key(s) query"),
        ({"output": ANSWER}, "no 'input' key"),
        ({"input": 42, "output": ANSWER}, "input must be a string"),
        ({"input": QUESTION, "output": {"answer": ANSWER}}, "output must be a string"),
    ],
)
async def test_any_other_shape_is_a_type_error_naming_the_keys(
    call: dict[str, object], named: str
) -> None:
    scorer = create_context_precision_scorer(model="offline", options={"context": ITEMS})
    with pytest.raises(TypeError, match="input") as caught:
        await scorer.run(call)
    assert named in str(caught.value)
    assert "groundTruth" in str(caught.value) or "inputMessages" in str(caught.value)


async def test_run_evals_refuses_data_items_it_cannot_read() -> None:
    scorer = create_context_precision_scorer(model="offline", options={"context": ITEMS})
    with pytest.raises(TypeError, match=r"'input'.*groundTruth.*got a mapping with keys"):
        await run_evals(data=[{"question": QUESTION}], scorers=[scorer])


async def test_the_targets_context_wins_over_options_context() -> None:
    """The rule the README states: the call's context (here the target's) over the scorer's."""
    scorer = create_context_precision_scorer(model="offline", options={"context": ITEMS})

    async def target(question: str) -> dict[str, object]:
        return {"output": "Canberra.", "context": ["Canberra is the capital.", "Kangaroos hop."]}

    data = [{"input": QUESTION, "groundTruth": "Canberra"}]
    evals = await run_evals(data=data, scorers=[scorer], target=target)
    fixed = await scorer.run(input=QUESTION, output="Canberra")
    assert (fixed.score, evals.scores["context-precision"]) == (0.83, 1.0)


async def test_the_api_reads_the_providers_variables_and_no_ctxprec_setting(
    fake: FakeJudgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the README says: OPENAI_BASE_URL / OPENAI_API_KEY are read (the `fake` fixture sets
    them), CTXPREC_* are not, and options["base_url"] wins over the variable."""
    monkeypatch.setenv("CTXPREC_CONCURRENCY", "0")  # the CLI refuses it: the API never reads it
    monkeypatch.setenv("CTXPREC_SCALE", "10")
    scorer = create_context_precision_scorer(model="openai/x", options={"context": ITEMS})
    result = await scorer.run(input=QUESTION, output=ANSWER)
    assert fake.stats.total == 3
    assert result.score <= 1
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # a closed port
    pinned = create_context_precision_scorer(
        model="openai/x", options={"context": ITEMS, "base_url": fake.url}
    )
    assert (await pinned.run(input=QUESTION, output=ANSWER)).score == result.score
    assert fake.stats.total == 6
