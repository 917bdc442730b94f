"""Judge against judge: the same labelled HotpotQA rows scored by a precise loopback judge (A)
and one that flips a known share of items (B); `ctxprec compare A B` must report the item-level
agreement computed here from the two outputs' `verdicts` columns."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.inter_rater import cohens_kappa

from ctxprec import compare_outputs
from ctxprec.cli.main import main
from tests.fakes.inputs import HOTPOT_MAP, KEY, consistent_rows
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeServer, FakeJudgeThread

ROWS = 120


@pytest.fixture
def labelled(hotpot: Path, tmp_path: Path) -> tuple[Path, dict[str, bool]]:
    """Rows whose items carry one label each across the sample (the judges' truth)."""
    df = pl.read_parquet(hotpot)
    keep, seen = consistent_rows(df["contexts"].to_list(), df["labels"].to_list(), ROWS)
    rows = df[keep].to_dicts()
    path = tmp_path / "rows.parquet"
    pl.DataFrame(rows, schema=df.schema).write_parquet(path)
    return path, seen


@pytest.fixture
def judges(
    labelled: tuple[Path, dict[str, bool]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[FakeJudgeServer, FakeJudgeServer]]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "memo"))
    truth = labelled[1]
    precise = FakeJudgeConfig(overrides=truth)
    cheap = FakeJudgeConfig(overrides=truth, flip_share=0.15, seed=7)
    with FakeJudgeThread(precise) as a, FakeJudgeThread(cheap) as b:
        yield a, b


def score(src: Path, out: Path, model: str, url: str) -> int:
    args = ["score", str(src), "-o", str(out), "--model", model, "--base-url", url, *HOTPOT_MAP]
    return main([*args, "--progress", "off", "--quiet"])


def by_hand(a_out: Path, b_out: Path) -> list[int]:
    """[both relevant, only A, only B, neither] from the outputs' verdicts, paired by id and
    position, items judged on both sides."""
    a = pl.read_parquet(a_out / "*.parquet").select("id", "verdicts")
    b = pl.read_parquet(b_out / "*.parquet").select("id", "verdicts")
    table = [0, 0, 0, 0]
    for _, va, vb in a.join(b, on="id", suffix="_b").iter_rows():
        for x, y in zip(va or [], vb or [], strict=False):
            if x is not None and y is not None:
                table[(0 if y else 1) if x else (2 if y else 3)] += 1
    return table


@pytest.mark.slow
def test_compare_reports_the_agreement_of_the_two_judges(
    labelled: tuple[Path, dict[str, bool]],
    judges: tuple[FakeJudgeServer, FakeJudgeServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = labelled[0]
    a_out, b_out = tmp_path / "A", tmp_path / "B"
    assert score(src, a_out, "openai/precise", judges[0].url) == 0
    assert score(src, b_out, "openai/cheap", judges[1].url) == 0
    capsys.readouterr()
    assert main(["compare", str(a_out), str(b_out), "--json", "-o", str(tmp_path / "r")]) == 0
    report = json.loads(capsys.readouterr().out)
    g = report["judge_agreement"]

    table = by_hand(a_out, b_out)
    n = sum(table)
    positions = pl.read_parquet(src)["contexts"].list.len().sum()
    assert g["items"] == n == positions  # every item of every row, judged on both sides
    assert [g["table"][k] for k in ("both_relevant", "only_a_relevant", "only_b_relevant",
                                    "neither_relevant")] == table  # fmt: skip
    ref = cohens_kappa([[table[0], table[1]], [table[2], table[3]]])
    assert g["cohen_kappa"] == pytest.approx(ref.kappa, abs=1e-12)
    assert g["kappa_se_asymptotic"] == pytest.approx(ref.std_kappa, rel=1e-9)
    assert g["kappa_ci95_asymptotic"] == pytest.approx([ref.kappa_low, ref.kappa_upp], rel=1e-9)
    lo, hi = g["kappa_ci95"]
    assert lo <= g["cohen_kappa"] <= hi
    assert g["agreement"] == pytest.approx((table[0] + table[3]) / n)
    assert 0.10 < g["flip_rate"] < 0.20  # the cheap judge flips about 15 % of items
    exact = (table[1] + table[2]) < 25
    sm = sm_mcnemar([[table[0], table[1]], [table[2], table[3]]], exact=exact, correction=True)
    assert g["mcnemar"]["p_value"] == pytest.approx(sm.pvalue, rel=1e-9)
    assert g["judges_differ"] is True
    assert g["score_delta"]["mean_delta"] == report["mean_delta"]
    assert g["cost"]["a"]["judge_model"] == "openai/precise"
    assert g["cost"]["b"]["paid_input_tokens"] == judges[1].stats.input_tokens
    assert g["cost"]["b"]["verdict_input_tokens"] == judges[1].stats.input_tokens  # first run
    md = (tmp_path / "r" / "compare.md").read_text()
    assert md.index("## Judge against judge") < md.index("## Paired deltas")
    assert "None" not in md
    capsys.readouterr()
    assert main(["compare", str(a_out), str(b_out)]) == 0
    assert "judge agreement:" in capsys.readouterr().out


@pytest.mark.slow
def test_the_same_model_behind_two_urls_counts_as_two_judges(
    labelled: tuple[Path, dict[str, bool]],
    judges: tuple[FakeJudgeServer, FakeJudgeServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = labelled[0]
    assert score(src, tmp_path / "A", "openai/j", judges[0].url) == 0
    assert score(src, tmp_path / "B", "openai/j", judges[1].url) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "A"), str(tmp_path / "B"), "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["judge_agreement"]
    table = by_hand(tmp_path / "A", tmp_path / "B")
    ref = cohens_kappa([[table[0], table[1]], [table[2], table[3]]])
    assert g["judges_differ"] is True
    assert g["items"] == sum(table)
    assert g["cohen_kappa"] == pytest.approx(ref.kappa, abs=1e-12)


@pytest.mark.slow
def test_the_python_api_gives_the_same_report(
    labelled: tuple[Path, dict[str, bool]],
    judges: tuple[FakeJudgeServer, FakeJudgeServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = labelled[0]
    assert score(src, tmp_path / "A", "openai/precise", judges[0].url) == 0
    assert score(src, tmp_path / "B", "openai/cheap", judges[1].url) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "A"), str(tmp_path / "B"), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    api = compare_outputs(str(tmp_path / "A"), str(tmp_path / "B"))
    assert json.loads(json.dumps(api, default=str)) == cli
