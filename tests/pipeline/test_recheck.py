"""`score --recheck FRACTION`: the judge against itself. A seeded sample of the run's items is
asked again past the memo; the self-agreement lands in run.json and the summary; the first
verdicts stay; the estimate counts the re-asks. Against the real fake judge on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from tests.fakes.inputs import KEY
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeThread
from tests.fakes.runs import score
from tests.pipeline.test_row_fallback import labelled_log


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "memo"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    return monkeypatch


def run_json(out: Path) -> dict:
    return json.loads((out / "_ctxprec" / "run.json").read_text())


def test_a_consistent_judge_agrees_with_itself_and_the_memo_keeps_the_first_verdicts(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    src, out = labelled_log(tmp_path / "log.parquet", rows=60), tmp_path / "out"
    with FakeJudgeThread(FakeJudgeConfig()) as server:
        env.setenv("OPENAI_BASE_URL", server.url)
        assert score(src, "-o", out, "--model", "openai/j", "--recheck", 0.25) == 0
        r = run_json(out)["recheck"]
        asked_twice = {t for t, n in server.stats.items.items() if n == 2}
        total_items = int(pl.read_parquet(src)["contexts"].list.len().sum())
        assert r["items"] == len(asked_twice) > 0  # each sampled item asked once more
        assert 0.1 * total_items < r["items"] < 0.4 * total_items
        assert server.stats.total == total_items + r["items"]
        assert r["flips"] == 0
        assert r["agreement"] == 1.0
        assert r["cohen_kappa"] == pytest.approx(1.0)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["self_agreement"] == r
        assert "Judge against itself (--recheck)" in (out / "summary.md").read_text()
        # this run's tokens include the re-asks; the rows carry only the first calls'
        assert summary["tokens"]["paid_input_this_run"] == server.stats.input_tokens
        assert summary["tokens"]["verdict_input_all_rows"] < server.stats.input_tokens


def test_flip_rate_of_a_judge_that_disagrees_with_itself(
    tmp_path: Path, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = labelled_log(tmp_path / "log.parquet", rows=120), tmp_path / "out"
    with FakeJudgeThread(FakeJudgeConfig(p_flip_call=0.1, seed=4)) as server:
        env.setenv("OPENAI_BASE_URL", server.url)  # part of the memo keys the sample draws on
        capsys.readouterr()
        estimate = ["estimate", str(src), "--model", "openai/j", "--json"]
        assert main([*estimate, "--recheck", "0.5"]) == 0
        est = json.loads(capsys.readouterr().out)
        assert main(estimate) == 0
        plain = json.loads(capsys.readouterr().out)
        assert est["recheck_calls"] > 0
        assert est["calls"] == plain["calls"]  # the scoring calls, as the summary counts them
        assert est["input_tokens"] > plain["input_tokens"]  # tokens and cost include re-asks
        assert est["output_tokens"] > plain["output_tokens"]
        assert server.stats.total == 0  # an estimate calls nothing
        args = ("--model", "openai/j", "--recheck", 0.5)
        assert score(src, "-o", out, *args) == 0
        first = pl.read_parquet(out / "*.parquet").sort("id")["verdicts"].to_list()
        r = run_json(out)["recheck"]
        assert r["items"] == est["recheck_calls"]  # the estimate's sample is the run's
        # each call flips 10 % of verdicts: two calls disagree on 2 x 0.1 x 0.9 = 18 %
        n = r["items"]
        sd = (0.18 * 0.82 / n) ** 0.5
        assert 0.18 - 4 * sd < r["flip_rate"] < 0.18 + 4 * sd
        assert r["flips"] == r["table"]["only_a_relevant"] + r["table"]["only_b_relevant"]
        assert r["cohen_kappa"] < 0.9
        before = server.stats.total
        # the rechecked verdicts were not stored: a second run reads the first ones, asks nothing
        assert score(src, "-o", tmp_path / "again", "--model", "openai/j") == 0
        assert server.stats.total == before
    again = pl.read_parquet(tmp_path / "again" / "*.parquet").sort("id")["verdicts"].to_list()
    assert again == first


def test_row_mode_asks_the_row_again(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    src, out = labelled_log(tmp_path / "log.parquet", rows=40), tmp_path / "out"
    with FakeJudgeThread(FakeJudgeConfig()) as server:
        env.setenv("OPENAI_BASE_URL", server.url)
        args = ("--model", "openai/j", "--mode", "row", "--recheck", 0.3)
        assert score(src, "-o", out, *args) == 0
        r = run_json(out)["recheck"]
        rows_again = server.stats.total - 40
        assert 0 < rows_again <= r["items"]  # one row call for all its sampled items
        assert r["flips"] == 0


def test_recheck_is_refused_where_it_cannot_run(
    tmp_path: Path, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = labelled_log(tmp_path / "log.parquet", rows=2)
    args = ("-o", tmp_path / "out", "--model", "openai/j", "--recheck", 0.1)
    assert score(src, *args, "--engine", "dask") == 2
    assert "drop --engine dask" in capsys.readouterr().err
    assert score(src, "-o", tmp_path / "o2", "--recheck", 1.5) == 2
    assert "between 0 and 1" in capsys.readouterr().err
