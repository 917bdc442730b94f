"""Pictures of a run summary: score distribution with the score bands, relevance rate by
position, scores by group. Drawn from the summary dict alone, on matplotlib's Agg canvas.
Also the layout helpers every chart uses (here, trend.py, compare_report.py): long labels cut in
the middle, titles wrapped to the figure, labels that would overlap dropped.
"""

from __future__ import annotations

import importlib.util
import io
import math
import textwrap
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ctxprec.storage.core.printable import visible

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Text

__all__ = [
    "BAND_COLORS",
    "CHARTS_INSTALL",
    "chart_figures",
    "charts_available",
    "declutter",
    "fit_title",
    "planned_charts",
    "png",
    "preload",
    "render_charts",
    "short_label",
    "thin_ticks",
]

BAND_COLORS: dict[str, str] = {
    "excellent": "#1a9850",
    "good": "#91cf60",
    "medium": "#fee08b",
    "low": "#fc8d59",
    "none": "#d73027",
}
_SIZE = (8.0, 4.5)  # inches at 100 dpi: 800 x 450 px
_INK = "#333333"
_MAX_POSITIONS = 50
_MAX_GROUPS = 20
_MAX_LABEL = 32  # characters of a group label on an axis (cut in the middle beyond)
_TITLE_CHARS = 80  # characters per title line at the default size on an 8-inch figure
_MAX_TICK_LABELS = 16  # x tick labels shown at most (every k-th beyond)


def short_label(text: str, limit: int = _MAX_LABEL) -> str:
    """`text` cut in the middle to at most `limit` characters: both ends stay readable;
    control and bidi characters (a group value's) shown as escapes."""
    text = visible(text)
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2 + (limit - 1) % 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


def fit_title(fig: Figure, text: str, width: int = _TITLE_CHARS) -> None:
    """The figure's title, centred on the figure and wrapped so that no line is cut."""
    fig.suptitle(textwrap.fill(text, width, break_long_words=True))


def thin_ticks(count: int, most: int = _MAX_TICK_LABELS) -> int:
    """The step between labelled ticks so that at most `most` of `count` are labelled."""
    return max(1, math.ceil(count / most))


def declutter(fig: Figure, texts: Iterable[Text]) -> None:
    """Hide each text that would overlap one kept before it (in the given order of priority)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()  # type: ignore[no-untyped-call]
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]
    kept: list[Any] = []
    for text in texts:
        if not text.get_visible() or not text.get_text().strip():
            continue
        box = text.get_window_extent(renderer).expanded(1.05, 1.0)
        if any(box.overlaps(other) for other in kept):
            text.set_visible(False)
        else:
            kept.append(box)


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


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


CHARTS_INSTALL = "pip install 'ctxprec[charts]'"  # matplotlib: charts are opt-in


def charts_available() -> bool:
    """Whether matplotlib can be imported (found, not imported: that costs ~0.3 s)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def _import_plotting() -> None:
    import matplotlib.backends.backend_agg
    import matplotlib.figure
    import matplotlib.ticker  # noqa: F401


def preload() -> None:
    """Import matplotlib in a background thread while a run waits on its judge, so the
    summary at the end does not pay for it (a few hundred ms per run)."""
    if not charts_available():
        return
    threading.Thread(target=_import_plotting, name="ctxprec-preload", daemon=True).start()


def chart_figures(summary: Mapping[str, Any]) -> dict[str, Figure]:
    """The figure of each planned chart, keyed by file name. Leaves pyplot's state alone."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    out: dict[str, Figure] = {}
    for name in planned_charts(summary):
        fig = Figure(figsize=_SIZE, dpi=100, layout="constrained")
        if name == "score_distribution.png":
            _score_distribution(fig, summary)
        elif name == "relevance_by_position.png":
            ax = fig.add_subplot()
            _relevance_by_position(ax, summary)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            fit_title(fig, "Share of context items judged relevant, by position")
        else:
            ax = fig.add_subplot()
            _scores_by_group(ax, summary)
            fit_title(fig, f"Score by {short_label(summary['by_group']['column'], 60)}")
            declutter(fig, _ordered_labels(ax))
        out[name] = fig
    return out


def render_charts(summary: Mapping[str, Any]) -> dict[str, bytes]:
    """PNG bytes of each planned chart, keyed by file name."""
    return {name: png(fig) for name, fig in chart_figures(summary).items()}


def _ordered_labels(ax: Axes) -> list[Text]:
    """The band names on the top axis, widest band first: the narrow ones give way."""
    tops = [child for child in ax.child_axes if getattr(child, "_ctxprec_bands", False)]
    labels = [t for top in tops for t in top.get_xticklabels()]
    widths = [w for top in tops for w in getattr(top, "_ctxprec_widths", [])]
    return [t for _, t in sorted(zip(widths, labels, strict=False), key=lambda p: -p[0])]


def _shade_bands(ax: Axes, summary: Mapping[str, Any]) -> None:
    """Tint the score axis with the score bands and name each one above the plot, on a top
    axis of its own (names never sit on the data; `declutter` drops a name with no room)."""
    span = _span(summary)
    centres, names, widths = [], [], []
    for band in summary["bands"]:
        lo, hi = band["lower"] * span, band["upper"] * span
        if hi > lo:
            ax.axvspan(lo, hi, color=BAND_COLORS[band["band"]], alpha=0.18, lw=0, zorder=0)
            centres.append((lo + hi) / 2)
            names.append(band["band"])
            widths.append(hi - lo)
    top = ax.secondary_xaxis("top")
    top.set_xticks(centres, names)
    top.tick_params(length=0, labelsize=9, labelcolor=_INK)
    top._ctxprec_bands = True  # type: ignore[attr-defined]
    top._ctxprec_widths = widths  # type: ignore[attr-defined]


def _score_distribution(fig: Figure, summary: Mapping[str, Any]) -> None:
    """Histogram over (0, scale] in band colours; the exact zeros (band "none") as their own
    bar in a narrow panel on the left, at 0, sharing the row axis."""
    from matplotlib.ticker import MaxNLocator, StrMethodFormatter

    hist, span = summary["score_histogram"], _span(summary)
    edges, counts, zero = hist["edges"], hist["counts"], hist["zero"]
    left, ax = fig.subplots(1, 2, sharey=True, width_ratios=[1, 9])
    width = edges[1] - edges[0]
    _shade_bands(ax, summary)
    colors = [BAND_COLORS[_band_of(summary, lo / span)] for lo in edges[:-1]]
    ax.bar(edges[:-1], counts, width=width, align="edge", color=colors, edgecolor="white")
    ax.set_xlim(0, edges[-1])
    ax.set_xlabel(f"context precision score, above 0 (to {edges[-1]:g})")
    left.bar([0], [zero], width=0.6, color=BAND_COLORS["none"])
    left.set_xlim(-0.5, 0.5)
    left.set_xticks([0], ["0"])
    left.secondary_xaxis("top").set_xticks([0], ["none"])
    left.child_axes[-1].tick_params(length=0, labelsize=9, labelcolor=_INK)
    left.set_xlabel("exactly 0")
    left.set_ylabel("rows")
    left.set_ylim(0, max([*counts, zero, 1]) * 1.05)
    left.yaxis.set_major_locator(MaxNLocator(integer=True))
    left.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.tick_params(labelleft=False)
    scored = summary["rows"]["ok"] + summary["rows"]["empty_context"]
    fit_title(fig, f"Score distribution ({scored:,} scored rows)")
    declutter(fig, _ordered_labels(ax))


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
    ax.set_xticks(positions[:: thin_ticks(len(positions), 20)])
    ax.set_xlabel("position in the retrieved list (1 = first)")
    ax.set_ylabel("judged relevant")


def _scores_by_group(ax: Axes, summary: Mapping[str, Any]) -> None:
    """One box per group (largest groups first, top to bottom) over the band-tinted axis."""
    column = summary["by_group"]["column"]
    groups = _groups_with_scores(summary)[:_MAX_GROUPS][::-1]
    stats = [
        {
            "label": f"{short_label(str(g['group']))} (n={g['rows']:,})",
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
        patch_artist=True,
        boxprops={"facecolor": "white", "alpha": 0.85},
        medianprops={"color": _INK, "lw": 2},
        meanprops={"marker": "o", "markerfacecolor": "#4575b4", "markeredgecolor": "white"},
    )
    _shade_bands(ax, summary)  # after the boxes: a fake axes in a test still sees them
    ax.set_xlim(0, _span(summary))
    ax.set_xlabel("context precision score")
    key = "box: p25 to p75   bar: median   dot: mean   whiskers: p10 to p90"
    ax.get_figure().supxlabel(key, fontsize=9, color=_INK)  # type: ignore[union-attr]
    ax.set_ylabel(short_label(column))


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
