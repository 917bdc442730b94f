"""Judge machinery without a network: Retry-After parsing, the status table, backoff, key
redaction, and where keys and endpoints come from."""

from __future__ import annotations

import email.utils
import logging
from datetime import UTC, datetime

import aiohttp
import pytest

from ctxprec.connectors.judges import JudgeSettings, create_judge
from ctxprec.connectors.judges.retry import backoff, classify, classify_exception, parse_retry_after
from ctxprec.connectors.judges.secrets import RedactingFilter, is_loopback, redact, register_secret
from ctxprec.storage.core.errors import ConfigError, JudgeFatalError, JudgeRetryableError

NOW = 1_700_000_000.0
PROVIDERS = ["openai", "anthropic"]


def _http_date(offset_s: float) -> str:
    return email.utils.formatdate(NOW + offset_s, usegmt=True)


def _rfc3339(offset_s: float) -> str:
    return datetime.fromtimestamp(NOW + offset_s, tz=UTC).isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"Retry-After-Ms": "20", "Retry-After": "9"}, 0.02),
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after": "0.25"}, 0.25),
        ({"Retry-After": _http_date(7)}, 7.0),
        ({"Retry-After": _http_date(-30)}, 0.0),
        ({"Retry-After": "99999"}, 600.0),
        ({"Retry-After": "-5"}, 0.0),
        ({"Retry-After": "soon"}, None),
        ({"retry-after-ms": "nan", "Retry-After": "2"}, 2.0),
        ({"x-ratelimit-reset-requests": "1s"}, 1.0),
        ({"x-ratelimit-reset-requests": "20ms"}, 0.02),
        ({"x-ratelimit-reset-tokens": "6m0s"}, 360.0),
        ({"x-ratelimit-reset-tokens": "1h2m3.5s"}, 600.0),
        # both given: the exhausted limit's reset wins; with none exhausted, the shortest.
        (
            {
                "x-ratelimit-reset-requests": "2s", "x-ratelimit-remaining-requests": "5",
                "x-ratelimit-reset-tokens": "45s", "x-ratelimit-remaining-tokens": "0",
            },
            45.0,
        ),
        ({"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "45s"}, 2.0),
        ({"Retry-After": "4", "x-ratelimit-reset-requests": "30s"}, 4.0),
        ({"anthropic-ratelimit-requests-reset": _rfc3339(12)}, 12.0),
        ({"anthropic-ratelimit-tokens-reset": "not a date"}, None),
        ({}, None),
        ({"content-type": "application/json"}, None),
    ],
)  # fmt: skip
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    got = parse_retry_after(headers, now=NOW)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, abs=1e-6)


def test_parse_retry_after_reads_aiohttp_headers() -> None:
    from multidict import CIMultiDict, CIMultiDictProxy

    headers = CIMultiDictProxy(CIMultiDict({"RETRY-AFTER-MS": "250"}))
    assert parse_retry_after(headers) == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("status", "cause"),
    [(408, "http_408"), (409, "http_409"), (429, "rate_limited"), (500, "http_500"),
     (502, "http_502"), (503, "http_503"), (504, "http_504"), (529, "http_529")],
)  # fmt: skip
def test_retryable_statuses(status: int, cause: str) -> None:
    err = classify(status, '{"error": {"message": "busy"}}', {"Retry-After": "2"})
    assert isinstance(err, JudgeRetryableError)
    assert (err.cause, err.status, err.retry_after) == (cause, status, 2.0)
    assert "busy" in str(err)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 405, 413])
def test_fatal_statuses(status: int) -> None:
    err = classify(status, '{"error": {"message": "nope"}}', {})
    assert isinstance(err, JudgeFatalError)
    assert (err.cause, err.status) == (f"http_{status}", status)


@pytest.mark.parametrize(
    "body",
    [
        '{"error": {"type": "insufficient_quota", "message": "You exceeded your current quota"}}',
        '{"error": {"message": "Your quota is exhausted for this month"}}',
        "please check your plan and billing details",
    ],
)
def test_quota_429_is_fatal(body: str) -> None:
    err = classify(429, body, {"Retry-After": "1"})
    assert isinstance(err, JudgeFatalError)
    assert err.cause == "quota_exhausted"


def test_a_rate_limit_that_mentions_the_billing_page_stays_retryable() -> None:
    body = (
        '{"error": {"type": "requests", "message": "Rate limit reached on requests per day. '
        "You can increase your rate limit by adding a payment method at "
        'https://platform.openai.com/account/billing."}}'
    )
    assert isinstance(classify(429, body, {}), JudgeRetryableError)


def test_error_detail_falls_back_to_the_text() -> None:
    err = classify(502, "<html>Bad gateway</html>\n\n", {})
    assert "<html>Bad gateway</html>" in str(err)
    assert "(empty body)" in str(classify(500, "", {}))


@pytest.mark.parametrize(
    ("exc", "kind", "cause"),
    [
        (TimeoutError(), JudgeRetryableError, "timeout"),
        (aiohttp.ServerTimeoutError("read"), JudgeRetryableError, "timeout"),
        (aiohttp.ServerDisconnectedError(), JudgeRetryableError, "connection"),
        (aiohttp.ClientPayloadError("truncated"), JudgeRetryableError, "connection"),
        (ConnectionResetError(), JudgeRetryableError, "connection"),
        (aiohttp.InvalidURL("nope://"), JudgeFatalError, "bad_url"),
    ],
)
def test_classify_exception(exc: BaseException, kind: type, cause: str) -> None:
    err = classify_exception(exc)
    assert isinstance(err, kind)
    assert err is not None
    assert err.cause == cause


def test_classify_exception_leaves_bugs_alone() -> None:
    assert classify_exception(KeyError("x")) is None


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    assert [backoff(n, 0.5, 4.0, rand=lambda: 1.0) for n in range(1, 6)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        4.0,
    ]
    assert backoff(3, 0.5, 4.0, rand=lambda: 0.0) == 0.0
    assert backoff(10_000, 0.5, 4.0, rand=lambda: 0.5) == 2.0


def test_backoff_uses_retry_after_plus_small_jitter() -> None:
    assert backoff(1, 0.5, 4.0, 7.0, rand=lambda: 0.0) == 7.0
    assert backoff(1, 0.5, 4.0, 7.0, rand=lambda: 1.0) == pytest.approx(7.7)
    assert backoff(1, 0.5, 4.0, 120.0, rand=lambda: 1.0) == pytest.approx(121.0)


def test_redact_removes_keys_and_auth_values() -> None:
    register_secret("plain-secret-value-123")
    text = (
        "Authorization: Bearer abc.def-ghi {'x-api-key': 'sk-ant-api03-ABCDEFGHIJ'} "
        "api-key=azurekey42 key sk-proj-0123456789abcdef and plain-secret-value-123"
    )
    clean = redact(text)
    for secret in ("abc.def-ghi", "sk-ant-api03", "azurekey42", "sk-proj", "plain-secret"):
        assert secret not in clean
    assert "Authorization" in clean


def test_redacting_filter_is_on_the_ctxprec_loggers(caplog: pytest.LogCaptureFixture) -> None:
    for name in ("ctxprec", "ctxprec.http"):
        assert any(isinstance(f, RedactingFilter) for f in logging.getLogger(name).filters)
    caplog.set_level(logging.DEBUG, logger="ctxprec")
    logging.getLogger("ctxprec.http").debug("sent %s", {"Authorization": "Bearer sk-zzzzzzzzzz"})
    assert "sk-zzzz" not in caplog.text
    assert "Authorization" in caplog.text


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("base_url", [None, "https://llm.example.com/v1"])
def test_missing_key_is_a_config_error(
    provider: str, base_url: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = f"{provider.upper()}_API_KEY"
    monkeypatch.delenv(env, raising=False)
    monkeypatch.delenv(f"{provider.upper()}_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match=env):
        create_judge(JudgeSettings(model=f"{provider}/m", base_url=base_url))


def test_api_key_env_names_another_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("MY_PROXY_KEY", "proxy-key-123456")
    url = "https://proxy.example/v1/"
    judge = create_judge(JudgeSettings(model="openai/m", base_url=url, api_key_env="MY_PROXY_KEY"))
    assert judge.identity()["base_url"] == "https://proxy.example/v1"


@pytest.mark.parametrize(
    ("url", "loopback"),
    [("http://localhost:11434/v1", True), ("http://127.0.0.1:8000/v1", True),
     ("http://127.1.2.3/v1", True), ("http://[::1]:8000/v1", True),
     ("https://api.openai.com/v1", False), ("http://10.0.0.5:8000/v1", False)],
)  # fmt: skip
def test_is_loopback(url: str, loopback: bool) -> None:
    assert is_loopback(url) is loopback
