"""The HTTP judges against strict stand-ins of the real APIs (tests/fakes/strict.py, after
the providers' API references): request shapes per model family, adaptation shared by the run,
refusals that stop the run, the kinds of 429 and 5xx, refusals and filters, usage, base URLs.
Retry waits are instant and recorded; nothing asserts wall-clock time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ctxprec.connectors.judges import ItemRequest, JudgeSettings, JudgeStats, create_judge
from ctxprec.connectors.judges.conversation import HttpJudgeBase
from ctxprec.connectors.judges.retry import RetryClock, classify
from ctxprec.connectors.judges.shapes import OUTPUT_LADDER, RequestShape, learn_openai, openai_shape
from ctxprec.storage.core.errors import JudgeFatalError, JudgeParseError, JudgeRefusedRunError
from ctxprec.storage.core.seams import Seams
from tests.fakes.clock import instant_retries
from tests.fakes.inputs import KEY
from tests.fakes.judge_server import expected_verdict
from tests.fakes.strict import StrictConfig, StrictServer, running_strict

pytestmark = pytest.mark.usefixtures("judge_keys")

ITEMS = [f"Fact {i}: the Eiffel tower is {300 + i} metres tall." for i in range(12)]


def req(item: str) -> ItemRequest:
    return ItemRequest("How tall is the Eiffel tower?", "330 metres.", item)


@contextlib.asynccontextmanager
async def strict(
    model: str,
    config: StrictConfig | None = None,
    *,
    root: bool = False,
    clock: RetryClock | None = None,
    **settings: Any,
) -> AsyncIterator[tuple[HttpJudgeBase, StrictServer, JudgeStats]]:
    """A strict server and a judge of `model` on it, waiting on `clock` (a fresh instant one)."""
    async with running_strict(config) as server:
        stats = JudgeStats()
        base = server.root if root else server.url
        judge_settings = JudgeSettings(model=model, base_url=base, **settings)
        judge = create_judge(
            judge_settings, stats=stats, seams=Seams(clock=clock or instant_retries())
        )
        assert isinstance(judge, HttpJudgeBase)
        try:
            yield judge, server, stats
        finally:
            await judge.aclose()


# ---------------------------------------------------------------- model families, first shape


@pytest.mark.parametrize(
    ("model", "effort"),
    [
        ("gpt-5-mini", "minimal"),
        ("gpt-5", "minimal"),
        ("gpt-5.1", "none"),
        ("o4-mini", "low"),
        ("o3", "low"),
        ("o3-mini", "low"),
        ("gpt-5.2-2026-01-01", "none"),
    ],
)
async def test_reasoning_models_are_right_the_first_time(model: str, effort: str) -> None:
    async with strict(f"openai/{model}") as (judge, server, stats):
        replies = await asyncio.gather(*(judge.judge_item(req(t)) for t in ITEMS[:6]))
    assert [r.verdict.relevant for r in replies] == [expected_verdict(t) for t in ITEMS[:6]]
    assert server.stats.total == 6
    assert server.stats.by_status == {200: 6}
    body = server.stats.bodies[0]
    assert "temperature" not in body
    assert "max_tokens" not in body
    assert body["max_completion_tokens"] > StrictConfig().reasoning_cap
    assert body["reasoning_effort"] == effort
    assert body["response_format"]["type"] == "json_schema"
    # reasoning tokens are output tokens, and cost
    assert all(r.output_tokens >= StrictConfig().reasoning_tokens for r in replies)
    assert not stats.adaptations


async def test_reasoning_effort_setting_wins_and_a_rejected_value_adapts_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="ctxprec")
    async with strict("openai/gpt-5-mini", reasoning_effort="none") as (judge, server, stats):
        first = await asyncio.gather(*(judge.judge_item(req(t)) for t in ITEMS[:8]))
        second = await asyncio.gather(*(judge.judge_item(req(t)) for t in ITEMS[8:]))
    assert all(
        r.verdict.relevant == expected_verdict(t) for r, t in zip(first, ITEMS, strict=False)
    )
    assert len(second) == 4
    rejected = server.stats.by_status[400]
    assert 1 <= rejected <= 8
    assert server.stats.total == 12 + rejected
    assert server.stats.bodies[-1]["reasoning_effort"] == "minimal"
    assert list(stats.adaptations) == ["reasoning_effort: minimal (the lowest the model accepts)"]
    assert sum("adapting" in m for m in caplog.messages) == 1  # one log line for the run
    assert judge.identity()["reasoning_effort"] == "none"  # memo keys follow the settings


async def test_a_cut_off_reply_raises_the_budget_for_the_run_not_a_reask() -> None:
    config = StrictConfig(reasoning_cap=20_000)  # beyond the default room for reasoning
    async with strict("openai/o4-mini", config) as (judge, server, stats):
        first = await judge.judge_item(req(ITEMS[0]))
        second = await judge.judge_item(req(ITEMS[1]))
    assert first.verdict.relevant == expected_verdict(ITEMS[0])
    assert second.verdict.relevant == expected_verdict(ITEMS[1])
    assert server.stats.by_outcome == {"cut_off": 1, "ok": 2}
    assert stats.reasks == 0
    cut, again = server.stats.bodies[0], server.stats.bodies[1]
    assert again["max_completion_tokens"] == 4 * cut["max_completion_tokens"]
    assert again["messages"] == cut["messages"]  # the same question, not a re-ask
    assert first.output_tokens >= cut["max_completion_tokens"]  # the cut-off call was billed
    assert any("budget" in change for change in stats.adaptations)


async def test_a_reply_cut_off_at_the_cap_fails_as_truncated() -> None:
    config = StrictConfig(reasoning_cap=10**6)
    async with strict("openai/o3", config) as (judge, server, stats):
        with pytest.raises(JudgeParseError) as caught:
            await judge.judge_item(req(ITEMS[0]))
    assert caught.value.cause == "truncated"
    assert stats.failures == {"truncated": 1}
    assert server.stats.total <= 4
    assert stats.reasks == 0


@pytest.mark.parametrize("model", ["claude-opus-4-7", "claude-opus-4-7-20260415", "claude-opus-5"])
async def test_newest_anthropic_models_get_no_temperature(model: str) -> None:
    async with strict(f"anthropic/{model}", root=True) as (judge, server, _):
        reply = await judge.judge_item(req(ITEMS[2]))
    assert reply.verdict.relevant == expected_verdict(ITEMS[2])
    assert server.stats.total == 1
    assert "temperature" not in server.stats.bodies[0]
    assert server.stats.paths == ["/v1/messages"]  # ANTHROPIC_BASE_URL without /v1, as the SDK


async def test_older_anthropic_models_keep_temperature_and_a_rejection_adapts() -> None:
    async with strict("anthropic/claude-sonnet-4-5") as (judge, server, _):
        await judge.judge_item(req(ITEMS[0]))
    assert server.stats.bodies[0]["temperature"] == 0.0
    # a model name we do not know that rejects temperature: adapted once, no row fails
    async with strict("anthropic/claude-opus-4-7") as (judge, server, stats):
        judge.shape.send_temperature = True
        replies = [await judge.judge_item(req(t)) for t in ITEMS[:3]]
    assert len(replies) == 3
    assert server.stats.by_status == {400: 1, 200: 3}
    assert list(stats.adaptations) == ["temperature: not sent (the model rejects it)"]


@pytest.mark.parametrize(
    ("env", "suffix"),
    [("ANTHROPIC_BASE_URL", ""), ("ANTHROPIC_BASE_URL", "/v1"), ("ANTHROPIC_BASE_URL", "/v1/"),
     ("OPENAI_BASE_URL", "/v1"), ("OPENAI_BASE_URL", "/v1/")],
)  # fmt: skip
async def test_base_urls_as_each_sdk_takes_them(
    env: str, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ANTHROPIC_BASE_URL without /v1 (a trailing /v1 tolerated); OPENAI_BASE_URL with it."""
    provider = "anthropic" if env.startswith("ANTHROPIC") else "openai"
    async with running_strict() as server:
        monkeypatch.setenv(env, server.root + suffix)
        judge = create_judge(JudgeSettings(model=f"{provider}/claude-sonnet-4-5"))
        try:
            await judge.judge_item(req(ITEMS[0]))
        finally:
            await judge.aclose()
    assert server.stats.paths[0] in ("/v1/messages", "/v1/chat/completions")


# ---------------------------------------------------------------- structured output ladder


async def test_llama_cpp_500_on_json_schema_steps_down_to_json_object_with_schema() -> None:
    async with strict("openai/smollm2", StrictConfig(flavor="llamacpp")) as (judge, server, stats):
        replies = await asyncio.gather(*(judge.judge_item(req(t)) for t in ITEMS))
    assert [r.verdict.relevant for r in replies] == [expected_verdict(t) for t in ITEMS]
    assert 1 <= server.stats.by_status[500] <= len(ITEMS)
    assert stats.retries == 0
    assert server.stats.bodies[-1]["response_format"]["type"] == "json_object"
    assert "schema" in server.stats.bodies[-1]["response_format"]
    assert list(stats.adaptations) == [
        "structured output: json_object_schema (the server rejected json_schema)"
    ]


def test_openai_rejections_step_down_the_ladder() -> None:
    shape = RequestShape(output="json_object_schema")
    body = (
        '{"error": {"message": "Unknown parameter: \'response_format.schema\'.", "type": '
        '"invalid_request_error", "param": "response_format.schema", '
        '"code": "unknown_parameter"}}'
    )
    assert learn_openai(shape, 400, body, {"response_format": {}}) is not None
    assert shape.output == "json_object"
    no_json = (
        '{"error": {"message": "\'messages\' must contain the word \'json\' in some form, '
        "to use 'response_format' of type 'json_object'.\", \"type\": "
        '"invalid_request_error", "param": "messages", "code": null}}'
    )
    assert learn_openai(shape, 400, no_json, {"response_format": {}}) is not None
    assert shape.output == OUTPUT_LADDER[-1] == "text"
    assert learn_openai(shape, 500, '{"error": {"message": "server error"}}', {}) is None


@pytest.mark.parametrize(
    ("body", "check"),
    [
        (
            '{"error":{"message":"Unsupported parameter: \'max_tokens\' is not supported with this '
            'model. Use \'max_completion_tokens\' instead.","type":"invalid_request_error",'
            '"param":"max_tokens","code":"unsupported_parameter"}}',
            lambda s: s.tokens_field == "max_completion_tokens",
        ),
        (
            '{"error":{"message":"Unsupported value: \'temperature\' does not support 0 with this '
            'model. Only the default (1) value is supported.","type":"invalid_request_error",'
            '"param":"temperature","code":"unsupported_value"}}',
            lambda s: not s.send_temperature,
        ),
        (
            '{"error":{"message":"Unknown parameter: \'seed\'.","type":"invalid_request_error",'
            '"param":"seed","code":"unknown_parameter"}}',
            lambda s: "seed" in s.dropped,
        ),
    ],
)
def test_parameter_rejections_change_the_shape(body: str, check: Any) -> None:
    shape = openai_shape("qwen2.5", True, None)
    payload = {"model": "m", "temperature": 0, "max_tokens": 10, "seed": 1}
    assert learn_openai(shape, 400, body, payload) is not None
    assert check(shape)


async def test_ollama_prose_is_never_read_as_not_relevant() -> None:
    config = StrictConfig(flavor="ollama")
    async with strict("openai/llama3.2", config, structured_output=False) as (judge, _, stats):
        with pytest.raises(JudgeParseError) as caught:
            await judge.judge_item(req(ITEMS[0]))
    assert caught.value.cause == "unparseable"
    assert stats.failures == {"unparseable": 1}


# ---------------------------------------------------------------- refusals of the whole run


@pytest.mark.parametrize(
    ("model", "config", "words"),
    [
        ("openai/gpt-5-mini", StrictConfig(account="quota"), "quota"),
        ("openai/gpt-5-mini", StrictConfig(account="credit_exhausted"), "quota"),
        ("anthropic/claude-opus-4-7", StrictConfig(account="credit_low"), "credit balance"),
        ("anthropic/claude-opus-4-7", StrictConfig(account="usage_limit"), "usage limits"),
        ("openai/gpt-4o", StrictConfig(require_key="other"), "API key was refused"),
        ("openai/qwen", StrictConfig(flavor="vllm", require_key="other"), "Unauthorized"),
        ("openai/gpt-4o", StrictConfig(models=frozenset({"gpt-4.1"})), "does not exist"),
        ("anthropic/claude-opus-4-7", StrictConfig(models=frozenset()), "unknown model"),
    ],
)
async def test_run_wide_refusals_stop_every_call(
    model: str, config: StrictConfig, words: str
) -> None:
    async with strict(model, config) as (judge, server, _):
        results = await asyncio.gather(
            *(judge.judge_item(req(t)) for t in ITEMS * 3), return_exceptions=True
        )
        after = server.stats.total
        with pytest.raises(JudgeRefusedRunError):
            await judge.judge_item(req("one more"))
    assert all(isinstance(r, JudgeRefusedRunError) for r in results)
    assert after <= len(ITEMS) * 3
    assert server.stats.total == after
    assert words in str(results[0])
    assert "Fix:" in str(results[0])
    assert KEY not in str(results[0])


async def test_the_same_unadaptable_400_to_the_first_calls_refuses_the_run() -> None:
    config = StrictConfig()
    async with strict("openai/gpt-4o", config) as (judge, server, _):
        judge.shape.dropped.clear()
        judge.shape.tokens_field = "bogus_field"  # a request no server takes, nothing to learn
        judge._learn = lambda status, body, payload: None  # type: ignore[method-assign]
        results = [
            await asyncio.gather(judge.judge_item(req(t)), return_exceptions=True)
            for t in ITEMS[:5]
        ]
    kinds = [type(r[0]) for r in results]
    assert kinds[:2] == [JudgeFatalError, JudgeFatalError]
    assert kinds[2:] == [JudgeRefusedRunError] * 3
    assert server.stats.total == 3


# ---------------------------------------------------------------- kinds of 429 and 5xx


async def test_rate_limit_honours_the_hint_and_request_too_large_is_never_retried(
    retry_clock: RetryClock,
) -> None:
    config = StrictConfig(script=["rate_limit", "ok", "too_large"], retry_after_s=0.644)
    async with strict("openai/gpt-4o", config, clock=retry_clock) as (judge, server, stats):
        ok = await judge.judge_item(req(ITEMS[0]))
        with pytest.raises(JudgeFatalError) as caught:
            await judge.judge_item(req(ITEMS[1]))
    assert ok.verdict.relevant == expected_verdict(ITEMS[0])
    assert retry_clock.waits == [0.644]
    assert stats.rate_limited == 1
    assert caught.value.cause == "request_too_large"
    assert server.stats.total == 3
    assert "request id req_" in str(caught.value)


async def test_a_long_retry_after_pauses_the_run_with_a_line_saying_until_when(
    retry_clock: RetryClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ctxprec")
    config = StrictConfig(script=["long_retry"])
    async with strict("openai/gpt-4o", config, clock=retry_clock) as (judge, _, stats):
        reply = await judge.judge_item(req(ITEMS[0]))
    assert reply.verdict.relevant == expected_verdict(ITEMS[0])
    assert stats.pauses == 1
    assert retry_clock.waits
    assert retry_clock.waits[0] >= 120
    assert any("pausing all judge calls until" in m and "UTC" in m for m in caplog.messages)


@pytest.mark.parametrize(
    "outcome",
    ["overloaded_429", "overloaded_503", "busy_503", "html_502", "json_502", "litellm_429"],
)
async def test_transient_failures_of_every_shape_are_retried(outcome: str) -> None:
    async with strict("openai/gpt-4o", StrictConfig(script=[outcome, outcome])) as (
        judge,
        server,
        stats,
    ):
        reply = await judge.judge_item(req(ITEMS[3]))
    assert reply.verdict.relevant == expected_verdict(ITEMS[3])
    assert server.stats.total == 3
    assert stats.retries == 2


async def test_anthropic_529_and_rfc3339_rate_limits_are_retried(retry_clock: RetryClock) -> None:
    config = StrictConfig(script=["overloaded_529", "rate_limit_anthropic"], retry_after_s=7)
    judge_on = strict("anthropic/claude-sonnet-4-5", config, clock=retry_clock)
    async with judge_on as (judge, server, stats):
        reply = await judge.judge_item(req(ITEMS[3]))
    assert reply.verdict.relevant == expected_verdict(ITEMS[3])
    assert server.stats.total == 3
    assert stats.retries == 2
    assert retry_clock.waits[1] == 7.0


async def test_x_should_retry_false_and_context_length_fail_the_item_once() -> None:
    config = StrictConfig(script=["x_should_retry_false", "context_length"])
    async with strict("openai/gpt-4o", config) as (judge, server, _):
        errors = [
            (await asyncio.gather(judge.judge_item(req(t)), return_exceptions=True))[0]
            for t in ITEMS[:2]
        ]
    assert [getattr(e, "cause", None) for e in errors] == ["http_500", "context_length"]
    assert server.stats.total == 2


@pytest.mark.parametrize(
    "body",
    [
        '{"error": "Unauthorized"}',
        '{"error": {"code": 502, "message": "Bad gateway."}}',
        '{"error": {"code": "429", "type": "None", "message": "x"}}',
        "<html>502</html>",
        "",
        "[]",
    ],
)
def test_error_bodies_of_every_shape_are_read(body: str) -> None:
    for status in (400, 401, 429, 502):
        assert classify(status, body, {"x-request-id": "req_1"}).status == status


# ---------------------------------------------------------------- refusals, filters, usage


@pytest.mark.parametrize(
    ("model", "outcome", "cause"),
    [
        ("openai/gpt-4o", "refusal", "refused"),
        ("openai/gpt-4o", "content_filter", "filtered"),
        ("anthropic/claude-sonnet-4-5", "refusal", "refused"),
    ],
)
async def test_refusals_and_filters_are_their_own_failures(
    model: str, outcome: str, cause: str
) -> None:
    async with strict(model, StrictConfig(script=[outcome])) as (judge, server, stats):
        with pytest.raises(JudgeFatalError) as caught:
            await judge.judge_item(req(ITEMS[0]))
    assert caught.value.cause == cause
    assert server.stats.total == 1
    assert stats.reasks == 0


@pytest.mark.parametrize("model", ["openai/gpt-4o", "anthropic/claude-sonnet-4-5"])
async def test_cached_prompt_tokens_are_counted_once(model: str) -> None:
    async with strict(model, StrictConfig(cached_tokens=1000)) as (judge, server, stats):
        reply = await judge.judge_item(req(ITEMS[0]))
    prompt = len(__import__("json").dumps(server.stats.bodies[0]["messages"])) // 4 + 1
    # OpenAI: prompt_tokens already includes cached_tokens; Anthropic: reported beside it
    assert reply.input_tokens == prompt + 1000 == stats.input_tokens
    assert stats.cached_input_tokens == 1000


@pytest.mark.parametrize("outcome", ["no_usage", "null_completion"])
async def test_absent_or_partial_usage_is_tolerated(outcome: str) -> None:
    async with strict("openai/gpt-4o", StrictConfig(script=[outcome])) as (judge, _, stats):
        reply = await judge.judge_item(req(ITEMS[0]))
    assert reply.verdict.relevant == expected_verdict(ITEMS[0])
    assert reply.output_tokens == 0
    assert stats.failures == {}


async def test_batch_paths_build_and_read_the_same_bodies() -> None:
    async with strict("openai/gpt-5-mini") as (judge, _, _):
        body = judge.build_payload(req(ITEMS[0]))
        row = judge.build_payload(row=("q", None, ITEMS[:3]))
        data = {
            "choices": [
                {
                    "message": {"content": '{"relevant": true, "reason": "r"}'},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4},
        }
        refused = {
            "choices": [{"message": {"content": None, "refusal": "no"}, "finish_reason": "stop"}]
        }
        assert judge.read_response(data)[0].verdict.relevant is True
        with pytest.raises(JudgeFatalError):
            judge.read_response(refused)
    assert "temperature" not in body
    assert body["reasoning_effort"] == "minimal"
    assert row["response_format"]["json_schema"]["name"] == "verdicts"


def test_x_should_retry_overrides_the_status_as_the_sdks_do() -> None:
    body = '{"error": {"message": "try again", "type": "invalid_request_error"}}'
    assert classify(400, body, {"x-should-retry": "true"}).__class__.__name__ == (
        "JudgeRetryableError"
    )
    assert isinstance(classify(500, body, {"x-should-retry": "false"}), JudgeFatalError)
    assert classify(402, body).cause == "quota_exhausted"  # Anthropic billing_error, 402


@pytest.mark.parametrize(
    ("model", "temperature"),
    [("claude-opus-4-7", False), ("claude-opus-4-7-20260415", False), ("claude-sonnet-5", False),
     ("claude-opus-4-1-20250805", True), ("claude-opus-4-20250514", True),
     ("claude-3-7-sonnet-latest", True), ("claude-haiku-4-5", True)],
)  # fmt: skip
def test_anthropic_model_names_decide_temperature(model: str, temperature: bool) -> None:
    from ctxprec.connectors.judges.shapes import anthropic_shape

    assert anthropic_shape(model).send_temperature is temperature


@pytest.mark.parametrize(
    ("model", "effort", "field"),
    [("o1-mini", None, "max_completion_tokens"), ("gpt-5-pro", "high", "max_completion_tokens"),
     ("gpt-5-codex", "low", "max_completion_tokens"), ("gpt-5-chat-latest", None, "max_tokens"),
     ("gpt-4o-mini", None, "max_tokens"), ("Qwen/Qwen2.5-7B-Instruct", None, "max_tokens")],
)  # fmt: skip
def test_openai_model_names_decide_the_first_shape(
    model: str, effort: str | None, field: str
) -> None:
    shape = openai_shape(model, True, None)
    assert (shape.reasoning_effort, shape.tokens_field) == (effort, field)
    assert shape.send_temperature is (field == "max_tokens")
