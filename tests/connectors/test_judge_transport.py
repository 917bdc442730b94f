"""The HTTP judges' client and conversation without a server: each judge gets a `MockTransport`
(tests/fakes/transport.py) that answers with what the providers send. Retries on 429 honour
Retry-After, 401/404 refuse the run, an unreadable reply is re-asked once, a rejected parameter
is learned for the rest of the run. The real aiohttp path is tested in test_http_judges.py."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from ctxprec.connectors.judges import ItemRequest, JudgeSettings, JudgeStats
from ctxprec.connectors.judges.anthropic import AnthropicJudge
from ctxprec.connectors.judges.batch.client import BatchHttp
from ctxprec.connectors.judges.openai import OpenAIJudge
from ctxprec.connectors.judges.retry import RetryClock, RetryPolicy
from ctxprec.connectors.judges.transport import (
    AiohttpTransport,
    HttpRequest,
    HttpResponse,
    multipart_form,
)
from ctxprec.storage.core.errors import (
    JudgeFatalError,
    JudgeRefusedRunError,
    JudgeRetryableError,
    JudgeUnreachableError,
)
from ctxprec.storage.core.seams import Seams
from tests.fakes.clock import instant_retries
from tests.fakes.inputs import KEY
from tests.fakes.judge_server import start_loopback
from tests.fakes.transport import (
    MockTransport,
    anthropic_error,
    anthropic_message,
    openai_completion,
    openai_error,
    rate_limited,
    replies,
    verdict_json,
)

pytestmark = pytest.mark.usefixtures("judge_keys")

REQUEST = ItemRequest("Who wrote Dune?", "Frank Herbert", "Dune is a 1965 novel by Frank Herbert.")


class RecordingThrottle:
    """A throttle that admits everything and records what the client tells it."""

    def __init__(self) -> None:
        self.slots = 0
        self.rate_limited_calls: list[float | None] = []

    @contextlib.asynccontextmanager
    async def slot(self, est_tokens: int) -> AsyncIterator[None]:
        self.slots += 1
        yield

    def rate_limited(self, retry_after: float | None) -> None:
        self.rate_limited_calls.append(retry_after)

    def used_tokens(self, estimated: int, actual: int) -> None:
        pass


def openai_judge(
    transport: MockTransport,
    model: str = "gpt-4o-mini",
    clock: RetryClock | None = None,
    **settings: Any,
) -> tuple[OpenAIJudge, JudgeStats, RecordingThrottle]:
    """An OpenAI judge over `transport`, waiting between attempts on `clock` (instant)."""
    stats, throttle = JudgeStats(), RecordingThrottle()
    judge_settings = JudgeSettings(model=f"openai/{model}", **settings)
    seams = Seams(transport=transport, clock=clock or instant_retries())
    judge = OpenAIJudge(model, judge_settings, throttle, stats, seams=seams)
    return judge, stats, throttle


def anthropic_judge(
    transport: MockTransport, clock: RetryClock | None = None
) -> tuple[AnthropicJudge, JudgeStats]:
    stats = JudgeStats()
    settings = JudgeSettings(model="anthropic/claude-haiku-4-5")
    seams = Seams(transport=transport, clock=clock or instant_retries())
    judge = AnthropicJudge("claude-haiku-4-5", settings, RecordingThrottle(), stats, seams=seams)
    return judge, stats


# ---------------------------------------------------------------- retries


async def test_429_waits_what_retry_after_says_then_succeeds(retry_clock: RetryClock) -> None:
    transport = MockTransport(replies(rate_limited(2.0), openai_completion(verdict_json(True))))
    judge, stats, throttle = openai_judge(transport, clock=retry_clock)
    reply = await judge.judge_item(REQUEST)
    assert reply.verdict.relevant is True
    assert retry_clock.waits == [2.0]
    assert stats.retries == 1
    assert stats.rate_limited == 1
    assert stats.requests == 2
    assert throttle.rate_limited_calls == [2.0]
    assert throttle.slots == 2
    assert dict(stats.errors_by_cause) == {"rate_limited": 1}
    assert transport.requests[0].url == "https://api.openai.com/v1/chat/completions"
    assert transport.requests[0].headers["Authorization"] == f"Bearer {KEY}"


async def test_retries_stop_at_the_time_budget(retry_clock: RetryClock) -> None:
    transport = MockTransport(replies(rate_limited(4.0)))
    judge, stats, _ = openai_judge(transport, clock=retry_clock, retry_budget_s=10.0)
    with pytest.raises(JudgeRetryableError) as caught:
        await judge.judge_item(REQUEST)
    assert retry_clock.waits == [4.0, 4.0]  # a third 4 s wait would pass the 10 s budget
    assert len(transport.requests) == 3
    assert caught.value.cause == "rate_limited"
    assert "retry_budget_s=10" in str(caught.value)
    assert stats.failures["rate_limited"] == 1


def judge_down_for(seconds: float, clock: RetryClock) -> MockTransport:
    """A judge that refuses connections for `seconds` of the clock's time, then answers."""
    up_at = clock.now() + seconds

    def handler(request: HttpRequest) -> HttpResponse:
        if clock.now() < up_at:
            raise ConnectionRefusedError(111, "Connection refused")
        return openai_completion(verdict_json(True))

    return MockTransport(handler)


async def test_an_outage_shorter_than_the_budget_costs_no_call() -> None:
    """A judge down for 40 s used to fail the call after 7 quick attempts;
    connection errors are waited out for the time budget, whatever max_retries says."""
    clock = RetryClock(instant=True, rand=lambda: 1.0)  # full backoff: 0.5, 1, 2, ... 30 s
    transport = judge_down_for(40.0, clock)
    judge, stats, _ = openai_judge(transport, clock=clock, max_retries=2, retry_budget_s=120)
    reply = await judge.judge_item(REQUEST)
    assert reply.verdict.relevant is True
    assert stats.retries == len(clock.waits) == 7  # more than max_retries
    assert sum(clock.waits) == 61.5  # 0.5 + 1 + ... + 16, then the 30 s cap
    assert clock.waits[:4] == [0.5, 1.0, 2.0, 4.0]


async def test_a_judge_never_reached_says_so_at_once_and_stops_the_run_at_the_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A dead base URL: one line at the first connection error (before any retry wait) naming
    the URL, that ctxprec keeps retrying until the budget ends and how to stop or change it;
    when the budget ends with no call ever answered, the run stops (JudgeUnreachableError,
    exit 4) instead of failing every row: the next call fails at once, without a request."""
    said: list[str] = []

    def on_sleep(seconds: float) -> None:
        said.append(capsys.readouterr().err)

    clock = RetryClock(instant=True, rand=lambda: 1.0, on_sleep=on_sleep)
    transport = judge_down_for(1e9, clock)
    judge, _, _ = openai_judge(transport, clock=clock, retry_budget_s=60)
    with pytest.raises(JudgeUnreachableError) as caught:
        await judge.judge_item(REQUEST)
    first = len(transport.requests)
    with pytest.raises(JudgeUnreachableError):
        await judge.judge_item(REQUEST)  # the run is stopped: no further request
    said.append(capsys.readouterr().err)
    assert "cannot be reached" in said[0]  # printed with the first error, before any wait
    lines = [x for x in "".join(said).splitlines() if "cannot be reached" in x]
    assert len(lines) == 1  # once, not once per call or retry
    line = lines[0]
    assert "https://api.openai.com/v1/chat/completions" in line
    assert "keeps retrying until the retry budget of 60 s ends, then stops (exit 4)" in line
    assert "Ctrl-C stops the run now" in line
    assert "--retry-budget" in line
    assert "--base-url" in line
    assert sum(clock.waits) <= 60.0
    assert len(transport.requests) == first
    message = str(caught.value)
    assert "no call reached the judge at https://api.openai.com/v1/chat/completions" in message
    assert "Fix: check the base URL" in message
    assert caught.value.exit_code == 4


async def test_a_judge_that_answered_before_fails_its_calls_after_the_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An outage after the judge answered is waited out call by call (a restart is down for
    seconds); past the budget the calls fail as rows, and later calls fail at once."""
    clock = RetryClock(instant=True, rand=lambda: 1.0)
    judge, _, _ = openai_judge(judge_down_for(0.0, clock), clock=clock, retry_budget_s=60)
    assert (await judge.judge_item(REQUEST)).verdict.relevant is True
    transport = judge_down_for(1e9, clock)
    judge.transport = transport
    with pytest.raises(JudgeRetryableError) as caught:
        await judge.judge_item(REQUEST)
    assert caught.value.cause == "connection"
    assert "connection errors are retried for the budget" in str(caught.value)
    assert "stopped answering" in capsys.readouterr().err
    first = len(transport.requests)
    with pytest.raises(JudgeRetryableError):
        await judge.judge_item(REQUEST)  # the judge has been gone the whole budget already
    assert len(transport.requests) == first + 1


async def test_a_reply_resets_the_outage_clock() -> None:
    clock = RetryClock(instant=True, rand=lambda: 1.0)
    judge, _, _ = openai_judge(judge_down_for(40.0, clock), clock=clock, retry_budget_s=120)
    await judge.judge_item(REQUEST)
    judge.transport = judge_down_for(40.0, clock)  # a second outage after the judge answered
    assert (await judge.judge_item(REQUEST)).verdict.relevant is True


async def test_a_retry_budget_of_zero_retries_nothing(retry_clock: RetryClock) -> None:
    script = replies(
        openai_completion(verdict_json(True)),
        ConnectionResetError("peer reset"),
        openai_completion(verdict_json(False)),
    )
    transport = MockTransport(script)
    judge, _, _ = openai_judge(transport, clock=retry_clock, retry_budget_s=0)
    await judge.judge_item(REQUEST)  # it answered once: a later outage fails the call
    with pytest.raises(JudgeRetryableError):
        await judge.judge_item(REQUEST)
    assert len(transport.requests) == 2


async def test_a_dropped_connection_is_retried(retry_clock: RetryClock) -> None:
    script = replies(ConnectionResetError("peer reset"), openai_completion(verdict_json(False)))
    judge, stats, _ = openai_judge(MockTransport(script), clock=retry_clock)
    reply = await judge.judge_item(REQUEST)
    assert reply.verdict.relevant is False
    assert dict(stats.errors_by_cause) == {"connection": 1}
    assert stats.retries == 1
    assert retry_clock.waits == [0.0]  # plain backoff, jitter draw 0


async def test_anthropic_overloaded_529_is_retried(retry_clock: RetryClock) -> None:
    script = replies(
        anthropic_error(529, "overloaded_error", "Overloaded"),
        anthropic_message(verdict_json(True)),
    )
    transport = MockTransport(script)
    judge, stats = anthropic_judge(transport, retry_clock)
    reply = await judge.judge_item(REQUEST)
    assert reply.verdict.relevant is True
    assert stats.retries == 1
    assert len(retry_clock.waits) == 1
    assert dict(stats.errors_by_cause) == {"http_529": 1}
    assert transport.requests[0].headers["x-api-key"] == KEY


# ---------------------------------------------------------------- the run refused


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (openai_error(401, f"Incorrect API key provided: {KEY}.", code="invalid_api_key"),
         "the API key was refused"),
        (openai_error(404, "The model `gpt-9` does not exist or you do not have access to it.",
                      code="model_not_found"), "unknown model or wrong endpoint"),
    ],
)  # fmt: skip
async def test_401_and_404_refuse_the_run_without_retrying(
    reply: HttpResponse, words: str, retry_clock: RetryClock
) -> None:
    transport = MockTransport(replies(reply))
    judge, stats, _ = openai_judge(transport, clock=retry_clock)
    with pytest.raises(JudgeRefusedRunError) as caught:
        await judge.judge_item(REQUEST)
    assert words in str(caught.value)
    assert KEY not in str(caught.value)
    assert len(transport.requests) == 1
    assert stats.retries == 0
    assert retry_clock.waits == []
    with pytest.raises(JudgeRefusedRunError) as again:  # every later call: no request at all
        await judge.judge_item(REQUEST)
    assert again.value is caught.value
    assert len(transport.requests) == 1


async def test_a_fatal_400_is_not_retried() -> None:
    message = "This model's maximum context length is 8192 tokens."
    transport = MockTransport(replies(openai_error(400, message, code="context_length_exceeded")))
    judge, stats, _ = openai_judge(transport)
    with pytest.raises(JudgeFatalError) as caught:
        await judge.judge_item(REQUEST)
    assert caught.value.cause == "context_length"
    assert len(transport.requests) == 1
    assert stats.retries == 0


# ---------------------------------------------------------------- the conversation


async def test_an_unreadable_reply_is_reasked_once_showing_the_model_its_reply() -> None:
    script = replies(openai_completion("hard to say, it depends"),
                     openai_completion(verdict_json(True)))  # fmt: skip
    transport = MockTransport(script)
    judge, stats, _ = openai_judge(transport)
    reply = await judge.judge_item(REQUEST)
    assert reply.verdict.relevant is True
    assert stats.reasks == 1
    assert len(transport.requests) == 2
    messages = transport.bodies[1]["messages"]
    assert messages[-2] == {"role": "assistant", "content": "hard to say, it depends"}
    assert messages[-1]["role"] == "user"
    assert messages[-1]["content"].startswith("Reply with JSON")
    assert reply.input_tokens == stats.input_tokens == 80  # usage summed over both calls


async def test_a_refusal_is_not_a_verdict() -> None:
    transport = MockTransport(replies(openai_completion(None, refusal="I can't help with that.")))
    judge, stats, _ = openai_judge(transport)
    with pytest.raises(JudgeFatalError) as caught:
        await judge.judge_item(REQUEST)
    assert caught.value.cause == "refused"
    assert stats.reasks == 0


async def test_a_rejected_parameter_is_learned_for_the_rest_of_the_run() -> None:
    """A 400 naming `max_tokens` (a reasoning model behind an unfamiliar name) is answered by
    sending `max_completion_tokens` at once, for this call and every later one."""

    def handler(request: HttpRequest) -> HttpResponse:
        if "max_tokens" in request.json:
            return openai_error(
                400,
                "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
                param="max_tokens",
                code="unsupported_parameter",
            )
        return openai_completion(verdict_json(True))

    transport = MockTransport(handler)
    judge, stats, _ = openai_judge(transport, model="my-reasoner")
    assert (await judge.judge_item(REQUEST)).verdict.relevant is True
    assert (await judge.judge_item(REQUEST)).verdict.relevant is True
    sent = ["max_tokens" in b for b in transport.bodies]
    assert sent == [True, False, False]
    assert all(b.get("max_completion_tokens") for b in transport.bodies[1:])
    assert stats.retries == 0
    assert stats.adaptations == {"max_completion_tokens sent instead of max_tokens": 1}
    assert judge.sent_shape()["tokens_field"] == "max_completion_tokens"


async def test_a_caller_given_transport_is_the_callers_to_close() -> None:
    transport = MockTransport(replies(openai_completion(verdict_json(True))))
    judge, _, _ = openai_judge(transport)
    await judge.judge_item(REQUEST)
    await judge.aclose()
    other, _, _ = openai_judge(transport)
    assert (await other.judge_item(REQUEST)).verdict.relevant is True
    assert [b["model"] for b in transport.bodies] == ["gpt-4o-mini", "gpt-4o-mini"]


# ---------------------------------------------------------------- batch endpoints, same path


def batch_http(transport: MockTransport, clock: RetryClock, **settings: Any) -> BatchHttp:
    policy = RetryPolicy.of(JudgeSettings(**settings))
    return BatchHttp({"Authorization": f"Bearer {KEY}"}, "openai/m", transport, policy, clock)


async def test_batch_requests_wait_what_retry_after_says_on_the_judges_clock(
    retry_clock: RetryClock,
) -> None:
    batch = HttpResponse(200, '{"id": "batch_1", "status": "in_progress"}')
    transport = MockTransport(replies(rate_limited(2.0), batch))
    http = batch_http(transport, retry_clock)
    assert await http.json("GET", "https://api.example/v1/batches/batch_1") == {
        "id": "batch_1",
        "status": "in_progress",
    }
    assert retry_clock.waits == [2.0]
    assert [r.method for r in transport.requests] == ["GET", "GET"]
    assert transport.requests[0].content == b""  # no body on a GET
    assert transport.requests[0].headers["Authorization"] == f"Bearer {KEY}"


async def test_batch_requests_stop_at_the_judges_max_retries(retry_clock: RetryClock) -> None:
    transport = MockTransport(replies(HttpResponse(503, "busy")))
    http = batch_http(transport, retry_clock, max_retries=2)
    with pytest.raises(JudgeRetryableError, match=r"^openai/m: POST https://x/v1/batches failed"):
        await http.json("POST", "https://x/v1/batches", body={"input_file_id": "f"})
    assert len(transport.requests) == 3
    assert retry_clock.waits == [0.0, 0.0]  # plain backoff, jitter draw 0
    assert transport.bodies == [{"input_file_id": "f"}] * 3


async def test_batch_requests_keep_to_the_retry_budget(retry_clock: RetryClock) -> None:
    transport = MockTransport(replies(rate_limited(4.0)))
    http = batch_http(transport, retry_clock, retry_budget_s=10.0)
    with pytest.raises(JudgeRetryableError):
        await http.json("GET", "https://x/v1/batches")
    assert retry_clock.waits == [4.0, 4.0]  # a third 4 s wait would pass the 10 s budget


async def test_a_result_file_is_downloaded_through_the_transport_and_retried(
    retry_clock: RetryClock,
) -> None:
    jsonl = '{"custom_id":"k1"}\n\n{"custom_id":"k2","x":"' + "y" * 40 + '"}\n{"custom_id":"k3"}'
    transport = MockTransport(replies(HttpResponse(502, "<html>bad gateway</html>"),
                                      HttpResponse(200, jsonl)))  # fmt: skip
    http = batch_http(transport, retry_clock)
    got = [json.loads(line)["custom_id"] async for line in http.lines("https://x/files/f/content")]
    assert got == ["k1", "k2", "k3"]
    assert len(retry_clock.waits) == 1
    assert len(transport.requests) == 2


async def test_a_results_line_past_the_cap_fails_the_download(retry_clock: RetryClock) -> None:
    """A hostile or broken batch server cannot make ctxprec hold one endless line (it arrives
    in 7-byte blocks here: the line is joined once, not copied at every block)."""
    jsonl = '{"custom_id":"k1"}\n{"custom_id":"k2","x":"' + "y" * 5000 + '"}\n{"custom_id":"k3"}'
    transport = MockTransport(replies(HttpResponse(200, jsonl)))
    http = batch_http(transport, retry_clock)
    got: list[str] = []

    async def download() -> None:
        async for line in http.lines("https://x/files/f/content", max_line_bytes=1000):
            got.append(json.loads(line)["custom_id"])

    with pytest.raises(JudgeFatalError) as caught:
        await download()
    assert got == ["k1"]
    assert caught.value.cause == "reply_too_large"
    assert "a results line over 1,000 bytes" in str(caught.value)
    assert len(transport.requests) == 1  # not retried
    lines = [line async for line in http.lines("https://x/files/f/content", max_line_bytes=6000)]
    assert [json.loads(line)["custom_id"] for line in lines] == ["k1", "k2", "k3"]


async def test_a_multipart_upload_is_built_again_for_each_attempt(retry_clock: RetryClock) -> None:
    transport = MockTransport(replies(HttpResponse(500, "oops"), HttpResponse(200, '{"id": "f"}')))
    http = batch_http(transport, retry_clock)
    built: list[int] = []

    def form() -> tuple[bytes, str]:
        built.append(1)
        return multipart_form({"purpose": "batch"}, {"file": ("c.jsonl", b"{}\n", "text/x")})

    assert await http.json("POST", "https://x/v1/files", content=form) == {"id": "f"}
    assert len(built) == 2
    sent = transport.requests[1]
    assert sent.headers["content-type"].startswith("multipart/form-data; boundary=ctxprec-")
    assert sent.content is not None
    assert b'name="purpose"\r\n\r\nbatch\r\n' in sent.content
    assert b'filename="c.jsonl"\r\nContent-Type: text/x\r\n\r\n{}\n\r\n' in sent.content


async def test_the_aiohttp_transport_sends_raw_bodies_and_streams_replies() -> None:
    """On a real loopback server: no body (nor content type) for b"", a multipart form the
    server reads as one, and a reply body handed over block by block."""
    seen: list[tuple[str, str | None, bytes, dict[str, str]]] = []

    async def handler(request: web.Request) -> web.Response:
        body, fields = b"", {}
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            upload = form["file"]
            assert isinstance(upload, web.FileField)
            fields = {"purpose": str(form["purpose"]), "filename": upload.filename,
                      "file": upload.file.read().decode()}  # fmt: skip
        else:
            body = await request.read()
        seen.append((request.method, request.headers.get("Content-Type"), body, fields))
        return web.Response(body=b'{"custom_id":"a"}\n' * 3)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner, url = await start_loopback(app, 0)
    transport = AiohttpTransport(5.0, per_read=True)
    try:
        reply = await transport.send(HttpRequest("GET", f"{url}/b", {}, content=b""))
        assert reply.status == 200
        data, kind = multipart_form({"purpose": "batch"}, {"file": ("c.jsonl", b"{}\n", "x/y")})
        upload = HttpRequest("POST", f"{url}/files", {"content-type": kind}, content=data)
        await transport.send(upload)
        async with transport.stream(HttpRequest("GET", f"{url}/f", {}, content=b"")) as got:
            blocks = [block async for block in got.blocks]
    finally:
        await transport.aclose()
        await runner.cleanup()
    assert seen[0][:3] == ("GET", None, b"")
    assert seen[1][3] == {"purpose": "batch", "filename": "c.jsonl", "file": "{}\n"}
    assert got.status == 200
    assert b"".join(blocks) == b'{"custom_id":"a"}\n' * 3
