"""Nights over time in the summary: one row per night of a date-partitioned output, mean with
its CI, P@1, coverage, tokens and cost, and the nights whose mean left the previous night's CI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from ctxprec.cli.main import main
from ctxprec.storage.report.trend import night_trend, trend_markdown, trend_text
from tests.fakes.folders import commit


def night(
    path: Path, dt: str, scores: list[float | None], tokens: int = 100, paid: int | None = None
) -> None:
    """One night's part: each row's verdicts cost `tokens` in (a tenth out) when first paid, and
    the run that wrote it paid `paid` of them (all by default; None: an output of schema 1,
    whose one token pair was the verdicts')."""
    n = len(scores)
    part = path / f"dt={dt}"
    part.mkdir(parents=True)
    columns: dict[str, object] = {
        "id": [f"{dt}/{i}" for i in range(n)],
        "score": scores,
        "status": ["ok" if s is not None else "failed" for s in scores],
        "precision_at_1": [None if s is None else float(s >= 0.5) for s in scores],
        "context_count": [4] * n,
    }
    if paid is None:
        columns |= {"input_tokens": [tokens] * n, "output_tokens": [tokens // 10] * n}
    else:
        columns |= {
            "paid_input_tokens": [paid] * n,
            "paid_output_tokens": [paid // 10] * n,
            "verdict_input_tokens": [tokens] * n,
            "verdict_output_tokens": [tokens // 10] * n,
        }
    frame = pl.DataFrame(columns, schema_overrides={"score": pl.Float64})
    frame.write_parquet(part / "part-00000-00000.parquet")


@pytest.fixture
def nights(tmp_path: Path) -> Path:
    out = tmp_path / "scores"
    night(out, "2026-11-27", [0.5, 0.6, 0.4, 0.5, 0.55, 0.45], paid=100)
    # within the CI, one failed; its verdicts came from the memo: nothing paid
    night(out, "2026-11-28", [0.52, 0.58, 0.42, 0.5, 0.5, None], paid=0)
    night(out, "2026-11-29", [0.1, 0.2, 0.15, 0.1, 0.2, 0.15], paid=100)  # a clear drop
    state = out / "_ctxprec"
    state.mkdir()
    (state / "manifest.json").write_text(json.dumps({"describe": {"partition_by": ["dt"]}}))
    commit(out, *sorted(out.glob("dt=*/*.parquet")))
    return out


def test_per_night_figures_and_moves(nights: Path) -> None:
    price = {"input_per_mtok": 1.0, "output_per_mtok": 10.0}
    trend = night_trend(nights, {"price": price})
    assert trend is not None
    assert trend["column"] == "dt"
    rows = trend["nights"]
    assert [r["night"] for r in rows] == ["2026-11-27", "2026-11-28", "2026-11-29"]
    first = rows[0]
    scores = [0.5, 0.6, 0.4, 0.5, 0.55, 0.45]
    mean = sum(scores) / 6
    sd = math.sqrt(sum((s - mean) ** 2 for s in scores) / 5)
    assert first["mean_score"] == pytest.approx(mean)
    assert first["ci95"] == pytest.approx([mean - 1.959964 * sd / math.sqrt(6),
                                           mean + 1.959964 * sd / math.sqrt(6)])  # fmt: skip
    assert first["p_at_1"] == pytest.approx(4 / 6)
    assert first["items"] == 24
    assert rows[1]["coverage"] == pytest.approx(5 / 6)
    assert rows[1]["failed"] == 1
    assert first["paid_cost_usd"] == 0.0012  # (600 x 1 + 60 x 10) / 1e6, 4 decimals
    assert first["verdict_cost_usd"] == 0.0012
    assert (rows[1]["paid_input_tokens"], rows[1]["verdict_input_tokens"]) == (0, 600)
    assert (rows[1]["paid_cost_usd"], rows[1]["verdict_cost_usd"]) == (0.0, 0.0012)
    assert [r["moved"] for r in rows] == [None, None, "down"]
    md = "\n".join(trend_markdown(trend))
    assert "| 2026-11-28 | 6 | 0.504 |" in md
    assert "| 0 / 0 | 0 | 600 / 60 | 0.0012 |" in md  # paid, then the verdicts' cost
    assert "0.0012" in md
    assert "0.001200" not in md  # one rounding rule: 4 decimals
    assert "▼ down" in md
    assert "n/a" in md
    assert "None" not in md
    assert "2026-11-29" in trend_text(trend)


@pytest.mark.slow
def test_summary_command_shows_the_nights(
    hotpot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three incremental nights (offline judge) into a dt-partitioned output."""
    df = pl.read_parquet(hotpot)
    out = tmp_path / "scores"
    for i, dt in enumerate(["2026-11-27", "2026-11-28", "2026-11-29"]):
        src = tmp_path / f"n{i}.parquet"
        df.slice(20 * i, 20).with_columns(pl.lit(dt).alias("dt")).write_parquet(src)
        args = ["score", str(src), "-o", str(out), "--incremental", "--passthrough", "dt"]
        args += ["--partition-by", "dt", "--map", "query=question"]
        assert main([*args, "--map", "expected=ground_truth", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["summary", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "nights by dt" in printed
    assert "2026-11-29" in printed
    assert "None" not in printed
    assert "## Nights by dt" in (out / "summary.md").read_text()
    assert (out / "charts" / "trend.png").stat().st_size > 0
    nights = json.loads((out / "summary.json").read_text())["trend"]["nights"]
    assert [n["rows"] for n in nights] == [20, 20, 20]
    by_hand = df.slice(40, 20)  # the third night's P@1 from the stored rows
    got = pl.read_parquet(out / "dt=2026-11-29" / "*.parquet")
    assert got.height == by_hand.height
    assert nights[2]["p_at_1"] == pytest.approx(got["precision_at_1"].mean())
    assert nights[2]["mean_score"] == pytest.approx(got["score"].mean())


def test_nights_of_an_output_of_schema_one(tmp_path: Path) -> None:
    """Parts with one token pair (the verdicts'): what was paid per night is unknown (n/a)."""
    out = tmp_path / "scores"
    night(out, "2026-11-27", [0.5, 0.6])
    (out / "_ctxprec").mkdir()
    (out / "_ctxprec" / "manifest.json").write_text(
        json.dumps({"describe": {"partition_by": ["dt"]}})
    )
    commit(out, *sorted(out.glob("dt=*/*.parquet")))
    trend = night_trend(out, {"price": {"input_per_mtok": 1.0, "output_per_mtok": 10.0}})
    assert trend is not None
    first = trend["nights"][0]
    assert (first["paid_input_tokens"], first["paid_cost_usd"]) == (None, None)
    assert (first["verdict_input_tokens"], first["verdict_cost_usd"]) == (200, 0.0004)
    assert "| n/a / n/a | n/a | 200 / 20 | 0.0004 |" in "\n".join(trend_markdown(trend))


def test_no_trend_without_a_date_partition(tmp_path: Path) -> None:
    out = tmp_path / "o"
    night(out, "x", [0.5])
    (out / "_ctxprec").mkdir()
    (out / "_ctxprec" / "manifest.json").write_text(json.dumps({"describe": {}}))
    assert night_trend(out, {}) is None
