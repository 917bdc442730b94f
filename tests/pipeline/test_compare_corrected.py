"""`compare` on corrected estimates: when both sides carry labels (or the same audit
judge), the difference of their prediction-powered estimates with a paired CI, which covers the
true difference as a 95 % interval should (checked by simulation), and `--fail-drop` gates on it
and says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ctxprec.analysis.corrected import difference_of_estimates
from ctxprec.cli.main import main
from tests.fakes.inputs import KEY
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeThread, expected_verdict
from tests.fakes.runs import score

TRUE_DELTA = 0.05  # E[y_b] − E[y_a] by construction (p + 0.05 never leaves [0, 1] below)


def _world(seed: int, rows: int = 2000, share: float = 0.05) -> tuple[np.ndarray, ...]:
    """Two retrievers' rows: reference scores y (Bernoulli, B's 0.05 more likely relevant), two
    judges that err differently (A keeps 80 % of verdicts and says yes 70 % of the rest, B keeps
    70 % and says yes 30 %: B's judge is harsher), the reference on the same random `share` of
    rows on both sides (labels of a random sample, or the audit sample drawn by row id)."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.2, 0.8, rows)
    ya = (rng.random(rows) < p).astype(float)
    yb = (rng.random(rows) < p + TRUE_DELTA).astype(float)

    def judge(y: np.ndarray, keep: float, yes: float) -> np.ndarray:
        kept = rng.random(rows) < keep
        return np.where(kept, y, (rng.random(rows) < yes).astype(float))

    fa, fb = judge(ya, 0.8, 0.7), judge(yb, 0.7, 0.3)
    labelled = rng.random(rows) < share
    return fa, np.where(labelled, ya, np.nan), fb, np.where(labelled, yb, np.nan)


def test_the_corrected_difference_covers_the_true_difference() -> None:
    """200 seeded worlds of 2,000 paired rows, 5 % with a reference: the corrected CI of B − A
    covers the true 0.05 in at least 93 % of them; the judges' own paired CI (their bias
    differs) almost never does."""
    covered = judge_covered = 0
    for seed in range(200):
        fa, ra, fb, rb = _world(seed)
        d = difference_of_estimates(fa, ra, fb, rb)
        assert d is not None
        lo, hi = d["ci95"]
        covered += lo <= TRUE_DELTA <= hi
        diffs = fb - fa
        half = 1.96 * diffs.std(ddof=1) / np.sqrt(len(diffs))
        judge_covered += abs(diffs.mean() - TRUE_DELTA) <= half
    assert covered / 200 >= 0.93
    assert judge_covered / 200 <= 0.10


def test_rows_that_share_a_query_widen_the_interval() -> None:
    fa, ra, fb, rb = _world(7)
    alone = difference_of_estimates(fa, ra, fb, rb)
    shared = difference_of_estimates(fa, ra, fb, rb, clusters=[i // 2 for i in range(len(fa))])
    assert alone is not None
    assert shared is not None
    assert shared["mean_delta"] == alone["mean_delta"]
    assert shared["se"] != alone["se"]


def _side(path: Path, labels: bool, rows: int = 60) -> Path:
    """The same rows and contexts (so the offline judge scores both sides alike); every third
    row labelled, all relevant on one side and none on the other."""
    contexts = [[f"Item {i}\nfact {i}", f"Other {i}\nnoise"] for i in range(rows)]
    pl.DataFrame(
        {
            "id": [f"q{i}" for i in range(rows)],
            "query": [f"What about Item {i}?" for i in range(rows)],
            "contexts": contexts,
            "labels": [[labels, labels] if i % 3 == 0 else None for i in range(rows)],
        },
        schema_overrides={"labels": pl.List(pl.Boolean)},
    ).write_parquet(path)
    return path


def test_compare_reports_and_gates_on_the_corrected_estimates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "memo"))
    a, b = tmp_path / "a", tmp_path / "b"
    assert score(_side(tmp_path / "a.parquet", True), "-o", a, "--map", "labels=labels") == 0
    assert score(_side(tmp_path / "b.parquet", False), "-o", b, "--map", "labels=labels") == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--json", "--fail-drop", "0.1"]) == 5
    report = json.loads(capsys.readouterr().out)
    assert report["mean_delta"] == 0  # the judge scores both sides alike ...
    c = report["corrected"]
    assert c["reference"] == "labels"
    assert (c["n_reference_a"], c["n_reference_b"], c["n_pairs"]) == (20, 20, 60)
    assert c["mean_delta"] < -0.5  # ... the labels do not
    assert c["ci95"][1] < 0
    assert report["gate"]["failed"]
    assert report["gate"]["figure"] == "the corrected estimate (reference: labels)"
    assert "on the corrected estimate (reference: labels)" in report["gate"]["message"]
    assert main(["compare", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "corrected (reference: human labels; 20 / 20 reference rows)" in text
    # without a reference on one side: the judge's scores, as before
    assert score(_side(tmp_path / "c.parquet", False), "-o", tmp_path / "c") == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(tmp_path / "c"), "--json", "--fail-drop", "0.1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["corrected"] is None
    assert report["gate"]["figure"] == "the judge's scores"


def _ordered_log(path: Path, relevant_first: bool, rows: int = 200) -> Path:
    """The same rows and items on every side, relevant items (the fake judge's truth) first or
    last: a good and a bad retriever of one log."""
    contexts = []
    for i in range(rows):
        items = [f"row {i} passage {k}" for k in range(2 + i % 5)]
        contexts.append(sorted(items, key=lambda t: expected_verdict(t) != relevant_first))
    pl.DataFrame(
        {
            "id": [f"r{i}" for i in range(rows)],
            "query": [f"question {i}?" for i in range(rows)],
            "expected_output": [f"answer {i}" for i in range(rows)],
            "contexts": contexts,
        }
    ).write_parquet(path)
    return path


def test_compare_of_two_audited_runs_gates_on_the_corrected_difference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two `ctxprec score --audit-model` outputs end to end through the CLI: A judged by a
    judge that is the truth, B by one wrong on 30 % of items, both audited by the same strong
    judge on the same seeded rows. The judges' scores say B dropped; the corrected estimates
    (paired over the audited rows) say it did not, and `--fail-drop` follows them. Against a
    truly worse retriever (relevant items last) the corrected difference is below zero with
    its CI, and `--fail-drop` fails on it, saying so."""
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "memo"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    good = _ordered_log(tmp_path / "good.parquet", True)
    bad = _ordered_log(tmp_path / "bad.parquet", False)
    with (
        FakeJudgeThread(FakeJudgeConfig()) as exact,
        FakeJudgeThread(FakeJudgeConfig(flip_share=0.3, seed=2)) as sloppy,
        FakeJudgeThread(FakeJudgeConfig()) as strong,
    ):
        audit = ("--audit-model", "openai/strong", "--audit-base-url", strong.url,
                 "--audit-fraction", 0.3)  # fmt: skip
        sides = {
            "a": (good, "openai/exact", exact.url),
            "b": (good, "openai/sloppy", sloppy.url),
            "c": (bad, "openai/exact", exact.url),
        }
        for name, (src, model, url) in sides.items():
            out = tmp_path / name
            assert score(src, "-o", out, "--model", model, "--base-url", url, *audit) == 0
    a, b, c = (str(tmp_path / name) for name in "abc")
    summaries = {n: json.loads((tmp_path / n / "summary.json").read_text()) for n in "abc"}
    audited = summaries["a"]["estimate"]["n_reference"]
    assert audited >= 40
    assert all(s["estimate"]["reference"] == "audit:openai/strong" for s in summaries.values())
    capsys.readouterr()

    # A vs B: the same retriever, a sloppier first judge on B
    assert main(["compare", a, b, "--json", "--fail-drop", "0.02"]) == 0
    report = json.loads(capsys.readouterr().out)
    corrected = report["corrected"]
    assert corrected["reference"] == "audit:openai/strong"
    assert corrected["n_pairs"] == report["n_pairs"] == 200  # paired by id
    assert (corrected["n_reference_a"], corrected["n_reference_b"]) == (audited, audited)
    assert report["mean_delta"] < -0.05  # the judges' scores say B dropped ...
    lo, hi = corrected["ci95"]
    assert lo < 0 < hi  # ... the corrected estimates do not
    assert abs(corrected["mean_delta"]) < abs(report["mean_delta"])
    gate = report["gate"]
    assert not gate["failed"]
    assert gate["figure"] == "the corrected estimate (reference: audit:openai/strong)"
    est_a, est_b = summaries["a"]["estimate"]["mean"], summaries["b"]["estimate"]["mean"]
    assert corrected["mean_a"] == pytest.approx(est_a, abs=1e-6)
    assert corrected["mean_b"] == pytest.approx(est_b, abs=1e-6)

    # A vs C: the same judge, a worse retriever: the corrected difference fails the gate
    assert main(["compare", a, c, "--json", "--fail-drop", "0.02"]) == 5
    report = json.loads(capsys.readouterr().out)
    corrected = report["corrected"]
    assert corrected["ci95"][1] < -0.02
    assert report["gate"]["failed"]
    message = report["gate"]["message"]
    assert "on the corrected estimate (reference: audit:openai/strong)" in message
    assert main(["compare", a, c, "--fail-drop", "0.02"]) == 5
    said = "".join(capsys.readouterr())
    assert f"corrected (reference: the audit judge openai/strong; {audited} / {audited}" in said
    assert "--fail-drop 0.02 failed on the corrected estimate" in said
