"""`ctxprec score` end to end against the loopback fake OpenAI/Anthropic server on real labelled
data: scores equal the MAP of the server's verdicts, re-runs cost nothing, limits hold.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.core.metric import map_score
from tests.fakes.inputs import HOTPOT_MAP, KEY
from tests.fakes.judge_server import (
    FakeJudgeConfig,
    FakeJudgeServer,
    FakeJudgeThread,
    expected_verdict,
)
from tests.fakes.runs import score


@pytest.fixture
def subset(hotpot: Path, tmp_path: Path) -> Path:
    """The first 120 HotpotQA rows (about 1,200 items) as their own file."""
    path = tmp_path / "hotpot120.parquet"
    pl.read_parquet(hotpot).head(120).write_parquet(path)
    return path


def read(out: Path) -> pl.DataFrame:
    return pl.read_parquet(out / "**/*.parquet").sort("id")


def assert_scores_are_map_of_server_verdicts(
    out: Path, source: Path, config: FakeJudgeConfig
) -> None:
    src = pl.read_parquet(source).select("id", "contexts")
    got = read(out).join(src, on="id")
    assert got.height == src.height
    for row in got.iter_rows(named=True):
        verdicts = [expected_verdict(item, config) for item in row["contexts"]]
        assert row["status"] == "ok", row["error"]
        assert row["verdicts"] == verdicts
        assert row["score"] == map_score(verdicts)


@pytest.mark.slow
def test_full_dataset_scores_equal_map_of_server_verdicts(
    hotpot: Path, tmp_path: Path, fake: FakeJudgeServer
) -> None:
    out = tmp_path / "out"
    assert (
        score(hotpot, "-o", out, "--model", "openai/judge-1", *HOTPOT_MAP, "--concurrency", 48) == 0
    )
    assert_scores_are_map_of_server_verdicts(out, hotpot, fake.config)
    triples = (
        pl.read_parquet(hotpot).explode("contexts").select("question", "ground_truth", "contexts")
    )
    assert fake.stats.total == triples.n_unique()  # an identical (query, expected, item): one call
    summary = json.loads((out / "summary.json").read_text())
    df = read(out)
    assert summary["rows"]["total"] == df.height == 500
    assert summary["score"]["mean"] == pytest.approx(df.get_column("score").mean(), abs=1e-4)
    assert summary["judge"]["calls"] == fake.stats.total
    assert df.get_column("paid_input_tokens").sum() > 0


def test_without_expected_column_judges_against_the_query(
    subset: Path, tmp_path: Path, fake: FakeJudgeServer
) -> None:
    src = tmp_path / "noexp.parquet"
    pl.read_parquet(subset).drop("ground_truth").write_parquet(src)
    out = tmp_path / "out"
    assert score(src, "-o", out, "--model", "openai/judge-1", "--map", "query=question") == 0
    assert_scores_are_map_of_server_verdicts(out, src, fake.config)
    assert fake.stats.query_only == fake.stats.total > 0
    assert set(read(out).get_column("prompt_version")) == {"cp-item-query-v3"}


def test_score_draws_charts_only_when_asked(
    subset: Path, tmp_path: Path, fake: FakeJudgeServer
) -> None:
    """matplotlib costs about 0.7 s of CPU a run: `score` skips it unless --charts; its summary
    then pictures the score distribution in text, and `ctxprec summary` draws the charts."""
    plain, drawn = tmp_path / "plain", tmp_path / "drawn"
    args = ["--model", "openai/judge-1", *HOTPOT_MAP]
    assert score(subset, "-o", plain, *args) == 0
    assert not (plain / "charts").exists()
    assert "## Score distribution (rows)" in (plain / "summary.md").read_text()
    assert score(subset, "-o", drawn, *args, "--charts") == 0
    assert (drawn / "charts" / "score_distribution.png").stat().st_size > 1024
    picture = "![score distribution](charts/score_distribution.png)"
    assert picture in (drawn / "summary.md").read_text()
    assert main(["summary", str(plain)]) == 0
    assert (plain / "charts" / "score_distribution.png").stat().st_size > 1024
    md = (plain / "summary.md").read_text()
    assert picture in md
    assert "## Score distribution (rows)" not in md


def test_second_run_makes_zero_calls(subset: Path, tmp_path: Path, fake: FakeJudgeServer) -> None:
    assert score(subset, "-o", tmp_path / "a", "--model", "openai/judge-1", *HOTPOT_MAP) == 0
    first = fake.stats.total
    assert first > 0
    assert score(subset, "-o", tmp_path / "b", "--model", "openai/judge-1", *HOTPOT_MAP) == 0
    assert fake.stats.total == first
    run = json.loads((tmp_path / "b" / "_ctxprec" / "run.json").read_text())
    assert run["judge_calls"] == 0
    assert run["memo_hits"] == run["items_this_run"] > 0
    cols = ["id", "score", "status", "verdicts", "verdict_reasons", "verdict_input_tokens"]
    assert read(tmp_path / "a").select(cols).equals(read(tmp_path / "b").select(cols))
    assert read(tmp_path / "b").get_column("paid_input_tokens").sum() == 0  # all from the memo


def test_anthropic_provider_end_to_end(subset: Path, tmp_path: Path, fake: FakeJudgeServer) -> None:
    out = tmp_path / "out"
    assert score(subset, "-o", out, "--model", "anthropic/claude-test", *HOTPOT_MAP) == 0
    assert_scores_are_map_of_server_verdicts(out, subset, fake.config)
    assert set(read(out).get_column("judge_model")) == {"anthropic/claude-test"}


@pytest.mark.slow
def test_calls_in_flight_never_above_the_setting(subset: Path, tmp_path: Path) -> None:
    config = FakeJudgeConfig(latency_ms=20, jitter_ms=10)
    with FakeJudgeThread(config) as server, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_BASE_URL", server.url)
        mp.setenv("OPENAI_API_KEY", KEY)
        assert (
            score(
                subset, "-o", tmp_path / "o", "--model", "openai/j", *HOTPOT_MAP, "--concurrency", 7
            )
            == 0
        )
        assert 1 < server.stats.max_in_flight <= 7


@pytest.mark.slow
def test_requests_per_minute_within_budget(subset: Path, tmp_path: Path) -> None:
    src = tmp_path / "small.parquet"
    pl.read_parquet(subset).head(12).write_parquet(src)  # ~120 calls
    with FakeJudgeThread(FakeJudgeConfig()) as server, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_BASE_URL", server.url)
        mp.setenv("OPENAI_API_KEY", KEY)
        assert (
            score(
                src,
                "-o",
                tmp_path / "o",
                "--model",
                "openai/j",
                *HOTPOT_MAP,
                "--rpm",
                1800,
                "--concurrency",
                32,
            )
            == 0
        )
        stamps = sorted(server.stats.timestamps)
        assert len(stamps) > 100
        # 1800/min is one request per 33.3 ms: no sliding second may hold more than 30 (+1 edge)
        for i, t in enumerate(stamps):
            in_window = sum(1 for u in stamps[i:] if u - t < 1.0)
            assert in_window <= 31


def test_failed_items_make_failed_rows_and_rerun_fills_only_them(
    subset: Path, tmp_path: Path
) -> None:
    src = tmp_path / "few.parquet"
    pl.read_parquet(subset).head(20).write_parquet(src)
    config = FakeJudgeConfig(p_500=0.6, seed=3)
    with FakeJudgeThread(config) as server, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_BASE_URL", server.url)
        mp.setenv("OPENAI_API_KEY", KEY)
        out = tmp_path / "o"
        args = [src, "-o", out, "--model", "openai/j", *HOTPOT_MAP, "--max-retries", 1]
        assert score(*args) == 1
        df = read(out)
        failed = df.filter(pl.col("status") == "failed")
        assert failed.height > 0
        assert failed.get_column("score").null_count() == failed.height
        assert all(e.startswith("http_500") for e in failed.get_column("error"))
        ok_items = sum(1 for v in df.get_column("verdicts").explode() if v is not None)
        server.config.p_500 = 0.0
        before = server.stats.total
        assert score(*args) == 0
        distinct = (
            pl.read_parquet(src)
            .explode("contexts")
            .select("question", "ground_truth", "contexts")
            .n_unique()
        )
        # the second run asked only for verdicts that were missing
        assert server.stats.total - before == distinct - ok_items
        assert_scores_are_map_of_server_verdicts(out, src, server.config)
