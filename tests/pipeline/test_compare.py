"""Issue-level checks of `ctxprec compare` on real data: two retrievers' rankings of the same
HotpotQA queries judged by a loopback judge that answers from the human labels, so the deltas
must equal the label MAP figures computed here by hand; plus the drop gate's exit codes."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from tests.fakes.inputs import HOTPOT_MAP, consistent_rows
from tests.fakes.judge_server import FakeJudgeConfig, FakeJudgeThread

ROWS = 80


def average_precision(labels: Sequence[bool]) -> float:
    """Plain-Python AP of one ranked list (0.0 when nothing is relevant)."""
    hits, total = 0, 0.0
    for i, relevant in enumerate(labels):
        if relevant:
            hits += 1
            total += hits / (i + 1)
    return total / hits if hits else 0.0


def round2(x: float) -> float:
    """round half up to 2 decimals, as the score column is written."""
    return int(x * 100 + 0.5 + 1e-9) / 100


def worse(pairs: list[tuple[str, bool]], seed: int) -> list[tuple[str, bool]]:
    """A weaker retriever: shuffled, then each relevant item has even odds of sinking to the end."""
    out = list(pairs)
    random.Random(seed).shuffle(out)
    rng = random.Random(seed + 1)
    sink = [rng.random() < 0.5 for _ in out]
    return [p for p, s in zip(out, sink, strict=True) if not (p[1] and s)] + [
        p for p, s in zip(out, sink, strict=True) if p[1] and s
    ]


@pytest.fixture
def rankings(hotpot: Path, tmp_path: Path) -> tuple[Path, Path, pl.DataFrame, dict[str, bool]]:
    """The same queries in two orders: as given (A) and a weaker ranking (B); items whose labels
    disagree between queries are left out, so one verdict per item text is the truth."""
    df = pl.read_parquet(hotpot)
    keep, seen = consistent_rows(df["contexts"].to_list(), df["labels"].to_list(), ROWS)
    rows = df[keep].to_dicts()
    base = pl.DataFrame(rows, schema=df.schema)
    pairs = [list(zip(r["contexts"], r["labels"], strict=True)) for r in rows]
    b_pairs = [worse(p, i) for i, p in enumerate(pairs)]
    b = base.with_columns(
        pl.Series("contexts", [[c for c, _ in p] for p in b_pairs]),
        pl.Series("labels", [[lab for _, lab in p] for p in b_pairs]),
    )
    paths = tmp_path / "a.parquet", tmp_path / "b.parquet"
    base.write_parquet(paths[0])
    b.write_parquet(paths[1])
    return paths[0], paths[1], pl.concat([base, b]), seen


@pytest.fixture
def label_judge(
    rankings: tuple[Path, Path, pl.DataFrame, dict[str, bool]], monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    config = FakeJudgeConfig(overrides=rankings[3])
    with FakeJudgeThread(config) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-compare")
        yield


def score(src: Path, out: Path, *extra: str) -> int:
    args = ["score", str(src), "-o", str(out), "--model", "openai/j", *HOTPOT_MAP]
    return main([*args, "--progress", "off", "--quiet", *extra])


@pytest.mark.slow
def test_compare_equals_label_map_by_hand(
    rankings: tuple[Path, Path, pl.DataFrame, dict[str, bool]],
    label_judge: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a_src, b_src, _, _ = rankings
    assert score(a_src, tmp_path / "A") == 0
    assert score(b_src, tmp_path / "B") == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "A"), str(tmp_path / "B"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)

    a_labels = pl.read_parquet(a_src)["labels"].to_list()
    b_labels = pl.read_parquet(b_src)["labels"].to_list()
    a_ap = [average_precision(x) for x in a_labels]
    b_ap = [average_precision(x) for x in b_labels]
    mean_a = sum(round2(x) for x in a_ap) / len(a_ap)
    mean_b = sum(round2(x) for x in b_ap) / len(b_ap)
    assert report["n_pairs"] == ROWS
    assert report["mean_a"] == pytest.approx(mean_a, abs=1e-12)
    assert report["mean_b"] == pytest.approx(mean_b, abs=1e-12)
    assert report["mean_delta"] == pytest.approx(mean_b - mean_a, abs=1e-12)
    # the unrounded label MAP is within the 2-decimal rounding of the scores
    assert report["mean_a"] == pytest.approx(sum(a_ap) / ROWS, abs=0.005)
    assert report["mean_delta"] < -0.05  # sinking relevant items loses precision
    lo, hi = report["ci95"]
    assert lo <= report["mean_delta"] <= hi
    assert hi < 0
    deltas = [round2(b) - round2(a) for a, b in zip(a_ap, b_ap, strict=True)]
    assert report["wins"] == sum(d > 1e-9 for d in deltas)
    assert report["losses"] == sum(d < -1e-9 for d in deltas)
    assert report["ties"] == ROWS - report["wins"] - report["losses"]
    assert report["left_out"]["total"] == 0
    assert report["judge_config"]["same"]
    first_rel = [next((i for i, x in enumerate(lab) if x), None) for lab in a_labels]
    rr_a = sum(0.0 if i is None else 1 / (i + 1) for i in first_rel) / ROWS
    assert report["metrics"]["reciprocal_rank"]["mean_a"] == pytest.approx(rr_a, abs=1e-12)
    p1_b = sum(bool(lab[0]) for lab in b_labels) / ROWS
    assert report["metrics"]["precision_at_1"]["mean_b"] == pytest.approx(p1_b, abs=1e-12)
    top = report["changed_most"][0]
    assert abs(top["delta"]) == max(abs(d) for d in deltas)
    assert top["a"]["reason"]
    assert top["b"]["verdicts"]

    # the gate: B is worse by |delta| with the whole CI below zero
    drop = -report["mean_delta"]
    a_out, b_out = str(tmp_path / "A"), str(tmp_path / "B")
    assert main(["compare", a_out, b_out, "--fail-drop", f"{drop - 0.01:.4f}"]) == 5
    assert "--fail-drop" in capsys.readouterr().err
    assert main(["compare", a_out, b_out, "--fail-drop", f"{drop + 0.01:.4f}"]) == 0
    assert main(["compare", b_out, a_out, "--fail-drop", "0"]) == 0  # B better: never a drop
    out = tmp_path / "report"
    assert main(["compare", a_out, b_out, "-o", str(out), "--top", "3"]) == 0
    saved = json.loads((out / "compare.json").read_text())
    assert saved["mean_delta"] == report["mean_delta"]
    assert len(saved["changed_most"]) == 3
    md = (out / "compare.md").read_text()
    assert "compare.png" in md
    assert "None" not in md
    assert (out / "compare.png").stat().st_size > 0


@pytest.mark.slow
def test_fail_under_gate_on_this_runs_rows(
    rankings: tuple[Path, Path, pl.DataFrame, dict[str, bool]],
    label_judge: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--fail-under: 5 exactly when the run's mean is below X; an incremental run is judged on
    the rows it added; failed rows keep exit 1 and the message names the gate."""
    a_src = rankings[0]
    a = pl.read_parquet(a_src)
    night1, night2 = tmp_path / "n1.parquet", tmp_path / "n2.parquet"
    a.head(40).write_parquet(night1)
    a.slice(40).write_parquet(night2)
    mean2 = sum(round2(average_precision(x)) for x in a.slice(40)["labels"].to_list()) / 40
    out = tmp_path / "scores"
    assert score(night1, out, "--incremental", "--fail-under", "0") == 0
    assert score(night2, out, "--incremental", "--fail-under", f"{mean2 + 0.001}") == 5
    err = capsys.readouterr().err
    assert "--fail-under" in err
    assert "40 scored rows" in err
    full = tmp_path / "full"
    assert score(night2, full, "--fail-under", f"{mean2 - 0.001}") == 0
    assert score(night2, full, "--fail-under", repr(mean2)) == 0  # equal passes

    bad = tmp_path / "bad.parquet"  # a null query is a failed row (invalid_input)
    a.slice(40).with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("question"))
        .alias("question")
    ).write_parquet(bad)  # fmt: skip
    capsys.readouterr()
    assert score(bad, tmp_path / "bad", "--fail-under", "0.99") == 1
    assert "gate failed (and rows failed, exit 1)" in capsys.readouterr().err
