"""Token counts a judge reports are data: `usage.prompt_tokens = 2**62` ended a run in exit 3
(an Int128 TypeError building the token columns), on every re-run with --no-memo, and with a
memo the summary showed 1.4 x 10^18 tokens. A count outside 0..10^9 makes that call's usage
unknown (counted as 0 tokens, said once per run), never a crash or an absurd total."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ctxprec.storage.core.constants import MAX_CALL_TOKENS
from ctxprec.storage.memo.codec import MAGIC, decode_columns, decode_entry, encode_entry
from tests.fakes.hostile_judge import HostileJudge
from tests.fakes.runs import score

VERDICT = '{"relevant": true, "reason": "It says so."}'
ABSURD = [2**62, 10**30, -5, MAX_CALL_TOKENS + 1]


def _usage(provider: str, count: int) -> dict[str, Any]:
    if provider == "openai":
        return {"prompt_tokens": count, "completion_tokens": 7, "total_tokens": count + 7}
    return {"input_tokens": 12, "cache_read_input_tokens": count, "output_tokens": 7}


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.parquet"
    pl.DataFrame(
        {"id": ["a", "b"], "query": ["q1", "q2"], "contexts": [["c1", "c2"], ["c3", "c4"]]}
    ).write_parquet(path)
    return path


def _run(
    provider: str, count: int, source: Path, out: Path, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> int:
    with HostileJudge(lambda path, body: VERDICT, usage=_usage(provider, count)) as judge:
        env = "OPENAI" if provider == "openai" else "ANTHROPIC"
        monkeypatch.setenv(f"{env}_BASE_URL", judge.url)
        monkeypatch.setenv(f"{env}_API_KEY", "sk-test-usage-0123456789")
        return score(source, "-o", out, "--model", f"{provider}/judge-1", *extra)


@pytest.mark.parametrize("count", ABSURD, ids=["2^62", "10^30", "negative", "10^9+1"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_absurd_token_count_is_unknown_usage_said_once(
    provider: str,
    count: int,
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="ctxprec")
    out = tmp_path / "out"
    code = _run(provider, count, source, out, monkeypatch, "--no-memo")
    err = capsys.readouterr().err
    assert code == 0, err
    assert sum("token counts outside" in m for m in caplog.messages) == 1  # four calls, one line
    rows = pl.read_parquet(out / "*.parquet")
    assert rows["status"].to_list() == ["ok", "ok"]
    for column in ("paid_input_tokens", "verdict_input_tokens"):  # unknown, never the absurd figure
        assert rows[column].to_list() == [0, 0]
    run = json.loads((out / "_ctxprec" / "run.json").read_text())
    assert run["judge"]["usage_unknown"] == 4
    assert 0 <= run["judge"]["input_tokens"] <= 4 * MAX_CALL_TOKENS
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens"]["paid_input_this_run"] == 0
    assert summary["tokens"]["verdict_input_all_rows"] == 0
    assert summary["judge"]["usage_unknown"] == 4


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_with_a_memo_the_summary_shows_no_absurd_total(
    provider: str, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memo = tmp_path / "memo"
    for name in ("first", "again"):
        out = tmp_path / name
        assert _run(provider, 2**62, source, out, monkeypatch, "--cache-dir", str(memo)) == 0
        summary = json.loads((out / "summary.json").read_text())
        tokens = summary["tokens"]
        assert tokens["paid_input_all_runs"] <= 4 * 12
        assert tokens["verdict_input_all_rows"] <= 4 * 12
        assert tokens["paid_output_all_runs"] <= 4 * 7
        assert tokens["verdict_output_all_rows"] <= 4 * 7


def test_a_sane_count_is_kept(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ctxprec")
    out = tmp_path / "out"
    assert _run("openai", MAX_CALL_TOKENS, source, out, monkeypatch, "--no-memo") == 0
    assert not any("token counts outside" in m for m in caplog.messages)
    rows = pl.read_parquet(out / "*.parquet")
    assert rows["paid_input_tokens"].to_list() == [2 * MAX_CALL_TOKENS] * 2


def _header(tokens_in: int, tokens_out: int) -> bytes:
    return struct.pack("<4sBQQ", MAGIC, 1, tokens_in, tokens_out)


def test_a_memo_value_with_an_absurd_count_is_not_a_verdict() -> None:
    """A planted memo value (2^56 - 1 tokens fitted the old check) is judged again."""
    assert decode_entry(_header(MAX_CALL_TOKENS, 3) + b"ok") == (True, "ok", MAX_CALL_TOKENS, 3)
    for planted in (_header(2**56 - 1, 3), _header(3, MAX_CALL_TOKENS + 1)):
        assert decode_entry(planted + b"ok") is None
        assert decode_columns(planted, b"ok", 1) is None
    # what ctxprec stores never exceeds the bound
    assert decode_entry(encode_entry((True, "r", 2**62, 2**62))) is not None
