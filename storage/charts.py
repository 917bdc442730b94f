"""Pictures of a run summary: score distribution with the score bands, relevance rate by
position, scores by group. Drawn from the summary dict alone, on matplotlib's Agg canvas.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "BAND_COLORS",
    "CHART_FILES",
    "TREND_CHART",
    "planned_charts",
    "preload",
    "render_charts",
]

BAND_COLORS: dict[str, str] = {
    "excellent": "#1a9850",
    "good": "#91cf60",
    "medium": "#fee08b",
    "low": "#fc8d59",
    "none": "#d73027",
}
# file name -> alt text in summary.md
CHART_FILES: dict[str, str] = {
    "score_distribution.png": "score distribution",
    "relevance_by_position.png": "relevance by position",
    "scores_by_group.png": "scores by group",
}
TREND_CHART = "trend.png"  # the per-night chart (storage/trend.py)
_SIZE = (8.0, 4.5)  # inches at 100 dpi: 800 x 450 px
_INK = "#333333"
_MAX_POSITIONS = 50
_MAX_GROUPS = 20


def planned_charts(summary: Mapping[str, Any]) -> list[str]:
    """File names of the charts this summary has data for (none when no row was scored)."""
    if not summary["rows"]["ok"] + summary["rows"]["empty_context"]:
        return []
    names = ["score_distribution.png"]
    if summary["relevance_by_position"]:
        names.append("relevance_by_position.png")
    if _groups_with_scores(summary):
        names.append("scores_by_group.png")
    return names


def _import_plotting() -> None:
    import matplotlib.backends.backend_agg
    import matplotlib.figure
    import matplotlib.ticker  # noqa: F401


def preload() -> None:
    """Import matplotlib in a background thread while a run waits on its judge, so the
    summary at the end does not pay for it (a few hundred ms per run)."""
    threading.Thread(target=_import_plotting, name="ctxprec-preload", daemon=True).start()


def render_charts(summary: Mapping[str, Any]) -> dict[str, bytes]:
    """PNG bytes of each planned chart, keyed by file name. Leaves pyplot's state alone."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter, StrMethodFormatter

    out: dict[str, bytes] = {}
    for name in planned_charts(summary):
        fig = Figure(figsize=_SIZE, dpi=100, layout="constrained")
        ax = fig.add_subplot()
        if name == "score_distribution.png":
            _score_distribution(ax, summary)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        elif name == "relevance_by_position.png":
            _relevance_by_position(ax, summary)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        else:
            _scores_by_group(ax, summary)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        out[name] = buf.getvalue()
    return out


def _shade_bands(ax: Axes, summary: Mapping[str, Any]) -> None:
    """Tint the score axis with the score bands and name each one at the top."""
    span = _span(summary)
    for band in summary["bands"]:
        lo, hi = band["lower"] * span, band["upper"] * span
        if hi > lo:
            ax.axvspan(lo, hi, color=BAND_COLORS[band["band"]], alpha=0.18, lw=0)
            _label_top(ax, (lo + hi) / 2, band["band"])


def _label_top(ax: Axes, x: float, text: str) -> None:
    ax.text(x, 0.98, text, transform=ax.get_xaxis_transform(), ha="center", va="top", color=_INK)


def _score_distribution(ax: Axes, summary: Mapping[str, Any]) -> None:
    """Histogram over (0, scale] in band colours, with exact zeros as their own red bar."""
    hist, span = summary["score_histogram"], _span(summary)
    edges, counts, zero = hist["edges"], hist["counts"], hist["zero"]
    width = edges[1] - edges[0]
    _shade_bands(ax, summary)
    colors = [BAND_COLORS[_band_of(summary, lo / span)] for lo in edges[:-1]]
    ax.bar(edges[:-1], counts, width=width, align="edge", color=colors, edgecolor="white")
    ax.bar([-width], [zero], width=width * 0.8, color=BAND_COLORS["none"])  # the zeros, apart
    _label_top(ax, -width, "none")
    ax.set_xlim(-width * 1.8, edges[-1])
    ax.set_ylim(0, max([*counts, zero, 1]) * 1.15)
    scored = summary["rows"]["ok"] + summary["rows"]["empty_context"]
    ax.set_title(f"Score distribution ({scored:,} scored rows)")
    ax.set_xlabel(f"context precision score (0 to {edges[-1]:g})")
    ax.set_ylabel("rows")


def _relevance_by_position(ax: Axes, summary: Mapping[str, Any]) -> None:
    """Bars of relevant rate per position; item counts on top when there are few bars."""
    rows = summary["relevance_by_position"][:_MAX_POSITIONS]
    positions = [r["position"] for r in rows]
    ax.bar(positions, [r["relevant_rate"] for r in rows], color="#4575b4", edgecolor="white")
    if len(rows) <= 20:
        for r in rows:
            ax.text(
                r["position"],
                r["relevant_rate"] + 0.02,
                f"n={_compact(r['items'])}",
                ha="center",
                fontsize=8,
                color=_INK,
            )
    ax.set_ylim(0, 1.1)
    ax.set_xticks(positions if len(rows) <= 20 else positions[::5])
    ax.set_title("Share of context items judged relevant, by position")
    ax.set_xlabel("position in the retrieved list (1 = first)")
    ax.set_ylabel("judged relevant")


def _scores_by_group(ax: Axes, summary: Mapping[str, Any]) -> None:
    """One box per group (largest groups first, top to bottom) over the band-tinted axis."""
    column = summary["by_group"]["column"]
    groups = _groups_with_scores(summary)[:_MAX_GROUPS][::-1]
    stats = [
        {
            "label": f"{g['group']} (n={g['rows']:,})",
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
    _shade_bands(ax, summary)
    ax.bxp(
        stats,
        orientation="horizontal",
        showmeans=True,
        widths=0.6,
        patch_artist=True,
        boxprops={"facecolor": "white", "alpha": 0.85},
        medianprops={"color": _INK, "lw": 2},
        meanprops={"marker": "o", "markerfacecolor": "#4575b4", "markeredgecolor": "white"},
    )
    ax.set_xlim(0, _span(summary))
    ax.set_title(f"Score by {column} (box p25-p75, bar median, dot mean, whiskers p10-p90)")
    ax.set_xlabel("context precision score")
    ax.set_ylabel(column)


def _groups_with_scores(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = (summary.get("by_group") or {}).get("groups", [])
    return [g for g in groups if g["median"] is not None]


def _band_of(summary: Mapping[str, Any], normalized: float) -> str:
    """Band of a value of score / scale above zero (the bands are listed best first)."""
    for band in summary["bands"]:
        if band["upper"] > band["lower"] and normalized + 1e-9 >= band["lower"]:
            return str(band["band"])
    return "low"


def _span(summary: Mapping[str, Any]) -> float:
    scale = float(summary["scale"])
    return scale if scale > 0 else 1.0


def _compact(n: int) -> str:
    """1234 -> 1.2k, 1000000 -> 1M: short enough to sit on top of a bar."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}".removesuffix(".0") + suffix
    return str(n)
