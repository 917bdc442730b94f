"""`--verdict-only` ([judge] verdict_only): the judge is asked for verdicts without per-item
reasons, in item and row mode, online and through both batch APIs, and with the offline judge.
Its replies are memoized under their own prompt versions, the row reason is still built from
the verdicts, and replies cost fewer output tokens than reasoned ones, as the fakes count them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ctxprec import create_context_precision_scorer
from ctxprec.cli.main import main
from ctxprec.config import load_config
from ctxprec.connectors.judges.prompts import TYPICAL_REASON, prompt_version_for
from ctxprec.flow.reason import VERDICT_ONLY_NOTE
from ctxprec.storage.core.metric import map_score
from tests.fakes.batch_server import BatchFakeConfig, BatchFakeThread
from tests.fakes.inputs import HOTPOT_MAP, KEY
from tests.fakes.judge_server import FakeJudgeServer, expected_verdict
from tests.fakes.strict import StrictConfig, StrictThread


@pytest.fixture
def rows(hotpot: Path, tmp_path: Path) -> Path:
    """12 HotpotQA rows (about 120 context items of ~560 characters)."""
    path = tmp_path / "rows.parquet"
    pl.read_parquet(hotpot).head(12).write_parquet(path)
    return path


def score(src: Path, out: Path, model: str, *flags: object) -> int:
    args = ["score", src, "-o", out, "--model", model, *HOTPOT_MAP, "--progress", "off", *flags]
    return main([*map(str, args)])


def scored(out: Path, src: Path) -> pl.DataFrame:
    source = pl.read_parquet(src).select("id", "contexts")
    return pl.read_parquet(out / "**/*.parquet").join(source, on="id").sort("id")


def check_verdict_only(out: Path, src: Path, per_row: bool = False) -> pl.DataFrame:
    """Every row: the MAP of the fake's verdicts, no per-item reason, the verdict-only prompt
    version, a reason built from the verdicts that says there are no per-item reasons."""
    got = scored(out, src)
    assert got.height == pl.read_parquet(src).height
    for row in got.iter_rows(named=True):
        verdicts = [expected_verdict(item) for item in row["contexts"]]
        assert row["status"] == "ok", row["error"]
        assert row["verdicts"] == verdicts
        assert row["score"] == map_score(verdicts)
        assert row["verdict_reasons"] == [""] * len(verdicts)
        assert row["prompt_version"] == prompt_version_for("x", per_row, True)
        assert VERDICT_ONLY_NOTE in row["reason"]
        assert f"Score {row['score']:g}" in row["reason"]
    return got


def run_json(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "_ctxprec" / "run.json").read_text())
    return data


def test_item_mode_online_its_own_memo_entries_and_fewer_output_tokens(
    rows: Path, tmp_path: Path, fake: FakeJudgeServer
) -> None:
    assert score(rows, tmp_path / "reasoned", "openai/j") == 0
    reasoned_calls, reasoned_out = fake.stats.total, fake.stats.output_tokens
    # the same memo folder: no reasoned verdict stands in for a verdict-only one
    assert score(rows, tmp_path / "bare", "openai/j", "--verdict-only") == 0
    assert fake.stats.total == 2 * reasoned_calls
    bare_out = fake.stats.output_tokens - reasoned_out
    assert bare_out < 0.6 * reasoned_out
    check_verdict_only(tmp_path / "bare", rows)
    body = fake.stats.bodies[-1]
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["relevant"]
    assert "reason" not in schema["properties"]
    assert '"reason"' not in body["messages"][0]["content"]  # the system prompt asks for none
    # a re-run of either mode is all memo hits
    assert score(rows, tmp_path / "bare2", "openai/j", "--verdict-only") == 0
    assert score(rows, tmp_path / "reasoned2", "openai/j") == 0
    assert fake.stats.total == 2 * reasoned_calls
    reasoned = scored(tmp_path / "reasoned2", rows)
    assert all(all(r) for r in reasoned.get_column("verdict_reasons").to_list())
    assert run_json(tmp_path / "bare")["prompt_version"].startswith("cp-item-vo-v1")


@pytest.mark.parametrize(
    ("model", "flavor"),
    [("openai/gpt-4o-mini", "openai"), ("anthropic/claude-haiku-4-5", "openai")],
)
def test_row_mode_against_the_strict_providers(
    rows: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, flavor: str
) -> None:
    with StrictThread(StrictConfig(flavor=flavor, require_key=KEY)) as server:
        anthropic = model.startswith("anthropic/")
        env = "ANTHROPIC" if anthropic else "OPENAI"
        monkeypatch.setenv(f"{env}_BASE_URL", server.root if anthropic else server.url)
        monkeypatch.setenv(f"{env}_API_KEY", KEY)
        out = tmp_path / "out"
        assert score(rows, out, model, "--mode", "row", "--verdict-only") == 0
        assert server.stats.total == pl.read_parquet(rows).height  # one call a row
        assert server.stats.by_status.keys() == {200}
        body = server.stats.bodies[-1]
        if not anthropic:
            item = body["response_format"]["json_schema"]["schema"]["properties"]["verdicts"]
            assert item["items"]["required"] == ["index", "relevant"]
    check_verdict_only(out, rows, per_row=True)
    assert run_json(out)["judge"]["row_fallbacks"] == 0


@pytest.fixture
def batch_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[BatchFakeThread]:
    monkeypatch.setenv("CTXPREC_BATCH_POLL_S", "0.02")
    monkeypatch.setenv("CTXPREC_BATCH_POLL_MAX_S", "0.05")
    with BatchFakeThread(BatchFakeConfig()) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.root)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-batch-0123456789")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-batch-0123456789")
        yield server  # type: ignore[misc]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("mode", ["item", "row"])
def test_batch_apis_in_both_modes(
    rows: Path, tmp_path: Path, batch_fake: Any, provider: str, mode: str
) -> None:
    server = batch_fake
    out = tmp_path / "out"
    flags = ("--batch-api", "--mode", mode, "--verdict-only")
    assert score(rows, out, f"{provider}/judge-1", *flags) == 0
    assert server.online_calls == 0
    check_verdict_only(out, rows, per_row=mode == "row")
    tokens = run_json(out)["judge"]["output_tokens"]
    # the reasoned run of the same rows through the same batch API writes more
    assert score(rows, tmp_path / "reasoned", f"{provider}/judge-1", *flags[:-1]) == 0
    assert run_json(tmp_path / "reasoned")["judge"]["output_tokens"] > 1.5 * tokens


def test_offline_judge_same_verdicts_no_reasons(rows: Path, tmp_path: Path) -> None:
    assert score(rows, tmp_path / "reasoned", "offline") == 0
    assert score(rows, tmp_path / "bare", "offline", "--verdict-only") == 0
    reasoned, bare = scored(tmp_path / "reasoned", rows), scored(tmp_path / "bare", rows)
    assert bare.get_column("verdicts").to_list() == reasoned.get_column("verdicts").to_list()
    assert bare.get_column("score").to_list() == reasoned.get_column("score").to_list()
    assert all(r == [""] * len(r) for r in bare.get_column("verdict_reasons").to_list())
    assert all(VERDICT_ONLY_NOTE in r for r in bare.get_column("reason").to_list())
    assert set(bare.get_column("prompt_version")) == {"cp-item-vo-v1"}
    # the row mode of the offline judge too
    assert score(rows, tmp_path / "row", "offline", "--verdict-only", "--mode", "row") == 0
    row = scored(tmp_path / "row", rows)
    assert row.get_column("verdicts").to_list() == reasoned.get_column("verdicts").to_list()
    assert set(row.get_column("prompt_version")) == {"cp-row-vo-v1"}


def test_setting_from_file_environment_and_flag(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[judge]\nverdict_only = true\n")
    assert load_config(config, env={}).judge.verdict_only is True
    assert load_config(None, env={"CTXPREC_VERDICT_ONLY": "1"}).judge.verdict_only is True
    assert load_config(None, env={}).judge.verdict_only is False
    off = load_config(config, env={"CTXPREC_VERDICT_ONLY": "false"})
    assert off.judge.verdict_only is False  # environment over file
    on = load_config(None, {"judge.verdict_only": True}, env={"CTXPREC_VERDICT_ONLY": "0"})
    assert on.judge.verdict_only is True  # flag over environment


def test_estimate_knows_the_verdict_only_token_counts(
    rows: Path, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    def estimate(*flags: str) -> dict[str, Any]:
        args = ["estimate", str(rows), "--model", "openai/gpt-4o-mini", *HOTPOT_MAP, "--json"]
        assert main([*args, *flags]) == 0
        data: dict[str, Any] = json.loads(capsys.readouterr().out)
        return data

    for mode in ("item", "row"):
        reasoned = estimate("--mode", mode)
        bare = estimate("--mode", mode, "--verdict-only")
        assert bare["calls"] == reasoned["calls"]
        assert bare["input_tokens"] < reasoned["input_tokens"]  # the prompt asks for less
        assert bare["output_tokens"] < 0.5 * reasoned["output_tokens"]  # the reason is most of it
        assert bare["cost_per_1k_rows_usd"] < reasoned["cost_per_1k_rows_usd"]
        assert bare["output_tokens_from"] == "reply schema"
    # row mode: the output estimate counts every item's verdict, not one verdict a call
    row = estimate("--mode", "row")
    assert row["output_tokens"] > row["context_items"] * len(TYPICAL_REASON) // 4
    # the estimate against what the fake judge counts of a real verdict-only run: close
    out = tmp_path / "out"
    est = estimate("--verdict-only")
    assert score(rows, out, "openai/gpt-4o-mini", "--verdict-only") == 0
    assert est["calls"] == fake.stats.total
    # (the fake counts the JSON of the messages: their keys and escapes too)
    assert abs(est["input_tokens"] - fake.stats.input_tokens) <= 0.1 * fake.stats.input_tokens
    assert abs(est["output_tokens"] - fake.stats.output_tokens) <= 0.2 * fake.stats.output_tokens
    # and the human-readable estimate says what 1k rows cost
    args = ["estimate", str(rows), "--model", "openai/gpt-4o-mini", *HOTPOT_MAP, "--no-memo"]
    assert main([*args, "--verdict-only"]) == 0
    shown = capsys.readouterr().out
    assert "per 1k rows that need the judge (verdict-only)" in shown
    assert "per 1k input rows" in shown
    assert "output tokens: the reply schema's JSON with a verdict and no reason" in shown


async def test_python_api_option(fake: FakeJudgeServer) -> None:
    scorer = create_context_precision_scorer(
        "openai/j", options={"context": ["first passage", "second passage"], "verdict_only": True}
    )
    try:
        result = await scorer.run(input="what?", output="this")
    finally:
        await scorer.aclose()
    assert [v.relevant for v in result.verdicts] == [
        expected_verdict("first passage"),
        expected_verdict("second passage"),
    ]
    assert [v.reason for v in result.verdicts] == ["", ""]
    assert result.prompt_version == "cp-item-vo-v1"
    assert VERDICT_ONLY_NOTE in result.reason
