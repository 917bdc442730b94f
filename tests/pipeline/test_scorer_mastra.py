"""The per-row API called as Mastra's docs write it: camelCase names (aliases of the snake_case
ones), plain (sync) targets and extractors, a context that is not a list of strings refused by
name, means rounded as every figure, memo hits paying nothing, timeout_s bounding a call,
not-scorable items, thresholds and the verdict; and the API's errors naming options, not flags."""

from __future__ import annotations

import socket
import statistics
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from ctxprec import (
    ConfigError,
    create_context_precision_scorer,
    load_config,
    map_score,
    not_scorable,
    run_evals,
)
from ctxprec.storage.core.errors import JudgeRefusedRunError, JudgeUnreachableError
from ctxprec.storage.core.figures import round_figure
from tests.fakes.judge_server import FakeJudgeServer, expected_verdict

ITEMS = [
    "Canberra was chosen as the capital of Australia in 1908.",
    "Sydney is the largest city in Australia.",
    "Australia's capital, Canberra, is home to Parliament House.",
]
QUESTION, ANSWER = "What is the capital of Australia?", "Canberra is the capital of Australia."


# -- one rule for names: camelCase is an alias ----------------------------------------------
async def test_camel_case_options_and_keywords_are_aliases(fake: FakeJudgeServer) -> None:
    seen: list[object] = []

    def extractor(inp: object, out: object) -> list[str]:
        return ITEMS

    scorer = create_context_precision_scorer(
        model="openai/x",
        options={"contextExtractor": extractor, "timeoutS": 7, "maxRetries": 1, "apiKeyEnv": None},
    )
    assert scorer.judge.settings.timeout_s == 7.0  # type: ignore[attr-defined]
    assert scorer.judge.settings.max_retries == 1  # type: ignore[attr-defined]
    evals = await run_evals(
        data=[{"input": QUESTION, "groundTruth": ANSWER}],
        scorers=[scorer],
        onItemComplete=seen.append,
    )
    assert [i.index for i in seen] == [0]  # type: ignore[attr-defined]
    verdicts = [expected_verdict(c, fake.config) for c in ITEMS]
    assert evals.scores == {"context-precision": map_score(verdicts)}
    mastra = await scorer.run(input=QUESTION, groundTruth=ANSWER)
    assert mastra.score == map_score(verdicts)


def test_both_spellings_of_one_name_are_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match="'context_extractor' and 'contextExtractor'"):
        create_context_precision_scorer(
            model="offline",
            options={"context_extractor": lambda i, o: ITEMS, "contextExtractor": lambda i, o: []},
        )


async def test_an_unknown_camel_case_keyword_is_a_type_error_naming_it() -> None:
    scorer = create_context_precision_scorer(model="offline", options={"context": ITEMS})
    with pytest.raises(TypeError, match=r"'onItemCompleted'.*on_item_complete"):
        await run_evals(data=[{"input": QUESTION}], scorers=[scorer], onItemCompleted=print)
    with pytest.raises(TypeError, match="'on_item_complete' twice"):
        await run_evals(
            data=[{"input": QUESTION}],
            scorers=[scorer],
            on_item_complete=print,
            onItemComplete=print,
        )


# -- a context that is not a list of strings ------------------------------------------------
@pytest.mark.parametrize(
    ("context", "named"),
    [
        ("Canberra is the capital.", "option 'context' is a string"),
        (["Canberra.", 42], "option 'context': item #2 is int"),
        ({"a": "b"}, "option 'context' must be a list of strings"),
    ],
)
def test_a_string_or_non_string_context_option_is_refused(context: object, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        create_context_precision_scorer(model="offline", options={"context": context})
    assert str(caught.value).startswith(named)


async def test_a_string_from_the_extractor_call_or_target_is_refused_naming_it() -> None:
    by_extractor = create_context_precision_scorer(
        model="offline", options={"context_extractor": lambda i, o: "one string"}
    )
    with pytest.raises(ConfigError, match="the context_extractor's return is a string"):
        await by_extractor.run(input=QUESTION, output=ANSWER)
    scorer = create_context_precision_scorer(model="offline", options={"context": ITEMS})
    with pytest.raises(ConfigError, match=r"scorer\.run\(context=\.\.\.\): item #1 is NoneType"):
        await scorer.run(input=QUESTION, output=ANSWER, context=[None])

    def target(question: str) -> dict[str, Any]:
        return {"output": "Canberra.", "context": "Canberra is the capital."}

    with pytest.raises(ConfigError, match=r"the target's return for data\[1\] is a string"):
        await run_evals(
            data=[{"input": "q0"}, {"input": QUESTION}],
            scorers=[scorer],
            target=lambda q: target(q) if q == QUESTION else {"output": "x", "context": ITEMS},
            concurrency=1,
        )


# -- plain functions work as coroutine functions do -----------------------------------------
async def test_a_sync_target_and_an_async_extractor_work() -> None:
    def target(question: str) -> dict[str, Any]:
        return {"output": "Canberra.", "context": ["Canberra is the capital.", "Kangaroos hop."]}

    async def extractor(inp: object, out: object) -> list[str]:
        await anyio.lowlevel.checkpoint()
        return ITEMS

    scorer = create_context_precision_scorer(model="offline", options={"context": ITEMS})
    evals = await run_evals(data=[{"input": QUESTION, "groundTruth": "Canberra"}],
                            scorers=[scorer], target=target)  # fmt: skip
    assert not evals.failed
    assert evals.scores == {"context-precision": 1.0}
    by_async = create_context_precision_scorer(
        model="offline", options={"contextExtractor": extractor}
    )
    assert (await by_async.run(input=QUESTION, output=ANSWER)).score == 0.83


# -- figures ---------------------------------------------------------------------------------
async def test_the_mean_is_rounded_by_the_figures_rule(fake: FakeJudgeServer) -> None:
    contexts = [[f"passage {i} {j}" for j in range(k)] for i, k in enumerate((3, 4, 5, 6, 7))]
    scorer = create_context_precision_scorer(model="openai/x", options={"context": ITEMS})
    data = [{"input": f"question {i}?", "groundTruth": "a."} for i in range(len(contexts))]
    evals = await run_evals(
        data=data, scorers=[scorer], target=lambda q: ("a.", contexts[int(q.split()[1][:-1])])
    )
    scores = [map_score([expected_verdict(c, fake.config) for c in ctx]) for ctx in contexts]
    raw = statistics.fmean(scores)
    assert round(raw, 4) != raw  # the mean has more digits than a figure shows
    assert evals.scores["context-precision"] == round_figure(raw)


# -- tokens: a memo hit pays nothing ---------------------------------------------------------
async def test_a_memo_hit_pays_no_tokens_and_keeps_what_the_verdict_cost(
    fake: FakeJudgeServer, tmp_path: Path
) -> None:
    options = {"context": ITEMS, "cache_dir": tmp_path / "memo"}
    first = await create_context_precision_scorer("openai/x", options).run(QUESTION, ANSWER)
    calls = fake.stats.total
    again = await create_context_precision_scorer("openai/x", options).run(QUESTION, ANSWER)
    assert fake.stats.total == calls == 3
    assert first.paid_input_tokens > 0
    assert first.paid_input_tokens == first.verdict_input_tokens
    assert (again.paid_input_tokens, again.paid_output_tokens, again.input_tokens) == (0, 0, 0)
    assert again.verdict_input_tokens == first.paid_input_tokens
    assert again.verdict_output_tokens == first.paid_output_tokens
    assert again.score == first.score


# -- timeout_s bounds a call -----------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_timeout_s_bounds_a_call_to_a_dead_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens: each attempt is refused at once, and the CLI retries that for its
    retry budget (300 s). In code, timeout_s bounds the call with its retries, and a judge no
    call ever reached is JudgeUnreachableError (the CLI's exit 4), not a failed item."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    scorer = create_context_precision_scorer(
        "openai/x",
        {"context": ITEMS, "base_url": f"http://127.0.0.1:{_closed_port()}/v1", "timeout_s": 1},
    )
    assert scorer.judge.settings.retry_budget_s == 1.0  # type: ignore[attr-defined]
    with (
        anyio.fail_after(60),
        pytest.raises(JudgeUnreachableError, match="no call reached the judge"),
    ):
        await scorer.run(input=QUESTION, output=ANSWER)
    await scorer.aclose()
    given = create_context_precision_scorer(
        "offline", {"context": ITEMS, "timeout_s": 1, "retry_budget_s": 30}
    )
    assert given.judge.settings.retry_budget_s == 30.0  # type: ignore[attr-defined]


# -- not scorable, outcomes, thresholds and the verdict --------------------------------------
async def test_not_scorable_items_are_skipped_and_left_out_of_the_mean() -> None:
    def extractor(inp: str, out: object) -> Any:
        return not_scorable("small talk") if inp == "hello" else ITEMS

    scorer = create_context_precision_scorer(
        model="offline", options={"contextExtractor": extractor}
    )
    alone = await scorer.run(input="hello", output="hi")
    assert (alone.score, alone.status, alone.verdicts) == (None, "not_scorable", [])
    assert "small talk" in alone.reason

    def target(q: str) -> Any:
        if q == "boom":
            raise RuntimeError("retriever down")
        return not_scorable("no retrieval") if q == "thanks" else {"output": ANSWER}

    data = [{"input": q} for q in (QUESTION, "hello", "thanks", "boom")]
    evals = await run_evals(data=data, scorers=[scorer], target=target)
    assert evals.outcomes == {"completed": 1, "skipped": 2, "error": 1}
    assert [i.index for i in evals.skipped] == [1, 2]
    assert evals.items[2].skipped == {"context-precision": "not scorable: no retrieval"}
    assert evals.scores == {"context-precision": 0.83}  # the one completed item
    assert evals.verdict.status == "failed"
    assert evals.verdict.reasons == (
        "1 of 4 items failed to run: data[3] (target): RuntimeError: retriever down",
    )


async def test_thresholds_give_a_verdict_with_its_reasons() -> None:
    scorer = create_context_precision_scorer(model="offline", options={"context": ITEMS})
    data = [{"input": QUESTION, "groundTruth": ANSWER}] * 3
    passed = await run_evals(data=data, scorers=[{"scorer": scorer, "threshold": 0.8}])
    assert passed.verdict.passed
    assert passed.verdict == "passed"  # Mastra's verdict is its status
    assert passed.verdict.reasons == ()
    assert str(passed.verdict.thresholds[0]) == (
        "context-precision: mean 0.8300 over 3 scored items meets 0.8"
    )
    failed = await run_evals(data=data, scorers=[scorer], thresholds={"context-precision": 0.9})
    assert failed.verdict == "failed"
    assert failed.verdict.reasons == (
        "context-precision: the mean score of 3 scored items is 0.8300, 0.0700 below the "
        "threshold 0.9",
    )
    assert "verdict: failed (3 completed, 0 skipped, 0 error)" in str(failed.verdict)
    equal = await run_evals(data=data, scorers=[scorer], thresholds=0.83)
    assert equal.verdict.passed  # a mean equal to the threshold passes, as --fail-under's
    with pytest.raises(ConfigError, match="no scorer 'faithfulness'"):
        await run_evals(data=data, scorers=[scorer], thresholds={"faithfulness": 0.5})


# -- the API's errors name its options, not the CLI's flags ----------------------------------
def test_a_missing_key_names_the_option_not_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError) as caught:
        create_context_precision_scorer(model="openai/gpt-4o-mini", options={"context": ITEMS})
    assert "option 'api_key_env' names another variable" in str(caught.value)
    assert "--api-key-env" not in str(caught.value)
    with pytest.raises(ConfigError) as userinfo:
        create_context_precision_scorer(
            "openai/x", {"context": ITEMS, "base_url": "https://u:p@example.invalid/v1"}
        )
    assert "option 'base_url'" in str(userinfo.value)
    assert "--" not in str(userinfo.value)


# -- load_config takes a column map ----------------------------------------------------------
def test_load_config_takes_a_column_map_as_documented() -> None:
    cfg = load_config(flags={"map": {"query": "question", "expected": "ground_truth"}}, env={})
    assert (cfg.columns.query, cfg.columns.expected) == ("question", "ground_truth")
    same = load_config(flags={"map": "query=question,expected=ground_truth"}, env={})
    assert same.columns == cfg.columns
    with pytest.raises(ConfigError, match="'question=q': write FIELD=COLUMN"):
        load_config(flags={"map": {"question": "q"}}, env={})
    with pytest.raises(ConfigError, match="unknown setting 'mapping'"):
        load_config(flags={"mapping": {"query": "q"}}, env={})


async def test_a_refusal_during_a_call_names_the_model_argument(fake: FakeJudgeServer) -> None:
    fake.config.script = ["404"] * 3
    scorer = create_context_precision_scorer("openai/x", {"context": ITEMS, "concurrency": 1})
    with pytest.raises(JudgeRefusedRunError) as caught:  # as itself, not in a group
        await scorer.run(input=QUESTION, output=ANSWER)
    assert "check model= and the base URL" in str(caught.value)
    assert "--model" not in str(caught.value)


async def test_mastras_one_object_calls() -> None:
    """`createContextPrecisionScorer({model, options})` and `runEvals({data, scorers, target})`
    as Mastra's docs write them, in Python."""
    scorer = create_context_precision_scorer(
        {"model": "offline", "options": {"context": ITEMS, "scale": 1}}
    )
    assert (await scorer.run({"input": QUESTION, "output": ANSWER})).score == 0.83
    evals = await run_evals(
        {
            "data": [{"input": QUESTION, "groundTruth": ANSWER}],
            "scorers": [{"scorer": scorer, "threshold": 0.8}],
            "target": lambda question: {"output": ANSWER},
            "onItemComplete": lambda item: None,
        }
    )
    assert (evals.scores, evals.verdict) == ({"context-precision": 0.83}, "passed")
    with pytest.raises(TypeError, match="Mastra's one object"):
        create_context_precision_scorer({"model": "offline", "context": ITEMS})
