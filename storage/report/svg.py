"""Inline SVG charts for the HTML reports, drawn from the summary (or comparison) dict alone:
no matplotlib, no script. Text stays text (<text>, <title>), colours come from the page's CSS
classes so light and dark both read, and every label passes through `html.escape`.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from ctxprec.storage.core.figures import figure_text, percent_text
from ctxprec.storage.core.printable import visible

__all__ = ["bars", "delta_chart", "distribution_chart", "position_chart", "trend_chart"]

_W, _H = 520, 220  # the viewBox; the page scales it to its width
_L, _R, _T, _B = 56, 8, 12, 40  # margins: axis labels left and below
_MAX_POSITIONS = 30


def _e(value: Any) -> str:
    return html.escape(visible(str(value)), quote=True)


def _svg(body: list[str], label: str, height: int = _H) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {_W} {height}" role="img" aria-label="{_e(label)}" '
        f'xmlns="http://www.w3.org/2000/svg">{"".join(body)}</svg>'
    )


def _text(x: float, y: float, text: Any, cls: str = "ax", anchor: str = "middle") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" class="{cls}" text-anchor="{anchor}">{_e(text)}</text>'


def _y_axis(top: float, label: str, ticks: Sequence[tuple[float, str]], height: int) -> list[str]:
    """Grid lines and labels at fractions of the plot height (0 at the bottom)."""
    plot = height - _T - _B
    out = []
    for frac, text in ticks:
        y = _T + plot * (1 - frac / top) if top else _T + plot
        out.append(f'<line x1="{_L}" x2="{_W - _R}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(_text(_L - 4, y + 4, text, "ax", "end"))
    out.append(
        f'<text class="ax" text-anchor="middle" transform="translate(13 {_T + plot / 2:.0f}) '
        f'rotate(-90)">{_e(label)}</text>'
    )
    return out


def _count_ticks(top: int) -> list[tuple[float, str]]:
    if top <= 0:
        return [(0, "0")]
    step = max(1, _nice(top / 4))
    return [(v, figure_text(v)) for v in range(0, top + 1, step)]


def _nice(x: float) -> int:
    for power in range(0, 12):
        for base in (1, 2, 5):
            if base * 10**power >= x:
                return int(base * 10**power)
    return int(x)


def bars(
    values: Sequence[float],
    classes: Sequence[str],
    titles: Sequence[str],
    labels: Sequence[str],
    *,
    top: float,
    y_label: str,
    ticks: Sequence[tuple[float, str]],
    x_label: str,
    aria: str,
) -> str:
    """A vertical bar chart: one bar per value, x labels thinned to fit, a title per bar."""
    plot_w, plot_h = _W - _L - _R, _H - _T - _B
    n = max(1, len(values))
    slot = plot_w / n
    body = _y_axis(top, y_label, ticks, _H)
    step = max(1, -(-n // 12))  # at most 12 x labels
    for i, (v, cls, title) in enumerate(zip(values, classes, titles, strict=True)):
        h = plot_h * (v / top) if top else 0.0
        x = _L + i * slot
        body.append(
            f'<rect x="{x + slot * 0.08:.1f}" y="{_T + plot_h - h:.1f}" width="{slot * 0.84:.1f}" '
            f'height="{max(h, 0):.1f}" class="{cls}"><title>{_e(title)}</title></rect>'
        )
        if i % step == 0:
            body.append(_text(x + slot / 2, _T + plot_h + 14, labels[i]))
    body.append(_text(_L + plot_w / 2, _H - 6, x_label))
    return _svg(body, aria)


def distribution_chart(summary: Mapping[str, Any], band_of: Any) -> str | None:
    """Rows per score bin in band colours: exact zeros (band "none") first, then the 20 bins."""
    hist = summary["score_histogram"]
    counts = [hist["zero"], *hist["counts"]]
    if not sum(counts):
        return None
    edges = hist["edges"]
    span = edges[-1] or 1.0
    classes = ["b-none", *(f"b-{band_of(lo / span)}" for lo in edges[:-1])]
    ranges = ["0", *(f"({figure_text(a)}, {figure_text(b)}]" for a, b in itertools.pairwise(edges))]
    titles = [f"score {r}: {figure_text(c)} rows" for r, c in zip(ranges, counts, strict=True)]
    labels = ["0", *(figure_text(hi) for hi in edges[1:])]
    top = max(counts)
    ticks = _count_ticks(top)
    return bars(
        counts,
        classes,
        titles,
        labels,
        top=max(top, ticks[-1][0]),
        y_label="rows",
        ticks=ticks,
        x_label="score (first bar: exactly 0)",
        aria="score distribution",
    )


def position_chart(positions: Sequence[Mapping[str, Any]]) -> str | None:
    """Share of items judged relevant at each position (1 = first retrieved)."""
    rows = list(positions)[:_MAX_POSITIONS]
    if not rows:
        return None
    rates = [float(r["relevant_rate"] or 0.0) for r in rows]
    titles = [
        f"position {r['position']}: {percent_text(r['relevant_rate'])} of "
        f"{figure_text(r['items'])} items relevant"
        for r in rows
    ]
    ticks = [(f, percent_text(f, 0)) for f in (0, 0.25, 0.5, 0.75, 1.0)]
    return bars(
        rates,
        ["pos"] * len(rows),
        titles,
        [str(r["position"]) for r in rows],
        top=1.0,
        y_label="judged relevant",
        ticks=ticks,
        x_label="position (1 = first retrieved)",
        aria="relevance by position",
    )


def trend_chart(nights: Sequence[Mapping[str, Any]], scale: float) -> str | None:
    """Mean score per night with its 95% CI as a band; nights that moved are ringed."""
    points = [n for n in nights if n.get("mean_score") is not None]
    if len(points) < 2:
        return None
    top = scale if scale > 0 else 1.0
    plot_w, plot_h = _W - _L - _R, _H - _T - _B
    slot = plot_w / len(points)

    def xy(i: int, v: float) -> tuple[float, float]:
        return _L + slot * (i + 0.5), _T + plot_h * (1 - min(max(v / top, 0.0), 1.0))

    ticks = [(top * f, figure_text(top * f)) for f in (0, 0.25, 0.5, 0.75, 1.0)]
    body = _y_axis(top, "mean score", ticks, _H)
    upper = [xy(i, n["ci95"][1]) for i, n in enumerate(points)]
    lower = [xy(i, n["ci95"][0]) for i, n in enumerate(points)][::-1]
    band = " ".join(f"{x:.1f},{y:.1f}" for x, y in [*upper, *lower])
    body.append(f'<polygon points="{band}" class="ci"/>')
    line = " ".join(
        f"{x:.1f},{y:.1f}" for x, y in (xy(i, n["mean_score"]) for i, n in enumerate(points))
    )
    body.append(f'<polyline points="{line}" class="line"/>')
    step = max(1, -(-len(points) // 6))
    for i, n in enumerate(points):
        x, y = xy(i, n["mean_score"])
        cls = {"up": "dot up", "down": "dot down"}.get(n.get("moved") or "", "dot")
        title = f"{n['night']}: mean {figure_text(n['mean_score'])}, {figure_text(n['rows'])} rows"
        body.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" class="{cls}">'
            f"<title>{_e(title)}</title></circle>"
        )
        if i % step == 0:
            body.append(_text(x, _T + plot_h + 14, n["night"]))
    body.append(
        _text(_L + plot_w / 2, _H - 6, "night (green / red: moved beyond the previous night's CI)")
    )
    return _svg(body, "mean score by night")


def delta_chart(items: Sequence[tuple[str, Mapping[str, Any]]]) -> str | None:
    """One row per metric or group: the mean change B − A as a dot, its 95% CI as a bar."""
    rows = [(n, m) for n, m in items if m.get("mean_delta") is not None and m.get("ci95")]
    if not rows:
        return None
    reach = max(max(abs(m["ci95"][0]), abs(m["ci95"][1]), abs(m["mean_delta"])) for _, m in rows)
    reach = reach or 1.0
    left, row_h = 170, 28
    height = _T + row_h * len(rows) + 46
    plot_w = _W - left - _R

    def x(v: float) -> float:
        return left + plot_w * (v + reach) / (2 * reach)

    body = [f'<line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="{_T}" y2="{height - 42}" class="zero"/>']
    for i, (name, m) in enumerate(rows):
        y = _T + row_h * i + row_h / 2
        lo, hi = m["ci95"]
        cls = "win" if lo > 0 else "loss" if hi < 0 else "flat"
        short = name if len(name) <= 18 else name[:8] + "…" + name[-8:]
        body.append(_text(left - 6, y + 4, short, "ax", "end"))
        body.append(
            f'<line x1="{x(lo):.1f}" x2="{x(hi):.1f}" y1="{y:.1f}" y2="{y:.1f}" '
            f'class="cibar {cls}"/>'
        )
        title = (
            f"{name}: {figure_text(m['mean_delta'])} "
            f"(95% CI {figure_text(lo)} to {figure_text(hi)})"
        )
        body.append(
            f'<circle cx="{x(m["mean_delta"]):.1f}" cy="{y:.1f}" r="5" class="dot {cls}">'
            f"<title>{_e(title)}</title></circle>"
        )
    for v in (-reach, 0.0, reach):
        body.append(
            _text(
                x(v),
                height - 16,
                figure_text(v),
                "ax",
                "start" if v < 0 else "end" if v > 0 else "middle",
            )
        )
    body.append(_text(left + plot_w / 2, height - 4, "change B − A (bar: 95% CI)"))
    return _svg(body, "mean change with 95% CI", height)
