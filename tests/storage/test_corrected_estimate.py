"""The corrected estimate end to end: `ctxprec score --map labels=COL` where only some rows carry
labels gives summary.json's `estimate` (the contract's keys), per `--group-by` group, in
summary.md and the CLI's last lines, and from the Python API; its mean is the PPI formula
computed here from the rows themselves."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ctxprec import score as score_api
from ctxprec.cli.main import main
from ctxprec.storage.core.metric import map_score
from tests.fakes.inputs import SAMPLE

KEYS = ["method", "reference", "mean", "ci95", "n_reference", "n_rows", "judge_mean",
        "judge_ci95"]  # fmt: skip


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """The sample tiled to 240 rows; labels kept on every third row only (80), null elsewhere."""
    sample = pl.read_parquet(SAMPLE)
    tiles = [sample.with_columns(pl.col("id") + f"-{i}") for i in range(20)]
    rows = pl.concat(tiles).with_row_index("n")
    rows = rows.with_columns(
        pl.when(pl.col("n") % 3 == 0).then(pl.col("labels")).otherwise(None).alias("labels")
    ).drop("n")
    path = tmp_path / "logs.parquet"
    rows.write_parquet(path)
    return path


def _closed_form(out: Path) -> tuple[float, int]:
    """mean_N(judge) + mean_n(label score - judge score), from the scored parts."""
    rows = pl.read_parquet(out / "*.parquet").filter(pl.col("score").is_not_null())
    judge = rows.get_column("score").to_list()
    pairs = [
        (map_score(lab), s)
        for lab, s in rows.select("label_verdicts", "score").rows()
        if lab is not None
    ]  # fmt: skip  (the labels' MAP, computed here once more)
    correction = sum(lab - s for lab, s in pairs) / len(pairs)
    return sum(judge) / len(judge) + correction, len(pairs)


def test_a_few_labels_give_a_corrected_estimate_with_its_interval(
    logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["score", str(logs), "-o", str(out), "--map", "labels=labels", "--group-by",
            "retriever", "--passthrough", "retriever"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    est = summary["estimate"]
    assert list(est)[:8] == KEYS
    assert est["method"] == "ppi"
    assert est["reference"] == "labels"
    mean, n = _closed_form(out)
    assert est["n_reference"] == n == 80
    assert est["n_rows"] == 240
    assert est["mean"] == pytest.approx(mean, abs=1e-9)  # plain PPI: fewer than 100 labels
    lo, hi = est["ci95"]
    assert lo < est["mean"] < hi
    assert est["judge_ci95"][0] < est["judge_mean"] < est["judge_ci95"][1]
    groups = est["by_group"]["groups"]
    assert set(groups) == {"bm25", "dense"}
    assert sum(g["n_reference"] for g in groups.values()) == 80
    # in words, on the terminal and in summary.md
    assert "  estimate: judge says " in printed
    assert "corrected for the judge's bias against 80 labelled rows" in printed
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "**Corrected estimate** (prediction-powered, reference: human labels)" in md
    assert "## Corrected estimate by group" in md


def test_no_labels_no_estimate_and_the_python_api_carries_it(logs: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    assert main(["score", str(logs), "-o", str(plain), "--progress", "off"]) == 0
    assert json.loads((plain / "summary.json").read_text())["estimate"] is None
    from ctxprec import load_config

    cfg = load_config(None, {"columns.labels": "labels"})
    result = score_api(str(logs), tmp_path / "api", cfg)  # the batch API (run_score awaited)
    assert result.summary["estimate"]["n_reference"] == 80
