"""Shared test fixtures: an isolated memo folder, the shared HotpotQA log, the loopback fake judge
server (on a thread, or in its own process), a loopback S3 server and a fresh bucket in it.
Plain constants and helpers live in `tests/fakes/` (`inputs.py`, `runs.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ctxprec.connectors.judges.retry import RetryClock
from tests.fakes.clock import instant_retries
from tests.fakes.inputs import HOTPOT, KEY
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeServer, FakeJudgeThread
from tests.fakes.recorder import recording_host
from tests.fakes.runs import judge_process
from tests.fakes.s3_server import S3Server, running_s3_server


@pytest.fixture(autouse=True)
def _isolated_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test touches the user's real memo folder."""
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path_factory.mktemp("memo")))


@pytest.fixture
def hotpot() -> Path:
    if not HOTPOT.is_file():
        pytest.skip(f"shared dataset not found at {HOTPOT}")
    return HOTPOT


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeJudgeServer]:
    """The fake judge server (default behaviour) on a thread; the OpenAI and Anthropic base URLs
    point at it and both API keys are `KEY`."""
    with FakeJudgeThread(FakeJudgeConfig()) as server:
        for provider in ("OPENAI", "ANTHROPIC"):
            monkeypatch.setenv(f"{provider}_BASE_URL", server.url)
            monkeypatch.setenv(f"{provider}_API_KEY", KEY)
        yield server


@pytest.fixture
def server() -> Iterator[str]:
    """The fake judge in its own process (30 ± 10 ms a call): its …/v1 URL."""
    with judge_process("--latency-ms", "30", "--jitter-ms", "10") as url:
        yield url


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    """A loopback S3 server (moto's server mode), one per test module."""
    pytest.importorskip("moto")
    with running_s3_server() as server:
        yield server


_BUCKETS = iter(range(1_000_000))


@pytest.fixture
def bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; the process environment points at the loopback server."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    name = f"bucket-{next(_BUCKETS)}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def retry_clock() -> RetryClock:
    """Instant, recorded retry waits (jitter draws 0 so waits are exact), for a test to pass to
    the judge or batch client it builds (`create_judge(..., seams=Seams(clock=retry_clock))`)."""
    return instant_retries()


@pytest.fixture
def judge_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both providers' API keys set to KEY; their base-URL variables unset."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.setenv(name, KEY)
    for name in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def planted_host() -> Iterator[tuple[str, list[str]]]:
    """A loopback host a planted state file names: (its /v1 URL, the requests it received)."""
    with recording_host() as host:
        yield host
