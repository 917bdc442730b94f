"""Nights over time: for an output partitioned by a date-like column, one row per night (rows,
mean score with its 95% CI, P@1, coverage, tokens and cost paid and of the verdicts) and which
nights moved beyond the CI of the night before. Part of the summary (JSON, Markdown,
charts/trend.png, terminal).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from ctxprec.storage.core.constants import STATUS_EMPTY, STATUS_FAILED, STATUS_OK
from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.core.figures import figure_text, percent_text, round_figure
from ctxprec.storage.files.layout import TREND_CHART
from ctxprec.storage.files.objpath import OutPath, local_copies, out_path
from ctxprec.storage.outdir.dataset import scan_parts
from ctxprec.storage.outdir.ownership import part_files, read_manifest
from ctxprec.storage.outdir.schema import token_columns
from ctxprec.storage.report.charts import fit_title, png, short_label, thin_ticks
from ctxprec.storage.report.mdtext import md_text

__all__ = [
    "night_trend",
    "trend_chart",
    "trend_figure",
    "trend_markdown",
    "trend_rows",
    "trend_text",
]

_Z95 = 1.959964
_DATE_NAMES = ("dt", "date", "day", "ds", "night")


def _partition_by(outdir: OutPath) -> list[str]:
    try:
        manifest = read_manifest(outdir) or {}
    except OutputError:
        return []
    return [str(c) for c in manifest.get("describe", {}).get("partition_by") or []]


def _date_column(lf: pl.LazyFrame, candidates: Sequence[str]) -> str | None:
    """The first partition column whose values all read as dates (or named like one)."""
    for column in candidates:
        values = lf.select(pl.col(column).cast(pl.String).unique()).collect().to_series()
        values = values.drop_nulls()
        parsed = values.str.to_date(strict=False)
        if values.len() and (parsed.null_count() == 0 or column.lower() in _DATE_NAMES):
            return column
    return None


def night_trend(
    outdir: OutPath, run: Mapping[str, Any], files: Sequence[Path] | None = None
) -> dict[str, Any] | None:
    """Per-night figures, oldest first; None when the output is not partitioned by a date.
    `files`: local copies of the part files when the caller has them (object stores)."""
    outdir = out_path(outdir)
    if files is None:
        with local_copies(part_files(outdir), outdir) as local:
            return night_trend(outdir, run, local)
    candidates = _partition_by(outdir)
    if not candidates or not files:
        return None
    lf = scan_parts(list(files))
    cols = set(lf.collect_schema().names())
    column = _date_column(lf, [c for c in candidates if c in cols])
    if column is None:
        return None
    nights = _per_night(lf, column, cols)
    price = run.get("price") or {}
    for night in nights:
        night["paid_cost_usd"] = _cost(
            price, night["paid_input_tokens"], night["paid_output_tokens"]
        )
        night["verdict_cost_usd"] = _cost(
            price, night["verdict_input_tokens"], night["verdict_output_tokens"]
        )
    _mark_moves(nights)
    return {
        "column": column,
        "ci": "normal approximation: mean ± 1.96 × sd / √n over the night's scored rows",
        "judge_calls": "not recorded per row: items judged and tokens are shown instead",
        "nights": nights,
    }


def _per_night(lf: pl.LazyFrame, column: str, cols: set[str]) -> list[dict[str, Any]]:
    status, score = pl.col("status"), pl.col("score")
    p1 = pl.col("precision_at_1").mean() if "precision_at_1" in cols else pl.lit(None)
    got = (
        lf.group_by(pl.col(column).cast(pl.String).alias("night"))
        .agg(
            pl.len().alias("rows"),
            status.is_in([STATUS_OK, STATUS_EMPTY]).sum().alias("scored"),
            (status == STATUS_FAILED).sum().alias("failed"),
            score.mean().alias("mean_score"),
            score.std().alias("std"),
            score.is_not_null().sum().alias("n"),
            p1.cast(pl.Float64).alias("p_at_1"),
            pl.col("context_count").filter(status != STATUS_EMPTY).sum().alias("items"),
            *(t.sum() for t in token_columns(cols)),
        )
        .sort("night", nulls_last=True)
        .collect()
    )
    nights = []
    known = "paid_input_tokens" in cols  # schema 1: what the rows' runs paid is unknown
    for r in got.iter_rows(named=True):
        if not known:
            r["paid_input_tokens"] = r["paid_output_tokens"] = None
        std, n, mean = r.pop("std"), r.pop("n"), r["mean_score"]
        half = _Z95 * std / math.sqrt(n) if std is not None and n > 1 else 0.0
        scored = r.pop("scored")
        r["ci95"] = None if mean is None else [mean - half, mean + half]
        r["coverage"] = scored / r["rows"] if r["rows"] else None
        nights.append(r)
    return nights


def _cost(price: Mapping[str, Any], t_in: Any, t_out: Any) -> float | None:
    p_in, p_out = price.get("input_per_mtok"), price.get("output_per_mtok")
    if p_in is None or p_out is None or t_in is None or t_out is None:
        return None
    return round_figure(float(t_in * p_in + t_out * p_out) / 1e6)


def _mark_moves(nights: list[dict[str, Any]]) -> None:
    """`moved`: "up" / "down" when a night's mean is outside the previous night's CI."""
    previous: dict[str, Any] | None = None
    for night in nights:
        night["moved"] = None
        mean, ci = night["mean_score"], (previous or {}).get("ci95")
        if mean is not None and ci is not None:
            night["moved"] = "up" if mean > ci[1] else "down" if mean < ci[0] else None
        if mean is not None:
            previous = night


def _f(value: Any, digits: int = 4) -> str:
    return figure_text(value, digits, missing="n/a")


def trend_rows(trend: Mapping[str, Any]) -> list[list[str]]:
    out = []
    for n in trend["nights"]:
        ci = n["ci95"]
        moved = {"up": "▲ up", "down": "▼ down"}.get(n["moved"] or "", "")
        out.append([
            str(n["night"]), _f(n["rows"]), _f(n["mean_score"]),
            "n/a" if ci is None else f"[{_f(ci[0])}, {_f(ci[1])}]", _f(n["p_at_1"]),
            "n/a" if n["coverage"] is None else percent_text(n["coverage"]), _f(n["items"]),
            f"{_f(n['paid_input_tokens'])} / {_f(n['paid_output_tokens'])}",
            _f(n["paid_cost_usd"]),
            f"{_f(n['verdict_input_tokens'])} / {_f(n['verdict_output_tokens'])}",
            _f(n["verdict_cost_usd"]), moved,
        ])  # fmt: skip
    return out


# tokens and cost twice: what was paid for the night's rows (by the runs that wrote them), and
# what their verdicts cost when first paid (a night judged from the memo paid nothing)
_HEAD = ["night", "rows", "mean score", "95% CI", "P@1", "coverage", "items judged",
         "tokens paid in / out", "paid USD", "verdicts' tokens in / out", "verdicts' USD",
         "moved"]  # fmt: skip


def trend_markdown(trend: Mapping[str, Any] | None, *, chart: bool = True) -> list[str]:
    """The summary.md section: one table row per night and the chart."""
    if not trend or not trend["nights"]:
        return []
    lines = [f"## Nights by {md_text(trend['column'])}", "", "| " + " | ".join(_HEAD) + " |"]
    lines += [
        "|" + " --- |" * len(_HEAD),
        *("| " + " | ".join(map(md_text, r)) + " |" for r in trend_rows(trend)),
    ]
    lines += [
        "",
        md_text(
            f"Moved: the night's mean is outside the previous night's 95% CI ({trend['ci']}). "
            f"Judge calls per night: n/a ({trend['judge_calls']})."
        ),
        "",
    ]
    return lines + ([f"![nights]({'charts/' + TREND_CHART})", ""] if chart else [])


def trend_text(trend: Mapping[str, Any] | None) -> str:
    """The same table for the terminal (`ctxprec summary`)."""
    if not trend or not trend["nights"]:
        return ""
    rows = [_HEAD, *trend_rows(trend)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEAD))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return f"  nights by {trend['column']}:\n" + "\n".join("    " + line for line in lines)


def trend_chart(trend: Mapping[str, Any] | None) -> bytes | None:
    """Mean score per night with its CI band; nights that moved are marked."""
    fig = trend_figure(trend)
    return None if fig is None else png(fig)


def trend_figure(trend: Mapping[str, Any] | None) -> Any:
    """The matplotlib figure of `trend_chart` (None when no night has a mean)."""
    if not trend or not [n for n in trend["nights"] if n["mean_score"] is not None]:
        return None
    from matplotlib.figure import Figure

    nights = [n for n in trend["nights"] if n["mean_score"] is not None]
    xs = list(range(len(nights)))
    means = [n["mean_score"] for n in nights]
    fig = Figure(figsize=(8.0, 4.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.fill_between(xs, [n["ci95"][0] for n in nights], [n["ci95"][1] for n in nights],
                    color="#4575b4", alpha=0.2, lw=0, label="95% CI")  # fmt: skip
    ax.plot(xs, means, marker="o", color="#4575b4", label="mean score")
    for x, n in zip(xs, nights, strict=True):
        if n["moved"]:
            color = "#1a9850" if n["moved"] == "up" else "#d73027"
            ax.scatter([x], [n["mean_score"]], s=120, facecolors="none", edgecolors=color, lw=2)
    step = thin_ticks(len(xs), 10)  # at most 10 dates (slanted): every k-th night beyond
    ax.set_xticks(xs[::step], [str(n["night"]) for n in nights][::step], rotation=45, ha="right")
    ax.set_xlim(-0.5, len(xs) - 0.5)
    fit_title(fig, f"Mean score by {short_label(trend['column'], 60)} "
                   "(circled: moved beyond the previous night's CI)")  # fmt: skip
    ax.set_ylabel("mean score")
    ax.legend(loc="best")
    return fig
