"""`ctxprec compare` with honest intervals: pairs that share a query are resampled together (by
default when the output has the query column, said in the report), `--margin` tests
non-inferiority and the `--fail-drop` gate can require it, and the report states the smallest
difference it could detect."""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar

from ctxprec.cli.main import main
from tests.fakes.inputs import REPO
from tests.fakes.runs import score


@pytest.fixture
def nights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The sample's queries asked on 4 days (unique ids, `query_id` shared), scored by the
    offline judge in two rankings: A as logged, B reversed."""
    monkeypatch.setenv("CTXPREC_CACHE_DIR", str(tmp_path / "memo"))
    sample = pl.read_parquet(REPO / "examples" / "sample.parquet")
    rng, rows = random.Random(1), []
    for day in range(4):
        for row in sample.filter(pl.col("contexts").list.len() > 0).iter_rows(named=True):
            ctx = list(row["contexts"])
            rng.shuffle(ctx)
            rows.append({**row, "id": f"{day}/{row['id']}", "query_id": row["id"], "contexts": ctx})
    a = pl.DataFrame(rows)
    outs = []
    for name, frame in (("a", a), ("b", a.with_columns(pl.col("contexts").list.reverse()))):
        frame.write_parquet(tmp_path / f"{name}.parquet")
        out = tmp_path / name.upper()
        assert score(tmp_path / f"{name}.parquet", "-o", out, "--passthrough", "query_id") == 0
        outs.append(out)
    return outs[0], outs[1]


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["compare", *map(str, args), "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if code in (0, 5) else {}


def test_pairs_sharing_a_query_are_clustered_by_default(
    nights: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run(capsys, *nights)
    assert code == 0
    c = report["clustering"]
    assert c["column"] == "query_id"
    assert c["clusters"] == report["n_pairs"] // 4  # each query asked on 4 days
    assert c["how"].startswith("default:")
    assert "flipping whole clusters" in report["test"]
    assert report["mde_80"] > 0
    assert report["cohens_dz"] is not None
    # pass/fail per row (hit@k): McNemar's test, as MLflow's compare_evaluations gives it
    a = pl.read_parquet(nights[0] / "*.parquet").sort("id")["hit_at_1"].to_list()
    b = pl.read_parquet(nights[1] / "*.parquet").sort("id")["hit_at_1"].to_list()
    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    ref = sm_mcnemar([[0, only_a], [only_b, 0]], exact=only_a + only_b < 25, correction=True)
    hit = report["metrics"]["hit_at_1"]
    assert hit["mcnemar"]["discordant"] == only_a + only_b
    assert hit["mcnemar"]["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    _, alone = run(capsys, *nights, "--cluster-by", "id")
    assert alone["clustering"]["clusters"] == alone["n_pairs"]
    assert alone["ci95"] != report["ci95"]  # resampled pair by pair: another interval
    capsys.readouterr()
    assert main(["compare", *map(str, nights)]) == 0
    text = capsys.readouterr().out
    assert "clustered by `query_id`" in text
    assert "smallest difference this comparison could detect" in text


def test_an_unknown_cluster_column_is_a_usage_error(
    nights: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", *map(str, nights), "--cluster-by", "nope"]) == 2
    assert "`nope`" in capsys.readouterr().err


def test_the_gate_can_require_non_inferiority(
    nights: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, report = run(capsys, *nights, "--margin", "0.02")
    lower = report["ci95"][0]
    test = report["non_inferiority"]
    assert test["lower_bound"] == lower
    wide = round(-lower + 0.01, 4)  # a margin the CI clears, and one it does not
    narrow = round(max(-lower - 0.01, 0.0), 4)
    code, shown = run(capsys, *nights, "--margin", wide, "--fail-drop", 1)
    assert code == 0
    assert shown["non_inferiority"]["non_inferior"] is True
    code, failed = run(capsys, *nights, "--margin", narrow, "--fail-drop", 1, "-o", tmp_path / "r")
    assert code == 5
    assert failed["gate"]["failed"] is True
    assert f"--margin {narrow:g} failed" in failed["gate"]["message"]
    md = (tmp_path / "r" / "compare.md").read_text()
    assert "non-inferiority" in md
    assert "NOT shown" in md
    code, _ = run(capsys, *nights, "--margin", narrow)  # no gate: reported, exit 0
    assert code == 0
