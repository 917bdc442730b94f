"""Issue-level checks of the insight features through the CLI: estimate vs actual against a
loopback judge, rank metrics vs an independent computation, label agreement, `summary`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from tests.fakes.inputs import HOTPOT_MAP
from tests.fakes.judge_server import FakeJudgeServer


@pytest.fixture
def src(hotpot: Path, tmp_path: Path) -> Path:
    path = tmp_path / "in.parquet"
    df = pl.read_parquet(hotpot).head(60)
    df.with_columns(pl.Series("retriever", ["bm25", "dense", "hybrid"] * 20)).write_parquet(path)
    return path


def test_estimate_vs_actual_calls_exact_tokens_close(
    src: Path, tmp_path: Path, fake: FakeJudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert (
        main(["estimate", str(src), "--model", "openai/j", *HOTPOT_MAP, "--json", "-o", str(out)])
        == 0
    )
    est = json.loads(capsys.readouterr().out)
    assert fake.stats.total == 0  # an estimate calls nothing
    assert (
        main(
            [
                "score",
                str(src),
                "-o",
                str(out),
                "--model",
                "openai/j",
                *HOTPOT_MAP,
                "--progress",
                "off",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert est["calls"] == fake.stats.total == summary["judge"]["calls"]
    t = summary["tokens"]
    actual_tokens = t["paid_input_this_run"] + t["paid_output_this_run"]
    assert abs(est["input_tokens"] + est["output_tokens"] - actual_tokens) <= 0.2 * actual_tokens
    assert summary["estimate_vs_actual"]["calls"]["ratio"] == 1.0
    # a second estimate knows the memo: nothing left to pay for
    capsys.readouterr()
    assert main(["estimate", str(src), "--model", "openai/j", *HOTPOT_MAP, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["calls"] == 0
    assert again["memo_hits"] == est["calls"]


def _independent_metrics(verdicts: list[bool], k: int) -> tuple[float, float, float, bool]:
    """Precision@k, RR, NDCG@k, hit@k written from the textbook definitions."""
    top = verdicts[:k]
    rr = next((1.0 / (i + 1) for i, v in enumerate(verdicts) if v), 0.0)
    dcg = sum(1.0 / math.log(i + 2, 2) for i, v in enumerate(top) if v)
    ideal = sorted(verdicts, reverse=True)[:k]
    idcg = sum(1.0 / math.log(i + 2, 2) for i, v in enumerate(ideal) if v)
    return sum(top) / k, rr, (dcg / idcg if idcg else 0.0), any(top)


def test_rank_metrics_match_an_independent_computation(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        main(["score", str(src), "-o", str(out), *HOTPOT_MAP, "--ks", "1,2,4", "--progress", "off"])
        == 0
    )
    df = pl.read_parquet(out / "*.parquet")
    for row in df.iter_rows(named=True):
        for k in (1, 2, 4):
            p, rr, ndcg, hit = _independent_metrics(row["verdicts"], k)
            assert row[f"precision_at_{k}"] == pytest.approx(p)
            assert row[f"ndcg_at_{k}"] == pytest.approx(ndcg)
            assert row[f"hit_at_{k}"] == hit
            assert row["reciprocal_rank"] == pytest.approx(rr)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rank_metrics"]["ndcg_at_4"] == pytest.approx(
        df.get_column("ndcg_at_4").mean(), abs=1e-4
    )


def test_label_agreement_by_hand_and_summary_rebuild(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        main(
            [
                "score",
                str(src),
                "-o",
                str(out),
                *HOTPOT_MAP,
                "--map",
                "labels=labels",
                "--passthrough",
                "retriever",
                "--group-by",
                "retriever",
                "--charts",
                "--progress",
                "off",
            ]
        )
        == 0
    )
    df = pl.read_parquet(out / "*.parquet")
    pairs = [
        (j, h)
        for js, hs in zip(df["verdicts"], df["label_verdicts"], strict=True)
        for j, h in zip(js, hs, strict=True)
    ]
    tp = sum(j and h for j, h in pairs)
    tn = sum(not j and not h for j, h in pairs)
    fp = sum(j and not h for j, h in pairs)
    fn = sum(h and not j for j, h in pairs)
    n = len(pairs)
    po = (tp + tn) / n
    pe = ((tp + fp) * (tp + fn) + (fn + tn) * (fp + tn)) / n**2
    labels = json.loads((out / "summary.json").read_text())["labels"]
    assert labels["items"] == n
    assert labels["accuracy"] == pytest.approx(po, abs=1e-4)
    assert labels["cohen_kappa"] == pytest.approx((po - pe) / (1 - pe), abs=1e-4)
    assert labels["label_map_mean"] == pytest.approx(df["label_score"].mean(), abs=1e-4)
    md = (out / "summary.md").read_text()
    assert "charts/scores_by_group.png" in md
    assert (out / "charts" / "scores_by_group.png").exists()
    (out / "summary.json").unlink()
    assert main(["summary", str(out), "--group-by", "retriever"]) == 0
    rebuilt = json.loads((out / "summary.json").read_text())
    assert rebuilt["labels"]["cohen_kappa"] == labels["cohen_kappa"]
    assert {g["group"] for g in rebuilt["by_group"]["groups"]} == {"bm25", "dense", "hybrid"}
