"""Pictures of a run summary: score distribution with the seed's bands, relevance rate by
position, scores by group. Drawn from the summary dict alone (matplotlib's Agg canvas, no pyplot).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["BAND_COLORS", "CHART_FILES", "planned_charts", "render_charts"]

BAND_COLORS: dict[str, str] = {
    "excellent": "#1a9850",
    "good": "#91cf60",
    "medium": "#fee08b",
    "low": "#fc8d59",
    "none": "#d73027",
}
CHART_FILES: dict[str, str] = {
    "score_distribution.png": "score distribution",
    "relevance_by_position.png": "relevance by position",
    "scores_by_group.png": "scores by group",
}
_SIZE = (8.0, 4.5)  # inches at 100 dpi: 800 x 450 px
_MAX_POSITIONS = 50
_MAX_GROUPS = 20


def planned_charts(summary: Mapping[str, Any]) -> list[str]:
    """File names of the charts this summary has data for (none when no row was scored)."""
    scored = summary["rows"]["ok"] + summary["rows"]["empty_context"]
    if not scored:
        return []
    names = ["score_distribution.png"]
    if summary.get("relevance_by_position"):
        names.append("relevance_by_position.png")
    if _groups_with_scores(summary):
        names.append("scores_by_group.png")
    return names


def render_charts(summary: Mapping[str, Any]) -> dict[str, bytes]:
    """PNG bytes of each planned chart, keyed by file name."""
    from matplotlib.figure import Figure

    draw = {
        "score_distribution.png": _score_distribution,
        "relevance_by_position.png": _relevance_by_position,
        "scores_by_group.png": _scores_by_group,
    }
    out: dict[str, bytes] = {}
    for name in planned_charts(summary):
        fig = Figure(figsize=_SIZE, dpi=100, layout="constrained")
        draw[name](fig, summary)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        out[name] = buf.getvalue()
    return out


def _shade_bands(ax: Axes, summary: Mapping[str, Any], *, vertical: bool) -> None:
    """Tint the score axis with the five bands and name each one."""
    scale = _span(summary)
    for band in summary["bands"]:
        lo, hi = band["lower"] * scale, band["upper"] * scale
        if hi <= lo:
            continue
        color = BAND_COLORS[band["band"]]
        if vertical:
            ax.axvspan(lo, hi, color=color, alpha=0.18, lw=0)
            ax.text(
                (lo + hi) / 2,
                0.98,
                band["band"],
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="top",
                fontsize=9,
                color="#333333",
            )
        else:
            ax.axhspan(lo, hi, color=color, alpha=0.18, lw=0)


def _score_distribution(fig: Figure, summary: Mapping[str, Any]) -> None:
    hist = summary["score_histogram"]
    edges, counts = hist["edges"], hist["counts"]
    ax = fig.add_subplot()
    _shade_bands(ax, summary, vertical=True)
    width = edges[1] - edges[0]
    colors = [BAND_COLORS[_band_of(summary, lo / _span(summary))] for lo in edges[:-1]]
    ax.bar(edges[:-1], counts, width=width, align="edge", color=colors, edgecolor="white")
    ax.bar(
        [-width / 2],
        [hist["zero"]],
        width=width / 2,
        align="edge",
        color=BAND_COLORS["none"],
        edgecolor="white",
        label="none (score = 0)",
    )
    ax.set_xlim(-width * 0.75, edges[-1])
    ax.set_ylim(0, max([*counts, hist["zero"], 1]) * 1.15)
    ax.set_title(
        f"Score distribution ({summary['rows']['ok'] + summary['rows']['empty_context']:,}"
        " scored rows)"
    )
    ax.set_xlabel(f"context precision score (0 to {edges[-1]:g})")
    ax.set_ylabel("rows")
    ax.legend(loc="upper left", frameon=False)


def _relevance_by_position(fig: Figure, summary: Mapping[str, Any]) -> None:
    rows = summary["relevance_by_position"][:_MAX_POSITIONS]
    ax = fig.add_subplot()
    positions = [r["position"] for r in rows]
    rates = [r["relevant_rate"] for r in rows]
    ax.bar(positions, rates, color="#4575b4", edgecolor="white")
    if len(rows) <= 20:
        for r in rows:
            ax.text(
                r["position"],
                r["relevant_rate"] + 0.02,
                f"n={r['items']:,}",
                ha="center",
                fontsize=8,
                color="#333333",
            )
    ax.set_ylim(0, 1.1)
    ax.set_xticks(positions if len(rows) <= 20 else positions[::5])
    ax.set_title("Share of context items judged relevant, by position")
    ax.set_xlabel("position in the retrieved list (0 = first)")
    ax.set_ylabel("relevant rate")


def _scores_by_group(fig: Figure, summary: Mapping[str, Any]) -> None:
    groups = _groups_with_scores(summary)[:_MAX_GROUPS][::-1]
    ax = fig.add_subplot()
    _shade_bands(ax, summary, vertical=True)
    stats = [
        {
            "label": str(g["group"]),
            "med": g["median"],
            "q1": g["p25"],
            "q3": g["p75"],
            "whislo": g["p10"],
            "whishi": g["p90"],
            "mean": g["mean_score"],
            "fliers": [],
        }
        for g in groups
    ]
    ax.bxp(
        stats,
        orientation="horizontal",
        showmeans=True,
        widths=0.6,
        medianprops={"color": "#222222"},
        meanprops={"markerfacecolor": "#4575b4"},
    )
    ax.set_xlim(0, _span(summary))
    ax.set_title(
        f"Score by {summary['by_group']['column']} "
        "(box p25-p75, line median, dot mean, whiskers p10-p90)",
        fontsize=10,
    )
    ax.set_xlabel("context precision score")
    ax.set_ylabel(summary["by_group"]["column"])


def _groups_with_scores(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    by_group = summary.get("by_group") or {}
    return [g for g in by_group.get("groups", []) if g["median"] is not None]


def _band_of(summary: Mapping[str, Any], normalized: float) -> str:
    for band in summary["bands"]:
        if band["lower"] <= normalized + 1e-9 and band["upper"] > band["lower"]:
            return str(band["band"])
    return "none"


def _span(summary: Mapping[str, Any]) -> float:
    scale = float(summary.get("scale", 1.0))
    return scale if scale > 0 else 1.0
