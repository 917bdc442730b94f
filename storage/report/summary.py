"""The run summary: figures read lazily from the scored part files plus the run's judge stats,
written next to the output as summary.json (machines), summary.md and charts/*.png (people).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from ctxprec.storage.core.constants import STATUS_EMPTY, STATUS_FAILED, STATUS_OK
from ctxprec.storage.core.figures import figure_text, percent_text, round_figure, share_figure
from ctxprec.storage.core.metric import map_stage, rank_column_names
from ctxprec.storage.core.settings import DEFAULT_KS
from ctxprec.storage.files import layout
from ctxprec.storage.files.atomic import atomic_write_bytes
from ctxprec.storage.files.layout import CHART_FILES, TREND_CHART
from ctxprec.storage.files.objpath import OutPath, local_copies, out_path
from ctxprec.storage.outdir.dataset import scan_parts
from ctxprec.storage.outdir.ownership import part_files
from ctxprec.storage.outdir.schema import SCHEMA_VERSION, TOKEN_COLUMNS, token_columns
from ctxprec.storage.report.audit import audit_lines, audit_summary
from ctxprec.storage.report.charts import (
    CHARTS_INSTALL,
    charts_available,
    planned_charts,
    render_charts,
)
from ctxprec.storage.report.estimate import audit_reference, corrected_estimate, estimate_sentence
from ctxprec.storage.report.html import render_html
from ctxprec.storage.report.mdtext import md_code, md_text
from ctxprec.storage.report.rows import KeptTexts, TextLookup, report_rows, text_columns
from ctxprec.storage.report.trend import night_trend, trend_chart, trend_markdown
from ctxprec.storage.report.words import failure_groups, judge_rows, rate, seconds
from ctxprec.storage.stats.kappa import cohen_kappa

__all__ = [
    "BANDS",
    "agreement",
    "build_summary",
    "rate",
    "render_markdown",
    "seconds",
    "write_summary",
]

_EPS = 1e-9  # scores carry two decimals; this only absorbs float noise in score / scale
_BINS = 20
_MAX_GROUPS = 200
_END_GROUPS = 10  # groups of the lowest and of the highest mean score kept for summary.md
# (band, lower, upper, range, meaning) on score / scale, the documented bands; "none" is exactly 0.
BANDS: tuple[tuple[str, float, float, str, str], ...] = (
    ("excellent", 0.9, 1.0, "0.9 – 1.0", "relevant context comes first"),
    ("good", 0.7, 0.9, "0.7 – <0.9", "most relevant items are well placed"),
    ("medium", 0.4, 0.7, "0.4 – <0.7", "relevant items are mixed with irrelevant ones"),
    ("low", 0.0, 0.4, ">0 – <0.4", "relevant context is rare or badly placed"),
    ("none", 0.0, 0.0, "0", "no relevant context found"),
)
_QUANTILES = {"median": 0.5, "p10": 0.1, "p25": 0.25, "p75": 0.75, "p90": 0.9}
_STATS = ("mean", "median", "p10", "p25", "p75", "p90", "min", "max", "std", "mean_ok_only")
# The columns every ctxprec part has; an outdir without parts reads as this empty frame.
_EMPTY: dict[str, pl.DataType] = {
    "status": pl.String(),
    "score": pl.Float64(),
    "error": pl.String(),
    "verdicts": pl.List(pl.Boolean()),
    **{name: pl.Int64() for name in TOKEN_COLUMNS},
}


def build_summary(
    outdir: OutPath,
    run: Mapping[str, Any],
    *,
    scale: float = 1.0,
    group_by: str | None = None,
    ks: Sequence[int] = DEFAULT_KS,
) -> dict[str, Any]:
    """Every figure of the summary; Polars reads only the columns each figure needs."""
    outdir = out_path(outdir)
    parts = part_files(outdir)  # what ctxprec committed; files users added are not data
    with local_copies(parts, outdir) as local:  # object stores: read from a temp copy
        return _build(outdir, local, run, scale=scale, group_by=group_by, ks=ks)


def _build(
    outdir: OutPath,
    parts: list[Path],
    run: Mapping[str, Any],
    *,
    scale: float,
    group_by: str | None,
    ks: Sequence[int],
) -> dict[str, Any]:
    lf = _scan(parts)
    cols = set(lf.collect_schema().names())
    figures = _figures(lf, scale, cols)
    tokens = figures.pop("tokens")
    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run": json.loads(json.dumps(dict(run), default=str)),
        "scale": scale,
        "parts": len(parts),
        **figures,
        "score_histogram": _histogram(lf, scale),
        "relevance_by_position": _positions(lf),
        "rank_metrics": _rank_metrics(lf, cols, ks),
        "failures": _failures(lf),
        "by_group": _by_group(lf, cols, group_by) if group_by else None,
        "labels": _labels(lf, scale) if "label_verdicts" in cols else None,
        # prediction-powered: what the labels (or the audit judge) say of every row, from the
        # labelled (audited) few; `estimate` is the labels' when there are, `estimates` all
        **_estimates(lf, cols, scale, group_by, run),
        "audit": audit_summary(lf, cols, run),  # --audit-model: agreement, each judge's cost
    }
    summary["history"] = _history(run)
    summary |= _judge(run, tokens, _prompt_versions(lf, cols), summary["history"])
    summary["estimate_vs_actual"] = _estimate_vs_actual(run, summary)
    summary["trend"] = night_trend(outdir, run, parts)  # None unless partitioned by a date
    summary["batch_api"] = (run.get("engine") or {}).get("batch_api")  # saved by --batch-api runs
    summary["self_agreement"] = run.get("recheck")  # --recheck: the judge against itself
    # --duplicate-ids keep-first|keep-last: the input's rows that repeated an id, not scored
    summary["duplicate_ids"] = run.get("duplicate_ids")
    return summary


def _estimates(
    lf: pl.LazyFrame, cols: set[str], scale: float, group_by: str | None, run: Mapping[str, Any]
) -> dict[str, Any]:
    """`estimate` (the headline: against the labels when the output has labelled rows, else
    against the audit judge) and `estimates` (every corrected estimate: labels, then audit)."""
    found = [corrected_estimate(lf, cols, scale, group_by)]
    if "audit_score" in cols:
        model = (run.get("audit") or {}).get("model") or "judge"
        reference = audit_reference(model)
        found.append(corrected_estimate(lf, cols, scale, group_by, "audit_score", reference))
    estimates = [e for e in found if e is not None]
    return {"estimate": estimates[0] if estimates else None, "estimates": estimates}


def _scan(parts: list[Path]) -> pl.LazyFrame:
    if not parts:
        return pl.LazyFrame(schema=_EMPTY)
    return scan_parts(parts)


def _norm(scale: float) -> pl.Expr:
    """score / scale: the 0..1 reading of a score (scale 0 gives only zeros)."""
    return pl.col("score") / scale if scale > 0 else pl.col("score") * 0.0


def _band(scale: float) -> pl.Expr:
    """The band of each score; null for unscored rows."""
    n = _norm(scale)
    return (
        pl.when(n < _EPS).then(pl.lit("none"))
        .when(n < 0.4 - _EPS).then(pl.lit("low"))
        .when(n < 0.7 - _EPS).then(pl.lit("medium"))
        .when(n < 0.9 - _EPS).then(pl.lit("good"))
        .when(n.is_not_null()).then(pl.lit("excellent"))
    )  # fmt: skip


def _figures(lf: pl.LazyFrame, scale: float, cols: set[str]) -> dict[str, Any]:
    """Rows by status, coverage, score statistics, bands and token sums in one pass."""
    status, score, band = pl.col("status"), pl.col("score"), _band(scale)
    tokens = [t.sum() for t in token_columns(cols)]
    if "paid_input_tokens" not in cols:  # schema 1: what each row's run paid is unknown
        tokens = [t if not t.meta.output_name().startswith("paid") else pl.lit(None, pl.Int64)
                  .alias(t.meta.output_name()) for t in tokens]  # fmt: skip
    got = lf.select(
        pl.len().alias("total"),
        *[(status == s).sum().alias(s) for s in (STATUS_OK, STATUS_EMPTY, STATUS_FAILED)],
        *[score.quantile(q, "linear").alias(k) for k, q in _QUANTILES.items()],
        *[getattr(score, k)().alias(k) for k in ("mean", "min", "max", "std")],
        score.filter(status == STATUS_OK).mean().alias("mean_ok_only"),
        *[(band == b).sum().alias(b) for b, *_ in BANDS],
        *tokens,
        score.count().alias("n_scores"),
    ).collect()
    got_row = got.row(0, named=True)
    rows = {k: int(got_row[k]) for k in ("total", STATUS_OK, STATUS_EMPTY, STATUS_FAILED)}
    scored = rows[STATUS_OK] + rows[STATUS_EMPTY]
    share = {b: _r(_ratio(got_row[b], scored)) for b, *_ in BANDS}
    bands = [
        dict(band=b, lower=lo, upper=hi, rows=got_row[b], share=share[b]) for b, lo, hi, *_ in BANDS
    ]
    return {
        "rows": rows,
        "coverage": _share_of(scored, rows["total"]),  # never 1.0 with a row failed
        "score": {k: _r(got_row[k]) for k in _STATS},
        "score_ci95": _mean_ci(got_row["mean"], got_row["std"], got_row["n_scores"]),
        "bands": bands,
        "tokens": {k: None if got_row[k] is None else int(got_row[k]) for k in TOKEN_COLUMNS},
    }


_Z95 = 1.959964
MEAN_CI = "normal approximation: mean ± 1.96 × sd / √n over the scored rows"


def _mean_ci(mean: float | None, std: float | None, n: int) -> dict[str, Any] | None:
    """The 95% CI of the mean score (the headline of summary.html); None without two scores."""
    if mean is None or std is None or n < 2:
        return None
    half = _Z95 * std / math.sqrt(n)
    return {"low": _r(mean - half), "high": _r(mean + half), "n": n, "method": MEAN_CI}


def _histogram(lf: pl.LazyFrame, scale: float) -> dict[str, Any]:
    """Scored rows in 20 equal bins over (0, scale]; exact zeros (band "none") counted apart."""
    n = _norm(scale)
    bins = (n * _BINS + _EPS).floor().clip(0, _BINS - 1).cast(pl.Int64).alias("bin")
    got = lf.filter(n >= _EPS).group_by(bins).len().collect()
    counts = dict(got.iter_rows())
    span = scale if scale > 0 else 1.0
    return {
        "edges": [_r(span * i / _BINS) for i in range(_BINS + 1)],
        "counts": [int(counts.get(i, 0)) for i in range(_BINS)],
        "zero": int(lf.filter(n < _EPS).select(pl.len()).collect().item()),
    }


def _positions(lf: pl.LazyFrame) -> list[dict[str, Any]]:
    """Relevant rate per position (1 = first retrieved) over every judged item (null verdicts of
    failed items skipped)."""
    v = pl.col("verdicts")
    got = (
        lf.select(v, pl.int_ranges(1, v.list.len() + 1).alias("position"))
        .explode(["verdicts", "position"])
        .drop_nulls()
        .group_by("position")
        .agg(
            pl.len().alias("items"),
            v.cast(pl.Int64).sum().alias("relevant"),
            v.cast(pl.Float64).mean().alias("relevant_rate"),
        )
        .sort("position")
        .collect(engine="streaming")
    )
    return [{**r, "relevant_rate": _r(r["relevant_rate"])} for r in got.iter_rows(named=True)]


def _rank_metrics(lf: pl.LazyFrame, cols: set[str], ks: Sequence[int]) -> dict[str, Any]:
    """Mean of each rank metric column present (hit@k as a rate)."""
    names = [c for c in rank_column_names(ks) if c in cols]
    if not names:
        return {}
    got = lf.select(pl.col(c).cast(pl.Float64).mean() for c in names).collect()
    return {k: _r(v) for k, v in got.row(0, named=True).items()}


def _failures(lf: pl.LazyFrame) -> dict[str, int]:
    """Failed rows by cause: the error text before its first ':' ("http_500: ..." -> http_500)."""
    cause = pl.col("error").str.split(":").list.first().str.strip_chars()
    got = (
        lf.filter(pl.col("status") == STATUS_FAILED)
        .group_by(cause.fill_null("unknown").alias("cause"))
        .len()
        .sort(["len", "cause"], descending=[True, False])
        .collect()
    )
    return {str(c): int(n) for c, n in got.iter_rows()}


def _by_group(lf: pl.LazyFrame, cols: set[str], column: str) -> dict[str, Any]:
    """Rows, failed rows and score statistics per value of `column`, largest groups first."""
    if column not in cols:
        note = f"column `{column}` is not in the scored parts (columns: {', '.join(sorted(cols))})"
        return {"column": column, "groups": [], "groups_total": 0, "note": note}
    score = pl.col("score")
    got = (
        lf.group_by(pl.col(column).cast(pl.String).alias("group"))
        .agg(
            pl.len().alias("rows"),
            (pl.col("status") == STATUS_FAILED).sum().alias("failed"),
            score.mean().alias("mean_score"),
            *[score.quantile(q, "linear").alias(k) for k, q in _QUANTILES.items()],
        )
        .sort(["rows", "group"], descending=[True, False], nulls_last=True)
        .collect()
    )
    groups = [{k: _r(v) for k, v in g.items()} for g in got.head(_MAX_GROUPS).iter_rows(named=True)]
    scored = got.filter(pl.col("mean_score").is_not_null())

    def ends(descending: bool) -> list[dict[str, Any]]:
        order = scored.sort(["mean_score", "rows", "group"], descending=[descending, True, False])
        return [
            {k: _r(v) for k, v in g.items()} for g in order.head(_END_GROUPS).iter_rows(named=True)
        ]

    return {
        "column": column,
        "groups": groups,  # the largest, most rows first
        "groups_total": got.height,
        "worst": ends(False),  # the lowest mean scores over every group, lowest first
        "best": ends(True),  # and the highest, highest first
    }


def agreement(tp: int, fp: int, fn: int, tn: int) -> dict[str, Any]:
    """Judge vs human labels (labels are the truth): accuracy, precision, recall, F1, Cohen's κ."""
    n = tp + fp + fn + tn
    precision = _ratio(tp, tp + fp)
    recall = _ratio(tp, tp + fn)
    f1 = _ratio(2 * precision * recall, precision + recall) if precision and recall else None
    p_o = _ratio(tp + tn, n)
    # κ is undefined (None) when chance agreement is 1: every item on one class on both sides
    kappa = cohen_kappa([tp, fp, fn, tn])
    figures = {"accuracy": p_o, "precision": precision, "recall": recall, "f1": f1}
    return {"items": n, **{k: _r(v) for k, v in figures.items()}, "cohen_kappa": _r(kappa)}


def _labels(lf: pl.LazyFrame, scale: float) -> dict[str, Any]:
    """Agreement on items both judged and labelled; MAP means over rows complete on both sides."""
    v, lab = pl.col("verdicts"), pl.col("label_verdicts")
    items = (
        lf.select(v, lab)
        .with_row_index("row")
        .filter(v.list.len() == lab.list.len())
        .with_columns(pl.int_ranges(v.list.len()).alias("position"))
        .explode(["verdicts", "label_verdicts", "position"])
    )
    pairs = items.drop_nulls(["verdicts", "label_verdicts"]).group_by(v, lab).len().collect()
    n = {(judged, label): count for judged, label, count in pairs.iter_rows()}
    cells = ((True, True), (True, False), (False, True), (False, False))
    tp, fp, fn, tn = (n.get(cell, 0) for cell in cells)
    complete = items.filter(v.is_not_null().all().over("row") & lab.is_not_null().all().over("row"))
    label_map = map_stage(complete, relevant="label_verdicts", scale=scale)
    judged_map = map_stage(complete, relevant="verdicts", scale=scale)
    return {
        **agreement(tp, fp, fn, tn),
        "map_rows": label_map.height,
        "label_map_mean": _r(label_map["score"].mean()),
        "judged_map_mean": _r(judged_map["score"].mean()),
    }


def _prompt_versions(lf: pl.LazyFrame, cols: set[str]) -> dict[str, int]:
    """{prompt version: rows} over the rows the output holds, most rows first."""
    if "prompt_version" not in cols:
        return {}
    got = (
        lf.group_by("prompt_version")
        .len()
        .sort(["len", "prompt_version"], descending=[True, False])
    )
    return {str(v): int(n) for v, n in got.collect().iter_rows() if v is not None}


def _judge(
    run: Mapping[str, Any],
    rows: Mapping[str, int | None],
    versions: Mapping[str, int],
    history: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """This run's judge counters; tokens and estimated cost, each figure twice: what was paid
    (by this run, as the judge reported its calls; by every run of the output together, its
    history) and what the rows' verdicts cost when first paid (the rows' `verdict_*` columns:
    memo hits included, each call once); throughput; the prompt versions the rows were judged
    with (the run's own when there are no rows)."""
    j, wall = run.get("judge") or {}, run.get("wall_s")
    used = (
        " / ".join(versions)
        if len(versions) < 2
        else " / ".join(f"{v} ({n:,} {'row' if n == 1 else 'rows'})" for v, n in versions.items())
    )
    judge = {
        "model": run.get("judge_model"),
        "prompt_version": used or run.get("prompt_version"),
        "calls": run.get("judge_calls"),
        **{k: run.get(k) for k in ("memo_hits", "dedup_hits", "reason_calls")},
        **{k: j.get(k) for k in ("requests", "retries", "rate_limited", "reasks")},
        "row_fallbacks": j.get("row_fallbacks"),  # --mode row: rows judged item by item
        "usage_unknown": j.get("usage_unknown"),  # replies whose token counts were not counts
        **{k: dict(j.get(k) or {}) for k in ("failures", "errors_by_cause")},
        "adapted": "; ".join(sorted(j.get("adaptations") or {})) or None,  # what was sent
    }
    total = (history or {}).get("total") or {}
    price = run.get("price")
    this_cost = _usd(price, j.get("input_tokens"), j.get("output_tokens"),
                     j.get("cached_input_tokens") or 0)  # fmt: skip
    tokens = {
        "paid_input_this_run": j.get("input_tokens"),
        "paid_output_this_run": j.get("output_tokens"),
        "paid_input_all_runs": total.get("paid_input_tokens", j.get("input_tokens")),
        "paid_output_all_runs": total.get("paid_output_tokens", j.get("output_tokens")),
        "verdict_input_all_rows": rows.get("verdict_input_tokens"),
        "verdict_output_all_rows": rows.get("verdict_output_tokens"),
    }
    cost = None
    if _priced(price):
        cost = {
            "paid_this_run": this_cost,
            "paid_all_runs": total.get("paid_cost_usd", this_cost) if total else this_cost,
            "verdicts_all_rows": _usd(
                price, tokens["verdict_input_all_rows"], tokens["verdict_output_all_rows"]
            ),
        }
    calls = judge["calls"] if judge["calls"] is not None else judge["requests"]
    throughput = {
        "rows_per_s": _ratio(run.get("rows_this_run"), wall),
        "calls_per_s": _ratio(calls, wall),
    }
    return {
        "tokens": tokens,
        "cost_usd": cost,
        "judge": judge,
        "wall_s": _r(wall),
        "throughput": {k: _r(v) for k, v in throughput.items()},
    }


def _priced(price: Any) -> bool:
    p = price or {}
    return p.get("input_per_mtok") is not None and p.get("output_per_mtok") is not None


def _usd(
    price: Any, t_in: Any, t_out: Any, cached: int = 0, *, exact: bool = False
) -> float | None:
    """USD = input tokens x input price + output tokens x output price (per million tokens);
    `cached` prompt tokens at the cached-input price when [prices] gives one; rounded as every
    figure shown (`round_figure`: 4 decimals) unless `exact`. None without a price or tokens."""
    if not _priced(price) or t_in is None or t_out is None:
        return None
    p_in, p_out = price["input_per_mtok"], price["output_per_mtok"]
    p_cached = price.get("cached_input_per_mtok")
    hits = min(cached, t_in) if p_cached is not None else 0
    paid = float((t_in - hits) * p_in + hits * (p_cached or 0.0) + t_out * p_out) / 1e6
    return paid if exact else round_figure(paid)


def _history(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """Every run that wrote the output (run.json "history", oldest first) with what it paid,
    and their totals: what the output cost and how fast it was scored, whatever the last run
    did (a run that found everything in the memo paid nothing)."""
    runs, costs = [], []
    for h in run.get("history") or []:
        t_in, t_out = h.get("input_tokens"), h.get("output_tokens")
        wall, cached = h.get("wall_s"), h.get("cached_input_tokens") or 0
        cost = _usd(h.get("price"), t_in, t_out, cached, exact=True)
        costs += [] if cost is None else [cost]
        runs.append(
            {
                **{k: h.get(k) for k in ("finished_at", "rows_this_run", "judge_calls")},
                "memo_hits": h.get("memo_hits"),
                "paid_input_tokens": t_in,
                "paid_output_tokens": t_out,
                "paid_cost_usd": None if cost is None else round_figure(cost),
                "wall_s": _r(wall),
                "rows_per_s": _r(_ratio(h.get("rows_this_run"), wall)),
            }
        )
    if not runs:
        return None
    keys = ("rows_this_run", "judge_calls", "memo_hits", "paid_input_tokens", "paid_output_tokens")
    total = {k: sum(r[k] or 0 for r in runs) for k in keys}
    total |= {
        "runs": len(runs),
        "paid_cost_usd": round_figure(sum(costs)) if costs else None,
        "wall_s": _r(sum(r["wall_s"] or 0.0 for r in runs)),
    }
    return {"runs": runs, "total": total}


def _estimate_vs_actual(run: Mapping[str, Any], s: Mapping[str, Any]) -> dict[str, Any] | None:
    """Estimate, actual and actual / estimate for calls, tokens, cost and wall time."""
    est = run.get("estimate")
    if not est:
        return None
    actual = {  # what this run paid: the estimate prices the calls it will make
        "calls": s["judge"]["calls"],
        "input_tokens": s["tokens"]["paid_input_this_run"],
        "output_tokens": s["tokens"]["paid_output_this_run"],
        "cost_usd": (s["cost_usd"] or {}).get("paid_this_run"),
        "wall_s": run.get("wall_s"),
    }
    return {
        k: {"estimate": est.get(k), "actual": a, "ratio": _r(_ratio(a, est.get(k)))}
        for k, a in actual.items()
    }


def _share_of(part: int, whole: int) -> float | None:
    return share_figure(part / whole) if whole else None


def _ratio(num: Any, den: Any) -> float | None:
    return num / den if num is not None and den else None


def _r(value: Any) -> Any:
    """A figure rounded as shown (`round_figure`: 4 decimals, half up); NaN and inf become None;
    non-floats pass through."""
    if isinstance(value, float):
        return round_figure(value) if math.isfinite(value) else None
    return value


def write_summary(
    outdir: OutPath,
    summary: Mapping[str, Any],
    *,
    charts: bool = True,
    texts: TextLookup | None = None,
) -> None:
    """Write charts/*.png, summary.json, summary.md and summary.html, each atomically (temp
    file + replace, or one PUT each in an object store). `texts`: the query and item texts of
    the rows summary.html opens, when the output does not hold them (read from the input)."""
    outdir = out_path(outdir)
    charts = charts and charts_available()  # matplotlib is the `charts` extra
    pngs = render_charts(summary) if charts else {}
    for name, data in pngs.items():
        atomic_write_bytes(layout.chart(outdir, name), data)
    if (trend := trend_chart(summary.get("trend")) if charts else None) is not None:
        pngs[TREND_CHART] = trend
        atomic_write_bytes(layout.chart(outdir, TREND_CHART), trend)
    for stale in {*CHART_FILES, TREND_CHART} - set(pngs):  # a chart that no longer applies goes
        layout.chart(outdir, stale).unlink(missing_ok=True)
    text = json.dumps(summary, indent=2, ensure_ascii=False, default=str) + "\n"
    atomic_write_bytes(layout.summary_json(outdir), text.encode())
    atomic_write_bytes(layout.summary_md(outdir), render_markdown(summary, charts=charts).encode())
    kept = KeptTexts(outdir, texts)  # the texts of the rows it opens, kept for the next time
    page = render_html(summary, _html_rows(outdir, summary, kept))
    atomic_write_bytes(layout.summary_html(outdir), page.encode())
    kept.save()


def _html_rows(
    outdir: OutPath, summary: Mapping[str, Any], texts: TextLookup | None
) -> dict[str, list[dict[str, Any]]]:
    """The rows summary.html opens (the worst, the failed, a sample), read lazily."""
    try:
        manifest = json.loads(layout.manifest(outdir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}
    names = text_columns(manifest.get("describe") or {})
    group_by = (summary.get("by_group") or {}).get("column")
    with local_copies(part_files(outdir), outdir) as local:
        return report_rows(local, group_by=group_by, texts=texts, names=names)


def render_markdown(summary: Mapping[str, Any], *, charts: bool = True) -> str:
    """summary.md: what the run did, then scores, bands, positions, judge and cost, extras."""
    pictures = planned_charts(summary) if charts else []

    def img(name: str) -> list[str]:
        return [f"![{CHART_FILES[name]}](charts/{name})", ""] if name in pictures else []

    positions = [
        [f"#{p['position']}", p["items"], _share(p.get("relevant"), p["items"], p["relevant_rate"])]
        for p in summary["relevance_by_position"][:30]
    ]
    lines = [*_md_intro(summary), *_md_score(summary), *img("score_distribution.png")]
    if not charts:
        lines += _md_distribution(summary)
    lines += _md_table("Relevance by position", ["position", "items", "relevant rate"], positions)
    lines += img("relevance_by_position.png")
    lines += _md_table(
        "Rank metrics (mean)", ["metric", "mean"], [*summary["rank_metrics"].items()]
    )
    lines += _md_table("Judge and cost", ["figure", "value"], judge_rows(summary))
    lines += _md_history(summary)
    lines += [*_md_extras(summary), *img("scores_by_group.png")]
    lines += trend_markdown(summary.get("trend"), chart=charts)
    return "\n".join(lines).rstrip() + "\n"


def _md_intro(s: Mapping[str, Any]) -> list[str]:
    run, rows = s["run"], s["rows"]
    causes = ", ".join(f"{md_text(c)}: {n:,}" for c, n in s["failures"].items())
    failed = f"**{rows['failed']:,}** failed" + (f" ({causes})" if causes else "")
    source = md_code(run["input"]) if run.get("input") else "the input"
    judge = f" by {md_code(s['judge']['model'])}" if s["judge"]["model"] else ""
    this_run = _md_this_run(s)
    lines = [
        "# ctxprec run summary",
        "",
        f"The output holds **{rows['total']:,}** rows {_origin(run, source)}{judge}: "
        f"**{rows['ok']:,}** ok, **{rows['empty_context']:,}** with an empty context, {failed}. "
        f"Coverage: {_share(rows['ok'] + rows['empty_context'], rows['total'], s['coverage'])}."
        + (this_run if s["wall_s"] is not None else ""),
        "",
    ]
    for notice in run.get("notices") or []:
        lines += [f"> **{md_text(notice)}**", ""]
    for rows_failed, causes, advice in failure_groups(s["failures"]):
        lines += [f"> **{rows_failed} ({causes}) — {advice}.**", ""]
    for estimate in s.get("estimates") or ([s["estimate"]] if s.get("estimate") else []):
        lines += _md_estimate(estimate)
    if said := audit_lines(s.get("audit")):
        lines += [f"**Audit judge**: {said[0].removeprefix('audit: ')}; {said[1]}.", ""]
    return lines


def _md_estimate(estimate: Mapping[str, Any] | None) -> list[str]:
    """The corrected estimate in words, and per group (docs/estimates.md says how to read it)."""
    sentence = estimate_sentence(estimate)
    if estimate is None or sentence is None:
        return []
    ref = str(estimate.get("reference", "labels"))
    said = "human labels" if ref == "labels" else f"the audit judge {ref.removeprefix('audit:')}"
    said = md_text(said)
    lines = [f"**Corrected estimate** (prediction-powered, reference: {said}): {sentence}.",
             ""]  # fmt: skip
    groups = (estimate.get("by_group") or {}).get("groups") or {}
    if groups:
        rows = [
            [name, g["n_reference"], g["n_rows"], figure_text(g["judge_mean"]),
             figure_text(g["mean"]), _ci_text(g.get("ci95"))]
            for name, g in groups.items()
        ]  # fmt: skip
        which = "labelled rows" if ref == "labels" else "audited rows"
        head = ["group", which, "rows", "judge mean", "corrected", "95 % CI"]
        lines += _md_table(f"Corrected estimate by group ({said})", head, rows)
    return lines


def _ci_text(ci: Sequence[float] | None) -> str:
    return (
        "— (fewer than 10 labelled rows)"
        if ci is None
        else (f"{figure_text(ci[0])}–{figure_text(ci[1])}")
    )


def _md_this_run(s: Mapping[str, Any]) -> str:
    """The last run apart from the output's history: a run that found nothing new to score
    says so, and the totals of every run stay in view."""
    run, tp, total = s["run"], s["throughput"], (s.get("history") or {}).get("total")
    if not run.get("rows_this_run") and s["rows"]["total"]:
        text = (
            f" The last run found nothing new to score: every row was already in the output "
            f"({seconds(s['wall_s'])})."
        )
    else:
        text = (
            f" The last run handled {_fmt(run.get('rows_this_run'))} rows in "
            f"{seconds(s['wall_s'])} ({rate(tp['calls_per_s'])} judge calls/s, "
            f"{rate(tp['rows_per_s'])} rows/s)."
        )
    if total and total["runs"] > 1:
        cost = total["paid_cost_usd"]
        text += (
            f" {total['runs']} runs wrote it: {_fmt(total['rows_this_run'])} rows scored, "
            f"{_fmt(total['judge_calls'])} judge calls, {seconds(total['wall_s'])} in all"
            + ("" if cost is None else f", {_fmt(cost)} USD paid")
            + " (see Runs)."
        )
    return text


def _md_history(s: Mapping[str, Any]) -> list[str]:
    """## Runs: one line per run that wrote the output, and the totals."""
    history = s.get("history")
    if not history or len(history["runs"]) < 2:
        return []
    head = ["run", "finished (UTC)", "rows scored", "judge calls", "memo hits",
            "tokens paid in / out", "paid USD", "wall time", "rows/s"]  # fmt: skip

    def line(label: Any, r: Mapping[str, Any], when: str) -> list[Any]:
        tokens = f"{_fmt(r['paid_input_tokens'])} / {_fmt(r['paid_output_tokens'])}"
        return [label, when, r["rows_this_run"], r["judge_calls"], r["memo_hits"], tokens,
                r["paid_cost_usd"], seconds(r["wall_s"]), rate(r.get("rows_per_s"))]  # fmt: skip

    rows = [
        line(i, r, str(r["finished_at"] or "—")[:19].replace("T", " "))
        for i, r in enumerate(history["runs"], 1)
    ]
    rows.append(line("all", history["total"], ""))
    return _md_table("Runs", head, rows)


def _origin(run: Mapping[str, Any], source: str) -> str:
    """Where the rows came from: an incremental run added only some of them."""
    if not run.get("incremental"):
        return f"scored from {source}"
    added = run.get("rows_this_run")
    return f"(this run added {_fmt(added)} of them, scored from {source})"


def _md_score(s: Mapping[str, Any]) -> list[str]:
    stats, scale = s["score"], s["scale"]
    out = _md_table(f"Score (0 to {scale:g})", [*stats], [[*stats.values()]])
    if ci := s.get("score_ci95"):
        out += [f"Mean {_fmt(stats['mean'])}, 95 % CI {_ci_text([ci['low'], ci['high']])} "
                f"({ci['method']}, {ci['n']:,} rows).", ""]  # fmt: skip
    text = {b: (span, meaning) for b, _, _, span, meaning in BANDS}
    scored = s["rows"]["ok"] + s["rows"]["empty_context"]
    rows = [
        [b["band"], *text[b["band"]], b["rows"], _share(b["rows"], scored, b["share"])]
        for b in s["bands"]
    ]
    head = ["band", "score" if scale == 1 else f"score / {scale:g}", "meaning", "rows", "share"]
    return out + _md_table("Score bands", head, rows)


_BAR = 30  # characters of the longest bar of the text histogram


def _md_distribution(s: Mapping[str, Any]) -> list[str]:
    """The score distribution as a text picture, for a summary written without charts/*.png:
    the rows scored exactly 0 (band "none"), then the (0, scale] bins of `score_histogram`."""
    hist = s["score_histogram"]
    values = [hist["zero"], *hist["counts"]]
    if not sum(values):
        return []
    edges = hist["edges"]
    labels = ["0 (none)", *(f"({lo:g}, {hi:g}]" for lo, hi in itertools.pairwise(edges))]
    width, top = max(map(len, labels)), max(values)
    bars = [f"{label:<{width}} {'█' * round(_BAR * n / top):<{_BAR}} {n:,}".rstrip()
            for label, n in zip(labels, values, strict=True)]  # fmt: skip
    note = "Charts: `ctxprec summary OUTDIR` draws them (charts/*.png), as `score --charts` does."
    if not charts_available():
        note = f"Charts: `ctxprec summary OUTDIR` draws them once matplotlib is ({CHARTS_INSTALL})."
    return ["## Score distribution (rows)", "", "```text", *bars, "```", "", note, ""]


def _md_extras(s: Mapping[str, Any]) -> list[str]:
    """Failures by cause, estimate vs actual, label agreement and groups, when present."""
    out = _md_table("Failures by cause", ["cause", "rows"], [*s["failures"].items()])
    if est := s["estimate_vs_actual"]:
        rows = [[k, v["estimate"], v["actual"], v["ratio"]] for k, v in est.items()]
        out += _md_table("Estimate vs actual", ["figure", "estimate", "actual", "ratio"], rows)
    if b := s.get("batch_api"):
        keys = ("provider", "lines_sent", "rounds", "items_failed", "took_s", "input_tokens",
                "output_tokens", "cost_usd", "online_cost_usd", "saving_usd")  # fmt: skip
        rows = [[k.replace("_", " "), b.get(k)] for k in keys if k in b]
        rows.append(["batch ids", ", ".join(b.get("batch_ids") or []) or None])
        if isinstance(a := b.get("audit"), dict):  # --audit-model: the audit judge's batches
            rows += [[f"audit judge {k.replace('_', ' ')}", a.get(k)] for k in keys if k in a]
            rows.append(["audit judge batch ids", ", ".join(a.get("batch_ids") or []) or None])
        out += _md_table("Provider batch API", ["figure", "value"], rows)
    if labels := s["labels"]:
        out += _md_table("Agreement with human labels", ["figure", "value"], [*labels.items()])
    if again := s.get("self_agreement"):  # --recheck
        wanted = ("fraction", "items", "flips", "flip_rate", "agreement", "cohen_kappa",
                  "kappa_ci95", "failed", "input_tokens", "output_tokens", "cost_usd")  # fmt: skip
        ci = again.get("kappa_ci95")
        shown = {**again, "kappa_ci95": f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else None}
        rows = [[k.replace("_", " "), shown.get(k)] for k in wanted]
        out += _md_table("Judge against itself (--recheck)", ["figure", "value"], rows)
    if g := s["by_group"]:
        out += _group_md(g)
    return out


def _group_md(g: Mapping[str, Any]) -> list[str]:
    """The --group-by table, lowest mean score first: every group when they are few, else the
    lowest and the highest few with how many are left out (the groups summary.json lists are
    the largest)."""
    head = ["group", "rows", "failed", "mean score", "median"]
    total, groups = g.get("groups_total") or 0, g.get("groups") or []
    worst, best = g.get("worst"), g.get("best")
    if not groups:
        return [f"## By {md_text(g['column'])}", "", md_text(g.get("note") or "no rows"), ""]
    if worst is None or best is None or total <= len(worst) + len(best):
        shown = sorted(groups, key=_mean_first)  # every group (summary.json lists them all)
        lines = _md_table(f"By {g['column']}", head, [_group_row(x) for x in shown])
        extra = (
            []
            if total <= len(groups)
            else [f"{total - len(groups):,} more groups are left out.", ""]
        )
        return [*lines[:2], "Lowest mean score first.", "", *lines[2:], *extra]
    rows = [*map(_group_row, worst), ["…", "", "", "", ""], *map(_group_row, best)]
    lines = _md_table(f"By {g['column']}", head, rows)
    left = total - len(worst) - len(best)
    said = (
        f"{total:,} groups: the {len(worst)} with the lowest mean score, then the {len(best)} "
        f"with the highest; {left:,} of {total:,} are left out here (summary.json lists the "
        f"{len(groups):,} largest)."
    )
    return [*lines[:2], said, "", *lines[2:]]


def _mean_first(group: Mapping[str, Any]) -> tuple[bool, float, int, str]:
    mean = group.get("mean_score")
    return (mean is None, mean or 0.0, -(group.get("rows") or 0), str(group.get("group")))


def _group_row(x: Mapping[str, Any]) -> list[Any]:
    return [x["group"], x["rows"], x["failed"], x["mean_score"], x["median"]]


def _md_table(title: str, head: list[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A titled table; every title, heading and cell is shown as the text it holds (md_text):
    group values, causes, model names and batch ids come from the data."""
    if not rows:
        return []
    lines = [f"## {md_text(title)}", "", "| " + " | ".join(map(md_text, head)) + " |"]
    lines.append("|" + " --- |" * len(head))
    return [*lines, *("| " + " | ".join(md_text(_fmt(c)) for c in r) + " |" for r in rows), ""]


def _fmt(value: Any) -> str:
    return figure_text(value)


def _pct(value: float | None) -> str:
    return percent_text(value)


def _share(part: int | None, whole: int, stored: float | None) -> str:
    """A share as a percentage, rounded once from its counts (6 of 11 reads 54.5 %, where
    percent_text of the stored 0.5455 would round a second time to 54.6 %); the stored figure
    when the counts are not there (a summary.json written before they were)."""
    if part is None or not whole:
        return _pct(stored)
    return percent_text(part / whole)
