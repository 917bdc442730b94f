"""Small untruths a night's readers met, each held to the truth: summary.html's advice for rows
that failed on their input, a coverage that hides failed rows, a no-op re-run's headline, and
the estimate's cost per 1k rows and output tokens."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.core.figures import percent_text, share_figure
from ctxprec.storage.outdir.schema import output_schema
from ctxprec.storage.report.summary import build_summary, write_summary
from tests.fakes.folders import commit
from tests.fakes.judge_server import FakeJudgeServer
from tests.fakes.runs import score


def test_summary_html_does_not_offer_a_retry_for_invalid_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows that failed on their input: summary.html says a re-run cannot fix them, as the CLI
    and summary.md do."""
    src = tmp_path / "log.parquet"
    pl.DataFrame(
        {
            "id": ["a", "b", "c"],
            "query": ["q?", None, None],
            "contexts": [["x"], ["y"], ["z"]],
        },
        schema_overrides={"query": pl.String},
    ).write_parquet(src)
    out = tmp_path / "out"
    assert score(src, "-o", out) == 1
    printed = capsys.readouterr().out
    html = (out / "summary.html").read_text()
    md = (out / "summary.md").read_text()
    for said in (printed, html, md):
        assert "2 rows failed on their input" in said
        assert "a re-run cannot fix them" in said
        assert "re-run the same command to retry" not in said


def _rows(n: int, failed: int) -> pa.Table:
    schema = output_schema()
    now = datetime(2026, 12, 1, tzinfo=UTC)
    rows = [
        {
            "id": f"r{i}",
            "score": None if i < failed else 1.0,
            "status": "failed" if i < failed else "ok",
            "error": "http_500: down" if i < failed else None,
            "verdicts": [True],
            "context_count": 1,
            "judge_model": "openai/x",
            "prompt_version": "cp-item-v3",
            **dict.fromkeys(
                (
                    "paid_input_tokens",
                    "paid_output_tokens",
                    "verdict_input_tokens",
                    "verdict_output_tokens",
                ),
                0,
            ),
            "scored_at": now,
        }
        for i in range(n)
    ]
    return pa.Table.from_pylist(rows, schema=schema)


def test_coverage_never_rounds_failed_rows_away(tmp_path: Path) -> None:
    """2 failed rows of 19,998: coverage 99.99%, not 100.0% (summary.md, summary.html, JSON)."""
    assert percent_text(19_996 / 19_998) == "99.99%"
    assert percent_text(1.0) == "100.0%"
    assert percent_text(1 - 1e-9) == ">99.9999%"
    assert percent_text(2 / 19_998) == "0.01%"
    assert share_figure(999_999 / 1_000_000) == 0.999999
    assert share_figure(0.5) == 0.5
    part = tmp_path / "part-00000.parquet"
    pq.write_table(_rows(19_998, 2), part)
    commit(tmp_path, part)
    summary = build_summary(tmp_path, {"wall_s": 1.0})
    assert summary["coverage"] < 1.0
    write_summary(tmp_path, summary, charts=False)
    assert "Coverage: 99.99%." in (tmp_path / "summary.md").read_text()
    html = (tmp_path / "summary.html").read_text()
    assert "99.99%" in html
    assert "100.0%" not in html.split('data-figure="coverage"')[1][:40]


def test_a_no_op_rerun_does_not_pass_for_the_night_in_the_report(
    tmp_path: Path, fake: FakeJudgeServer
) -> None:
    """After a re-run that found nothing new to score, summary.html's headline shows what the
    output's runs did (judge calls, wall time), and says what the last run did beneath."""
    src = tmp_path / "log.parquet"
    pl.DataFrame(
        {
            "id": [f"r{i}" for i in range(6)],
            "query": [f"q {i}?" for i in range(6)],
            "contexts": [[f"item {i}", f"other {i}"] for i in range(6)],
        }
    ).write_parquet(src)
    out = tmp_path / "out"
    for _ in range(2):
        assert score(src, "-o", out, "--incremental", "--model", "openai/j") == 0
    html = (out / "summary.html").read_text()
    calls = html.split('data-figure="calls">', 1)[1].split("<", 1)[0]
    assert calls == "12"  # every run's calls, not the no-op's 0
    assert "judge calls, all runs" in html
    assert "the last run found nothing new to score" in html
    assert "wall time, all runs" in html


def test_the_estimate_says_both_costs_per_1k_rows_and_how_it_counted_output(
    tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """`estimate` prices 1k rows that need the judge and 1k input rows; its output tokens are
    calibrated on a real-length reason (the fake writes one, ~26 tokens) and it says how."""
    src = tmp_path / "log.parquet"
    pl.DataFrame(
        {
            "id": [f"r{i}" for i in range(50)],
            "query": [f"Who wrote book {i}?" for i in range(50)],
            "expected_output": [f"Author {i}." for i in range(50)],
            # 10 rows of empty context: no judge needed for them
            "contexts": [
                [] if i < 10 else [f"Book {i} page {k}." for k in range(4)] for i in range(50)
            ],
        }
    ).write_parquet(src)
    model = ("--model", "openai/gpt-4o-mini")
    assert main(["estimate", str(src), *model, "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["rows_to_judge"] == 40
    # (cost_usd is shown to 4 decimals: the per-1k figures come from the exact cost)
    per_judged, per_input = est["cost_per_1k_rows_usd"], est["cost_per_1k_input_rows_usd"]
    assert per_judged == pytest.approx(est["cost_usd"] / 40 * 1000, rel=0.02)
    assert per_input == pytest.approx(est["cost_usd"] / 50 * 1000, rel=0.02)
    assert per_input == pytest.approx(per_judged * 40 / 50, abs=1e-4)
    assert "typical one-sentence reason" in est["output_tokens_basis"]
    assert main(["estimate", str(src), *model]) == 0
    text = capsys.readouterr().out
    assert "per 1k rows that need the judge" in text
    assert "per 1k input rows" in text
    assert "output tokens: the reply schema's JSON with a typical one-sentence reason" in text
    assert score(src, "-o", tmp_path / "out", *model) == 0
    spent = fake.stats.output_tokens
    assert abs(est["output_tokens"] - spent) <= 0.15 * spent  # not half of it
    # once the memo holds this judge's replies, the estimate measures them instead
    capsys.readouterr()
    assert main(["estimate", str(src), *model, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["output_tokens_from"] == "memo"
    assert "measured" in again["output_tokens_basis"]
