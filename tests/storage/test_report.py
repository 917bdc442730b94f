"""The run summary against hand computations on small, real Parquet part files."""

from __future__ import annotations

import json
import math
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctxprec.storage.outdir.schema import output_schema
from ctxprec.storage.report.summary import agreement, build_summary, render_markdown, write_summary
from tests.fakes.folders import commit

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# id, status, score, error, verdicts, source (a passthrough column)
ROWS: list[tuple[str, str, float | None, str | None, list[bool | None] | None, str]] = [
    ("a", "ok", 0.83, None, [True, False, True, False], "web"),
    ("b", "ok", 1.0, None, [True, True], "web"),
    ("c", "ok", 0.5, None, [False, True, False], "web"),
    ("d", "ok", 0.0, None, [False, False], "kb"),
    ("e", "empty_context", 0.0, None, [], "kb"),
    ("f", "failed", None, "http_500: server error after 3 tries", [True, None, False], "web"),
    ("g", "ok", 0.33, None, [False, False, True], "kb"),
    ("h", "failed", None, "rate_limited: 429 after 5 tries", None, "kb"),
]
RUN: dict[str, Any] = {
    "started_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    "wall_s": 2.0,
    "judge_model": "openai/gpt-4o-mini",
    "prompt_version": "v1",
    "input": "data/logs.parquet",
    "rows_this_run": 8,
    "judge": {
        "requests": 20,
        "retries": 3,
        "rate_limited": 2,
        "reasks": 1,
        "input_tokens": 100_000,
        "output_tokens": 20_000,
        "failures": {"http_500": 1},
        "errors_by_cause": {"http_500": 3, "rate_limited": 2},
    },
    "memo_hits": 5,
    "judge_calls": 15,
    "dedup_hits": 1,
    "price": {"input_per_mtok": 2.0, "output_per_mtok": 10.0},
    "estimate": {
        "calls": 12,
        "input_tokens": 80_000,
        "output_tokens": 25_000,
        "cost_usd": 0.5,
        "wall_s": 1.0,
    },
}


def _rank(verdicts: list[bool | None] | None, status: str) -> dict[str, Any]:
    """Reciprocal rank and hit/precision at 1 (null for failed rows, 0 for empty ones)."""
    if status == "failed" or verdicts is None:
        return {"reciprocal_rank": None, "hit_at_1": None, "precision_at_1": None}
    first = next((i for i, v in enumerate(verdicts) if v), None)
    hit = bool(verdicts[:1] == [True])
    return {
        "reciprocal_rank": 0.0 if first is None else 1 / (first + 1),
        "hit_at_1": hit,
        "precision_at_1": float(hit),
    }


def write_part(
    path: Path,
    rows: list[tuple[Any, ...]],
    *,
    labels: list[Any] | None = None,
    schema_one: bool = False,
) -> None:
    """One scored part file with the real output schema (+ a `source` passthrough column);
    `schema_one`: as output schema 1 wrote it (one token pair, the verdicts')."""
    schema = output_schema(passthrough=[pa.field("source", pa.string())])
    if schema_one:
        fields = [f for f in schema if not f.name.startswith(("paid_", "verdict_"))]
        at = fields.index(schema.field("scored_at"))
        fields[at:at] = [
            pa.field("input_tokens", pa.int64(), nullable=False),
            pa.field("output_tokens", pa.int64(), nullable=False),
        ]
        schema = pa.schema(fields, metadata={"ctxprec.schema_version": "1"})
    if labels is not None:
        schema = schema.append(pa.field("label_verdicts", pa.list_(pa.bool_())))
    records = []
    for i, (rid, status, score, error, verdicts, source) in enumerate(rows):
        n = len(verdicts or [])
        record = {
            "id": rid,
            "source": source,
            "score": score,
            "status": status,
            "error": error,
            "verdicts": verdicts,
            "context_count": n,
            "judge_model": "openai/gpt-4o-mini",
            "prompt_version": "v1",
            "input_tokens": 10 * n,
            "output_tokens": 2 * n,
            "paid_input_tokens": 5 * n,  # half its items from the memo
            "paid_output_tokens": n,
            "verdict_input_tokens": 10 * n,
            "verdict_output_tokens": 2 * n,
            "scored_at": datetime(2026, 1, 2, tzinfo=UTC),
            **_rank(verdicts, status),
        }
        if labels is not None:
            record["label_verdicts"] = labels[i]
        records.append({k: v for k, v in record.items() if k in schema.names})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records, schema=schema), path)


@pytest.fixture
def outdir(tmp_path: Path) -> Path:
    write_part(tmp_path / "part-00000.parquet", ROWS[:5])
    write_part(tmp_path / "part-00001.parquet", ROWS[5:])
    commit(tmp_path, tmp_path / "part-00000.parquet", tmp_path / "part-00001.parquet")
    return tmp_path


def test_rows_coverage_and_score_stats(outdir: Path) -> None:
    s = build_summary(outdir, RUN)
    assert s["rows"] == {"total": 8, "ok": 5, "empty_context": 1, "failed": 2}
    assert s["parts"] == 2
    assert s["coverage"] == 0.75  # 6 scored of 8
    # scored: 0, 0, 0.33, 0.5, 0.83, 1.0 -> linear quantiles at (n - 1) * q = 5q
    assert s["score"] == {
        "mean": round(2.66 / 6, 4),  # 0.4433
        "median": 0.415,  # (0.33 + 0.5) / 2
        "p10": 0.0,  # 0.5 -> between 0 and 0
        "p25": 0.0825,  # 1.25 -> 0 + 0.25 * 0.33
        "p75": 0.7475,  # 3.75 -> 0.5 + 0.75 * 0.33
        "p90": 0.915,  # 4.5 -> 0.83 + 0.5 * 0.17
        "min": 0.0,
        "max": 1.0,
        "std": round(
            math.sqrt(sum((x - 2.66 / 6) ** 2 for x in (0, 0, 0.33, 0.5, 0.83, 1)) / 5), 4
        ),
        "mean_ok_only": 0.532,  # 2.66 / 5, the empty-context row left out
    }


def test_bands_follow_the_seed(outdir: Path) -> None:
    bands = {b["band"]: (b["rows"], b["share"]) for b in build_summary(outdir, RUN)["bands"]}
    assert bands == {
        "excellent": (1, 0.1667),  # 1.0
        "good": (1, 0.1667),  # 0.83
        "medium": (1, 0.1667),  # 0.5
        "low": (1, 0.1667),  # 0.33
        "none": (2, 0.3333),  # d and the empty context
    }


def test_band_edges_on_another_scale(tmp_path: Path) -> None:
    rows = [(str(i), "ok", x, None, [True], "s") for i, x in enumerate([9.0, 7.0, 4.0, 0.1, 0.0])]
    rows.append(("z", "ok", 8.99, None, [True], "s"))
    write_part(tmp_path / "part-p.parquet", rows)
    commit(tmp_path, tmp_path / "part-p.parquet")
    s = build_summary(tmp_path, {}, scale=10)
    assert {b["band"]: b["rows"] for b in s["bands"]} == {
        "excellent": 1,
        "good": 2,
        "medium": 1,
        "low": 1,
        "none": 1,
    }
    assert s["score_histogram"]["zero"] == 1
    assert sum(s["score_histogram"]["counts"]) == 5
    assert s["score_histogram"]["counts"][18] == 1  # 9.0 opens the last-but-one bin
    assert s["score_histogram"]["edges"][-1] == 10.0


def test_relevance_by_position_skips_null_verdicts(outdir: Path) -> None:
    # position 0: a T, b T, c F, d F, g F, f T -> 3/6; position 1: f's null item skipped -> 2/5
    assert build_summary(outdir, RUN)["relevance_by_position"] == [
        {"position": 1, "items": 6, "relevant": 3, "relevant_rate": 0.5},
        {"position": 2, "items": 5, "relevant": 2, "relevant_rate": 0.4},
        {"position": 3, "items": 4, "relevant": 2, "relevant_rate": 0.5},
        {"position": 4, "items": 1, "relevant": 0, "relevant_rate": 0.0},
    ]


def test_a_share_is_rounded_once_from_its_counts() -> None:
    """6 of 11 is 54.545 %: summary.json keeps 0.5455, and the page reads 54.5 %, not the 54.6 %
    that rounding the stored figure a second time gives."""
    from ctxprec.storage.report.summary import _share

    assert _share(6, 11, 0.5455) == "54.5%"
    assert _share(None, 11, 0.5455) == "54.6%"  # an old summary without the counts
    assert _share(0, 0, None) == "—"


def test_rank_metrics_failures_tokens_cost_and_throughput(outdir: Path) -> None:
    s = build_summary(outdir, RUN)
    # reciprocal rank over the 6 scored rows: 1 + 1 + 1/2 + 0 + 0 + 1/3
    assert s["rank_metrics"]["reciprocal_rank"] == round((2.5 + 1 / 3) / 6, 4)
    assert s["rank_metrics"]["hit_at_1"] == round(2 / 6, 4)
    assert s["rank_metrics"]["ndcg_at_1"] is None  # column present, never filled
    assert s["failures"] == {"http_500": 1, "rate_limited": 1}
    assert s["tokens"] == {
        "paid_input_this_run": 100_000,  # what the judge reported for this run's calls
        "paid_output_this_run": 20_000,
        "paid_input_all_runs": 100_000,  # no history: this run is every run
        "paid_output_all_runs": 20_000,
        "verdict_input_all_rows": 170,  # the rows' verdict_* columns
        "verdict_output_all_rows": 34,
    }
    # 0.2 + 0.2; 340e-6 + 340e-6, rounded as every figure shown (4 decimals)
    assert s["cost_usd"] == {
        "paid_this_run": 0.4,
        "paid_all_runs": 0.4,
        "verdicts_all_rows": 0.0007,
    }
    assert s["judge"]["calls"] == 15
    assert s["judge"]["rate_limited"] == 2
    assert s["throughput"] == {"rows_per_s": 4.0, "calls_per_s": 7.5}
    assert s["estimate_vs_actual"]["calls"] == {"estimate": 12, "actual": 15, "ratio": 1.25}
    assert s["estimate_vs_actual"]["cost_usd"]["ratio"] == 0.8
    assert s["estimate_vs_actual"]["wall_s"]["ratio"] == 2.0
    assert s["run"]["started_at"] == "2026-01-02 03:04:05+00:00"
    assert json.loads(json.dumps(s)) == s


def test_an_output_of_schema_one_still_reads(tmp_path: Path) -> None:
    """Parts written before the token columns were split (one pair, the verdicts'): their
    figures read as the verdicts' cost; what the rows' runs paid is unknown, never 0."""
    write_part(tmp_path / "part-00000.parquet", ROWS[:5], schema_one=True)
    commit(tmp_path, tmp_path / "part-00000.parquet")
    s = build_summary(tmp_path, RUN)
    assert s["tokens"]["verdict_input_all_rows"] == 110  # 10 per item: 4 + 2 + 3 + 2 + 0
    assert s["tokens"]["verdict_output_all_rows"] == 22
    assert s["tokens"]["paid_input_this_run"] == 100_000  # run.json's, as ever
    write_summary(tmp_path, s)
    assert (
        "| the rows' verdicts when first paid: tokens in / out | 110 / 22 |"
        in (tmp_path / "summary.md").read_text()
    )


def test_no_price_no_cost_no_estimate(outdir: Path) -> None:
    s = build_summary(outdir, {"wall_s": 0})
    assert s["cost_usd"] is None
    assert s["estimate_vs_actual"] is None
    assert s["throughput"] == {"rows_per_s": None, "calls_per_s": None}


def test_agreement_matches_a_hand_computation() -> None:
    # judge yes & label yes 20, judge yes & label no 5, judge no & label yes 10, both no 15
    # p_o = 35/50 = 0.7; p_e = (25*30 + 25*20) / 50**2 = 0.5; kappa = (0.7 - 0.5) / 0.5 = 0.4
    assert agreement(tp=20, fp=5, fn=10, tn=15) == {
        "items": 50,
        "accuracy": 0.7,
        "precision": 0.8,
        "recall": round(20 / 30, 4),
        "f1": round(2 * 0.8 * (2 / 3) / (0.8 + 2 / 3), 4),
        "cohen_kappa": 0.4,
    }
    assert agreement(0, 0, 0, 0)["cohen_kappa"] is None
    one_class = agreement(3, 0, 0, 0)  # chance agreement is 1: kappa is undefined
    assert one_class["accuracy"] == 1.0
    assert one_class["cohen_kappa"] is None


def test_label_agreement_from_parquet(tmp_path: Path) -> None:
    rows = [
        ("r1", "ok", 0.83, None, [True, False, True], "s"),
        ("r2", "ok", 0.0, None, [False, False], "s"),
        ("r3", "failed", None, "timeout: x", [True, None], "s"),
        ("r4", "ok", 1.0, None, [True], "s"),
    ]
    labels = [[True, True, False], [False, True], [True, False], None]
    write_part(tmp_path / "part-p.parquet", rows, labels=labels)
    commit(tmp_path, tmp_path / "part-p.parquet")
    got = build_summary(tmp_path, {})["labels"]
    # pairs (judge, label): r1 TT FT TF, r2 FF FT, r3 TT (null item skipped), r4 unlabelled
    assert got == {
        **agreement(tp=2, fp=1, fn=2, tn=1),
        "map_rows": 2,  # r1 and r2 are complete on both sides
        "label_map_mean": 0.75,  # [T, T, F] -> 1.0, [F, T] -> 0.5
        "judged_map_mean": 0.415,  # [T, F, T] -> 0.83, [F, F] -> 0
    }


def test_markdown_has_the_key_lines(outdir: Path) -> None:
    md = render_markdown(build_summary(outdir, RUN))
    assert md.startswith("# ctxprec run summary\n")
    assert "**8** rows scored from `data/logs.parquet`" in md
    assert "**2** failed (http_500: 1, rate_limited: 1)" in md
    retry = "> **2 rows failed (http_500: 1, rate_limited: 1) — re-run the same command to retry"
    assert retry + " only them.**" in md
    assert "Coverage: 75.0%" in md
    assert "| excellent | 0.9 – 1.0 | relevant context comes first | 1 | 16.7% |" in md
    assert "| none | 0 | no relevant context found | 2 | 33.3% |" in md
    assert "| #2 | 5 | 40.0% |" in md
    assert "| 429 responses | 2 |" in md
    assert "| paid by this run: cost USD | 0.4 |" in md
    assert "| the rows' verdicts when first paid: tokens in / out | 170 / 34 |" in md
    assert "![score distribution](charts/score_distribution.png)" in md
    assert "![relevance by position](charts/relevance_by_position.png)" in md


def test_markdown_without_charts_pictures_the_distribution_in_text(outdir: Path) -> None:
    summary = build_summary(outdir, RUN)
    md = render_markdown(summary, charts=False)
    assert "![" not in md
    block = md.split("## Score distribution (rows)\n\n```text\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    hist = summary["score_histogram"]
    assert [int(line.rsplit(" ", 1)[1]) for line in lines] == [hist["zero"], *hist["counts"]]
    assert lines[0].startswith("0 (none)")
    assert lines[-1].startswith("(0.95, 1]")
    longest = max(hist["zero"], *hist["counts"])
    assert max(line.count("█") for line in lines) == 30
    for line in lines:
        assert line.count("█") == round(30 * int(line.rsplit(" ", 1)[1]) / longest)
    assert "`ctxprec summary OUTDIR` draws them (charts/*.png)" in md
    assert "Score distribution" not in render_markdown(summary)  # the charts show it instead


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_write_summary_writes_json_markdown_and_charts(outdir: Path) -> None:
    summary = build_summary(outdir, RUN, group_by="source")
    write_summary(outdir, summary)
    assert json.loads((outdir / "summary.json").read_text()) == summary
    md = (outdir / "summary.md").read_text()
    assert md == render_markdown(summary)
    assert "![scores by group](charts/scores_by_group.png)" in md
    for name in ("score_distribution", "relevance_by_position", "scores_by_group"):
        data = (outdir / "charts" / f"{name}.png").read_bytes()
        assert len(data) > 1024
        assert _png_size(data) == (800, 450)
    leftovers = [p.name for p in outdir.rglob("*") if p.name.startswith(".")]
    assert leftovers == []  # every temp file was renamed into place


def test_group_by(outdir: Path) -> None:
    by_group = build_summary(outdir, RUN, group_by="source")["by_group"]
    assert by_group["column"] == "source"
    assert by_group["groups_total"] == 2
    got = {g["group"]: (g["rows"], g["failed"], g["mean_score"]) for g in by_group["groups"]}
    # kb: d 0, e 0, g 0.33, h failed; web: a 0.83, b 1.0, c 0.5, f failed
    assert got == {"kb": (4, 1, 0.11), "web": (4, 1, round(2.33 / 3, 4))}
    missing = build_summary(outdir, RUN, group_by="tenant")["by_group"]
    assert missing["groups"] == []
    assert "`tenant` is not in the scored parts" in missing["note"]


def test_empty_outdir(tmp_path: Path) -> None:
    s = build_summary(tmp_path / "never-written", RUN)
    assert s["rows"] == {"total": 0, "ok": 0, "empty_context": 0, "failed": 0}
    assert s["coverage"] is None
    assert s["score"]["mean"] is None
    assert all(b["rows"] == 0 and b["share"] is None for b in s["bands"])
    assert s["relevance_by_position"] == []
    assert s["failures"] == {}
    write_summary(tmp_path, s)
    md = (tmp_path / "summary.md").read_text()
    assert "**0** rows" in md
    assert "![" not in md
    assert "failed —" not in md
    assert not (tmp_path / "charts").exists()


def test_hive_layout_and_state_folder(tmp_path: Path) -> None:
    write_part(tmp_path / "dt=2026-01-01" / "part-a.parquet", ROWS[:4])
    write_part(tmp_path / "dt=2026-01-02" / "part-a.parquet", ROWS[4:])
    write_part(tmp_path / "_ctxprec" / "stray.parquet", ROWS)  # state, never data
    write_part(tmp_path / "dt=2026-01-03" / "mine.parquet", ROWS)  # a user's file, not data
    commit(tmp_path, *(tmp_path / f"dt=2026-01-0{d}" / "part-a.parquet" for d in (1, 2)))
    s = build_summary(tmp_path, RUN, group_by="dt")
    assert s["rows"]["total"] == 8
    assert s["parts"] == 2
    assert s["score"]["median"] == 0.415
    got = {g["group"]: g["rows"] for g in s["by_group"]["groups"]}
    assert got == {"2026-01-01": 4, "2026-01-02": 4}
